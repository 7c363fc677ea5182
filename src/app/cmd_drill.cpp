// `spillway drill`: the failover drill.
//
//   spillway drill --scenario FILE --report DIR [--server URL] [--step] [--json]
//                  [--baselines] [--spillway PATH]
//     The scenario (drills/*.toml, drill/scenario.h) replayed live
//     (drill/live.h) against its own `spillway serve` (or --server URL), the
//     history checked (drill/checker.h) and written to DIR/report.json and
//     DIR/report.html (drill/report.h); the summary on stderr. --baselines
//     runs the same scenario twice more, each on a fresh server and journal,
//     with `--overflow none` and `--overflow naive`, shown beside the main
//     run. --step writes the interim report after each phase and waits for
//     Enter (or a line "c") on stdin. --json prints the report JSON on stdout.
//     Work files (journals, server and co-tenant logs) go to DIR/work-<mode>.
//   spillway drill --simulate --scenario FILE --seeds N [--seed S] [--mode M] [--json]
//     The scenario on the simulated clock over N seeds (drill/simulation.h):
//     the pass count, the sums, each failing seed with its replay command.
//     The simulated server's settings are server.args read as `spillway
//     serve` reads its flags (serve_options.h); a flag serve refuses is a
//     bad scenario (exit 2).
//   spillway drill --simulate --scenario FILE [--seed S] [--mode M] [--report DIR] [--baselines] [--json]
//     One seed (the replay command of a failure), with its report;
//     --baselines adds the same seed under the other two modes to it.
// Exit: 0 when every gate of the main run passed; 1 when a gate failed (the
// gates and request ids named on stderr) or the drill could not run; 2 for
// bad flags or an unreadable or invalid scenario, with a message.
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "app/serve_options.h"
#include "drill/checker.h"
#include "drill/live.h"
#include "drill/report.h"
#include "drill/scenario.h"
#include "drill/simulation.h"

namespace spw::app {
namespace {

namespace fs = std::filesystem;

struct DrillOptions {
  std::string scenario;
  std::string report;
  std::string server;
  std::string spillway;
  bool step = false;
  bool json = false;
  bool baselines = false;
  bool simulate = false;
  int32_t seeds = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  std::string mode = "planned";
};

void say(const std::string& line) { std::fprintf(stderr, "spillway drill: %s\n", line.c_str()); }

std::string self_binary() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// One line: host, CPU, cores, date.
std::string machine_line() {
  std::string cpu;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  utsname u{};
  uname(&u);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return std::string(u.sysname) + " " + u.release + " " + u.machine + "; " + (cpu.empty() ? "unknown CPU" : cpu) +
         "; " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores; " + date;
}

std::string failure_text(const drill::CheckResult& r) {
  std::string s;
  for (const drill::Gate& g : r.gates) {
    if (g.passed) continue;
    s += "\n  " + g.name + ": " + g.detail;
    if (!g.request_ids.empty()) {
      s += " (requests";
      for (size_t i = 0; i < g.request_ids.size() && i < 20; ++i) {
        s += ' ';  // not " " + to_string(): GCC 12 warns (-Wrestrict) on that concatenation at -O3
        s += std::to_string(g.request_ids[i]);
      }
      if (g.request_ids.size() > 20) s += " ... " + std::to_string(g.request_ids.size()) + " in all";
      s += ")";
    }
  }
  return s;
}

std::string resolve_model(const drill::Scenario& sc, const std::string& scenario_file) {
  const fs::path m(sc.server.model);
  if (m.is_absolute() || fs::exists(m)) return m.string();
  const fs::path dir = fs::absolute(fs::path(scenario_file)).parent_path();
  for (const fs::path& base : {dir, dir.parent_path()}) {
    if (fs::exists(base / m)) return (base / m).string();
  }
  return m.string();
}

int run_simulation(const DrillOptions& o, const drill::Scenario& sc) {
  auto mode = drill::parse_sim_mode(o.mode);
  if (!mode.ok()) {
    say("--mode " + o.mode + ": " + mode.status().message());
    return 2;
  }
  drill::SimOptions base;
  base.scenario_file = o.scenario;
  base.model_path = resolve_model(sc, o.scenario);
  // The scenario's server flags, read by the parser `spillway serve` uses
  // (its defaults and checks): the simulated server is configured as the
  // live drill's would be. A bad one is a bad scenario.
  {
    auto server = parse_serve_args(drill::simulated_serve_args(sc, base.model_path));
    if (!server.ok()) {
      say(o.scenario + ": server.args: " + server.status().message());
      return 2;
    }
    base.server = std::move(*server);
  }
  const uint64_t first = o.seed_given ? o.seed : sc.seed;
  if (o.seeds > 0) {
    auto sum = drill::simulate_seeds(sc, base, first, o.seeds, *mode, [](uint64_t seed, const drill::CheckResult* r) {
      if (!r || !r->passed) say("seed " + std::to_string(seed) + ": " + (r ? "gates failed" : "the run failed"));
    });
    if (!sum.ok()) {
      say("simulation: " + sum.status().to_string());
      return 1;
    }
    const drill::SimSummary& s = *sum;
    char line[512];
    std::snprintf(line, sizeof line,
                  "simulation of '%s' (%s): %lld of %lld seeds passed; accepted %lld, succeeded %lld (%.4f), "
                  "refused %lld, lost %lld, duplicated %lld, over the reserve line in %lld seeds; %.1f s",
                  s.scenario.c_str(), std::string(drill::sim_mode_name(s.mode)).c_str(),
                  static_cast<long long>(s.passed), static_cast<long long>(s.seeds), static_cast<long long>(s.accepted),
                  static_cast<long long>(s.succeeded), s.success_rate, static_cast<long long>(s.refused),
                  static_cast<long long>(s.lost), static_cast<long long>(s.duplicated),
                  static_cast<long long>(s.over_reserve), s.real_seconds);
    say(line);
    for (const drill::SeedFailure& f : s.failures) {
      std::string gates;
      for (const auto& g : f.failed_gates) gates += (gates.empty() ? "" : ", ") + g;
      say("  seed " + std::to_string(f.seed) + " failed " + (gates.empty() ? "to run" : gates) + ": " + f.detail +
          "\n    replay: " + f.command);
    }
    if (o.json) {
      nlohmann::json j = {{"scenario", s.scenario},
                          {"mode", std::string(drill::sim_mode_name(s.mode))},
                          {"first_seed", s.first_seed},
                          {"seeds", s.seeds},
                          {"passed", s.passed},
                          {"accepted", s.accepted},
                          {"succeeded", s.succeeded},
                          {"refused", s.refused},
                          {"lost", s.lost},
                          {"duplicated", s.duplicated},
                          {"over_reserve", s.over_reserve},
                          {"success_rate", s.success_rate},
                          {"real_seconds", s.real_seconds},
                          {"failures", nlohmann::json::array()}};
      for (const drill::SeedFailure& f : s.failures) {
        j["failures"].push_back(
            {{"seed", f.seed}, {"failed_gates", f.failed_gates}, {"detail", f.detail}, {"command", f.command}});
      }
      std::printf("%s\n", j.dump().c_str());
    }
    return s.passed == s.seeds ? 0 : 1;
  }
  // One seed, with its report (as the live drill's, when --report is given).
  base.seed = first;
  base.mode = *mode;
  auto h = drill::simulate(sc, base);
  if (!h.ok()) {
    say("simulation (seed " + std::to_string(first) + "): " + h.status().to_string());
    return 1;
  }
  drill::ReportInput input;
  input.scenario_name = sc.name;
  input.scenario_description = sc.description;
  input.machine = "simulation (seed " + std::to_string(first) + ")";
  input.main = {std::string(drill::sim_mode_name(*mode)), std::move(*h), {}};
  input.main.result = drill::check(input.main.history);
  // The same seed under the other modes: what the plan buys, in the same figures.
  if (o.baselines) {
    for (drill::SimMode m : {drill::SimMode::kPlanned, drill::SimMode::kNoFailover, drill::SimMode::kNaiveFreeMemory}) {
      if (m == *mode) continue;
      drill::SimOptions bo = base;
      bo.mode = m;
      auto bh = drill::simulate(sc, bo);
      if (!bh.ok()) {
        say("simulation (seed " + std::to_string(first) + ", " + std::string(drill::sim_mode_name(m)) +
            "): " + bh.status().to_string());
        return 1;
      }
      drill::RunReport rr{std::string(drill::sim_mode_name(m)), std::move(*bh), {}};
      rr.result = drill::check(rr.history);
      std::fprintf(stderr, "%s: %s\n", rr.name.c_str(), rr.result.passed ? "PASS" : "FAIL");
      input.baselines.push_back(std::move(rr));
    }
  }
  if (!o.report.empty()) {
    if (Status st = drill::write_report(o.report, input); !st.ok()) {
      say("writing the report: " + st.to_string());
      return 1;
    }
  }
  std::fprintf(stderr, "%s\n", drill::summary_text(input.main.result).c_str());
  if (o.json) std::printf("%s\n", drill::report_json(input).c_str());
  if (!input.main.result.passed) {
    say("FAILED gates:" + failure_text(input.main.result) +
        "\n  replay: " + drill::replay_command(o.scenario, first, *mode));
    return 1;
  }
  return 0;
}

int run_drill(const DrillOptions& o) {
  auto sc = drill::load_scenario(o.scenario);
  if (!sc.ok()) {
    say("scenario " + o.scenario + ": " + sc.status().message());
    return 2;
  }
  if (o.simulate) {
    if (o.seeds < 0) {
      say("--seeds must be >= 1");
      return 2;
    }
    return run_simulation(o, *sc);
  }
  if (o.seeds != 0 || o.mode != "planned") {
    say("--seeds and --mode are for --simulate; a live drill runs once (--baselines adds the other modes)");
    return 2;
  }
  if (o.report.empty()) {
    say("--report DIR is required for a live drill (report.json and report.html go there)");
    return 2;
  }
  std::error_code ec;
  fs::create_directories(o.report, ec);
  if (ec) {
    say("--report " + o.report + ": cannot create it: " + ec.message());
    return 2;
  }
  const std::string binary = o.spillway.empty() ? self_binary() : o.spillway;
  if (o.server.empty() && (binary.empty() || !fs::exists(binary))) {
    say("--spillway " + binary + ": no such binary");
    return 2;
  }

  drill::ReportInput input;
  input.scenario_name = sc->name;
  input.scenario_description = sc->description;
  input.machine = machine_line();

  const fs::path scenario_dir = fs::absolute(fs::path(o.scenario)).parent_path();
  auto options_for = [&](const std::string& overflow) {
    drill::LiveOptions lo;
    lo.server_url = o.server;
    lo.spillway_binary = binary;
    lo.work_dir = (fs::path(o.report) / ("work-" + overflow)).string();
    lo.search_dirs = {scenario_dir.string(), scenario_dir.parent_path().string()};
    lo.overflow = overflow;
    lo.log = [](const std::string& line) { say(line); };
    return lo;
  };

  const auto t0 = std::chrono::steady_clock::now();
  drill::LiveOptions main_opts = options_for("planned");
  if (o.step) {
    main_opts.on_phase_end = [&](const std::string& phase, const drill::History& interim) {
      drill::ReportInput step = input;
      step.main = {"planned", interim, drill::check(interim)};
      if (Status st = drill::write_report(o.report, step); !st.ok()) say("interim report: " + st.to_string());
      std::fprintf(stderr, "%s\n", drill::summary_text(step.main.result).c_str());
      // Journal records are read only after the drain: until then a request
      // still in flight counts against no_lost.
      say("(interim: the journal's final records are read at the end, so no_lost may name requests still in flight)");
      std::fprintf(stderr,
                   "spillway drill: phase '%s' done; interim report in %s/report.html. Press Enter (or c) to go on: ",
                   phase.c_str(), o.report.c_str());
      std::fflush(stderr);
      std::string line;
      std::getline(std::cin, line);  // EOF goes on too
    };
  }
  say("scenario '" + sc->name + "': " + std::to_string(sc->phases.size()) + " phases, " +
      std::to_string(static_cast<int>(sc->total_s())) + " s + drain");
  auto main_history = drill::run_live(*sc, main_opts);
  if (!main_history.ok()) {
    say("the drill could not run: " + main_history.status().to_string());
    return 1;
  }
  input.main = {"planned", std::move(*main_history), {}};
  input.main.result = drill::check(input.main.history);

  if (o.baselines) {
    if (!o.server.empty()) {
      say("--baselines needs servers of its own (--overflow none / naive): skipped with --server");
    } else {
      for (const auto& [overflow, name] : {std::pair<std::string, std::string>{"none", "no_failover"},
                                           std::pair<std::string, std::string>{"naive", "naive_free_memory"}}) {
        say("baseline " + name + " (--overflow " + overflow + ")");
        auto h = drill::run_live(*sc, options_for(overflow));
        if (!h.ok()) {
          say("baseline " + name + " could not run: " + h.status().to_string());
          continue;
        }
        drill::RunReport rr{name, std::move(*h), {}};
        rr.result = drill::check(rr.history);
        input.baselines.push_back(std::move(rr));
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (Status st = drill::write_report(o.report, input); !st.ok()) {
    say("writing the report: " + st.to_string());
    return 1;
  }
  std::fprintf(stderr, "%s\n", drill::summary_text(input.main.result).c_str());
  for (const drill::RunReport& b : input.baselines) {
    std::fprintf(stderr, "baseline %s: %s%s\n", b.name.c_str(),
                 b.result.passed ? "all gates passed" : "gates failed:", failure_text(b.result).c_str());
  }
  if (o.json) std::printf("%s\n", drill::report_json(input).c_str());
  char took[64];
  std::snprintf(took, sizeof took, "%.1f s", seconds);
  say(std::string("report: ") + o.report + "/report.html and report.json (" + took + ")");
  if (!input.main.result.passed) {
    say("FAILED gates of the main run:" + failure_text(input.main.result));
    return 1;
  }
  say("every gate of the main run passed");
  return 0;
}

}  // namespace

void add_drill(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<DrillOptions>();
  CLI::App* sub = app.add_subcommand("drill",
                                     "Replay a scenario against a live server while memory shrinks and faults fire; "
                                     "check no accepted request was lost");
  sub->add_option("--scenario", o->scenario, "Scenario file (TOML, see drills/)")->required();
  sub->add_option("--report", o->report, "Folder for report.json, report.html and the run's work files");
  sub->add_option("--server", o->server, "Drive this running server (http://HOST:PORT) instead of starting one");
  sub->add_option("--spillway", o->spillway,
                  "The spillway binary to run serve/reserve/occupy from (default: this one)");
  sub->add_flag("--step", o->step, "After each phase write the interim report and wait for Enter");
  sub->add_flag("--json", o->json, "Print the report JSON on stdout");
  sub->add_flag("--baselines", o->baselines, "Also run the scenario with --overflow none and --overflow naive");
  sub->add_flag("--simulate", o->simulate, "Run the scenario on the simulated clock instead of live");
  sub->add_option("--seeds", o->seeds, "Simulation: how many seeds");
  sub->add_option("--seed", o->seed, "Simulation: the (first) seed (default: the scenario's)");
  sub->add_option("--mode", o->mode, "Simulation: planned, no_failover or naive_free_memory")->capture_default_str();
  sub->callback([o, &exit_code, sub] {
    o->seed_given = sub->count("--seed") > 0;
    exit_code = run_drill(*o);
  });
}

}  // namespace spw::app
