// The drill's report page in a real browser: a report written from a
// synthetic history (a main run and a baseline) is opened in headless
// Chromium, and the DOM Chromium built from it (--dump-dom) must hold every
// chart with data drawn (polylines with points, a mark per operation, event
// lines), the gate table with its pass and fail cells, and nothing that runs
// or fetches (no script, no external reference).
//
// Chromium is required: without it the test fails (scripts/setup installs
// Debian's chromium); SPILLWAY_CHROMIUM names another binary.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "drill/checker.h"
#include "drill/history.h"
#include "drill/report.h"

namespace spw::drill {
namespace {

namespace fs = std::filesystem;

std::string find_chromium() {
  if (const char* env = std::getenv("SPILLWAY_CHROMIUM"); env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
      const fs::path p = fs::path(dir.empty() ? "." : dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return {};
}

// Runs a command and returns its stdout (stderr discarded) and exit status.
std::pair<std::string, int> run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return {"", -1};
  std::array<char, 65536> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A drill of 30 s: memory grows under a co-tenant, a fault trips the breaker,
// the server is killed and restarts; requests on gpu and cpu with every
// outcome. `shift` varies the baseline.
History synthetic(const std::string& mode, double shift) {
  History h;
  h.scenario = "synthetic";
  h.mode = mode;
  h.seed = 3;
  h.duration_ms = 30000;
  const uint64_t mib = 1024 * 1024;
  for (int i = 0; i <= 120; ++i) {
    Sample s;
    s.t_ms = i * 250.0;
    s.up = !(s.t_ms >= 20000 && s.t_ms < 21000);
    const double t = s.t_ms / 1000.0;
    s.device_capacity = 48 * mib;
    s.device_limit = 45 * mib;
    s.competing_bytes = t < 8 ? 0 : (t < 14 ? 24 * mib : (t < 25 ? 40 * mib : 0));
    s.device_cotenants = s.competing_bytes;
    s.device_ours = static_cast<uint64_t>((4 + 2 * std::sin(t + shift)) * static_cast<double>(mib));
    s.device_used = s.device_ours + s.competing_bytes;
    s.host_budget = 512 * mib;
    s.host_reserved = 200 * mib;
    s.host_rss = static_cast<uint64_t>((220 + 10 * std::cos(t)) * static_cast<double>(mib));
    s.paths.push_back({"gpu", i % 4, 1, 0.1 * (i % 4), t > 15 && t < 17 ? "open" : "closed"});
    s.paths.push_back({"cpu", (i / 3) % 5, 1, 0.2 * ((i / 3) % 5), ""});
    h.samples.push_back(s);
  }
  h.events.push_back({0, "phase", "warm"});
  h.events.push_back({8000, "phase", "pressure"});
  h.events.push_back({14000, "pressure", "40MiB"});
  h.events.push_back({15000, "alloc_fail", "gpu x1"});
  h.events.push_back({15200, "breaker_open", "gpu"});
  h.events.push_back({20000, "kill", "<kill -9 & restart>"});
  h.events.push_back({21000, "restart", ""});
  int64_t op_id = 1;
  for (int i = 0; i < 40; ++i) {
    Op inv;
    inv.op_id = op_id++;
    inv.index = static_cast<int64_t>(h.ops.size());
    inv.type = OpType::kInvoke;
    inv.t_ms = 500.0 + i * 700.0 + shift * 100;
    inv.cls = i % 3 == 0 ? "long" : "short";
    inv.prompt_key = inv.cls + "/greedy";
    h.ops.push_back(inv);
    Op done = inv;
    done.index = static_cast<int64_t>(h.ops.size());
    done.request_id = i % 7 == 6 ? 0 : 100 + i;
    done.accepted = done.request_id != 0;
    const bool on_cpu = inv.t_ms > 14000 && inv.t_ms < 25000;
    done.path = on_cpu ? "cpu" : "gpu";
    done.placement = on_cpu ? "cpu" : "vulkan";
    done.degraded = on_cpu;
    done.degraded_shown = on_cpu;
    done.type = i % 7 == 6 ? OpType::kFail : (i % 11 == 10 ? OpType::kInfo : OpType::kOk);
    done.http_status = done.type == OpType::kFail ? 429 : (done.type == OpType::kInfo ? 0 : 200);
    if (done.type == OpType::kFail) done.path.clear(), done.placement.clear();
    done.latency_ms = 200 + 37.0 * (i % 9) + (on_cpu ? 400 : 0);
    done.ttft_ms = 30 + 5.0 * (i % 4);
    done.t_ms = inv.t_ms + done.latency_ms;
    done.text = "Once upon a time";
    h.ops.push_back(done);
    if (done.request_id != 0) {
      FinalRecord f;
      f.request_id = done.request_id;
      f.found = true;
      f.state = done.type == OpType::kInfo && i == 21 ? "running" : "done";  // one lost request
      f.text = done.text;
      f.admitted_under_reserve = on_cpu ? std::nullopt : std::optional<bool>(true);
      h.finals[f.request_id] = f;
    }
  }
  h.reference["short/greedy"] = "Once upon a time";
  return h;
}

std::string element(const std::string& dom, const std::string& tag, const std::string& id) {
  const std::string open = "id=\"" + id + "\"";
  const size_t at = dom.find(open);
  if (at == std::string::npos) return {};
  const size_t start = dom.rfind("<" + tag, at);
  const size_t end = dom.find("</" + tag + ">", at);
  if (start == std::string::npos || end == std::string::npos) return {};
  return dom.substr(start, end - start);
}

int count(const std::string& s, const std::regex& re) {
  return static_cast<int>(std::distance(std::sregex_iterator(s.begin(), s.end(), re), std::sregex_iterator()));
}

// Polylines of class "series" with at least two points.
int drawn_series(const std::string& svg) {
  static const std::regex re(R"re(<polyline class="series[^"]*"[^>]*points="[-0-9.]+,[-0-9.]+ [-0-9.]+,[-0-9.]+)re");
  return count(svg, re);
}

TEST(ReportPage, ChromiumRendersChartsWithData) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "chromium not found on PATH: run scripts/setup (it installs Debian's chromium) "
                                    "or set SPILLWAY_CHROMIUM to a Chromium/Chrome binary";

  ReportInput in;
  in.scenario_name = "synthetic <drill>";
  in.scenario_description = "a history made up for the browser test";
  in.machine = "test";
  in.main.name = "planned";
  in.main.history = synthetic("live", 0);
  in.main.result = check(in.main.history);
  RunReport base;
  base.name = "no_failover";
  base.history = synthetic("no_failover", 1);
  base.result = check(base.history);
  in.baselines.push_back(base);
  ASSERT_FALSE(in.main.result.passed) << "the synthetic history has a lost request";

  // SPILLWAY_REPORT_DIR keeps the page for a person to look at.
  const char* keep = std::getenv("SPILLWAY_REPORT_DIR");
  const fs::path dir = keep != nullptr && *keep != '\0'
                           ? fs::path(keep)
                           : fs::temp_directory_path() / ("spw_report_page_" + std::to_string(::getpid()));
  if (keep == nullptr || *keep == '\0') fs::remove_all(dir);
  ASSERT_TRUE(write_report(dir.string(), in).ok());
  const fs::path html = dir / "report.html";

  const std::string cmd = "timeout 60 " + quote(chromium) +
                          " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions"
                          " --user-data-dir=" + quote((dir / "profile").string()) +
                          " --virtual-time-budget=2000 --dump-dom " + quote("file://" + html.string());
  const auto [dom, rc] = run(cmd);
  ASSERT_EQ(rc, 0) << "chromium failed: " << cmd;
  ASSERT_NE(dom.find("<body"), std::string::npos) << "no DOM from chromium:\n" << dom.substr(0, 2000);

  // Nothing runs, nothing is fetched.
  EXPECT_EQ(dom.find("<script"), std::string::npos);
  EXPECT_EQ(dom.find("<img"), std::string::npos);
  EXPECT_EQ(dom.find("<link"), std::string::npos);
  EXPECT_NE(dom.find("synthetic &lt;drill&gt;"), std::string::npos) << "the title is escaped";

  // Every chart of both runs, with data drawn and the events on its axis.
  for (const std::string run_name : {"planned", "no_failover"}) {
    const std::string mem = element(dom, "svg", "memory-" + run_name);
    ASSERT_FALSE(mem.empty()) << "memory chart of " << run_name;
    EXPECT_GE(drawn_series(mem), 3) << "used, ours, competing";
    EXPECT_NE(mem.find("class=\"reserve\""), std::string::npos) << "the reserve line";
    EXPECT_NE(mem.find("stroke-dasharray"), std::string::npos);
    EXPECT_GE(count(mem, std::regex("<line class=\"event")), 7);
    EXPECT_NE(mem.find("class=\"down\""), std::string::npos) << "the kill's downtime";

    const std::string host = element(dom, "svg", "host-" + run_name);
    EXPECT_GE(drawn_series(host), 2) << "host of " << run_name;

    const std::string place = element(dom, "svg", "placement-" + run_name);
    ASSERT_FALSE(place.empty());
    EXPECT_EQ(count(place, std::regex("<circle class=\"mark ")), 40) << "a mark per operation";
    EXPECT_GT(count(place, std::regex("<circle class=\"mark ok")), 0);
    EXPECT_GT(count(place, std::regex("<circle class=\"mark refused")), 0);
    EXPECT_GT(count(place, std::regex("<circle class=\"mark info")), 0);
    EXPECT_GT(count(place, std::regex("class=\"mark ok degraded")), 0);

    const std::string queue = element(dom, "svg", "queue-" + run_name);
    EXPECT_EQ(drawn_series(queue), 2) << "a line per path";
    EXPECT_EQ(drawn_series(element(dom, "svg", "queue-age-" + run_name)), 2);
  }

  // Coordinates stay inside the chart (axes scaled to the data).
  const std::string mem = element(dom, "svg", "memory-planned");
  std::smatch box;
  ASSERT_TRUE(std::regex_search(mem, box, std::regex(R"re(viewBox="0 0 ([0-9]+) ([0-9]+)")re"))) << "no viewBox";
  const double width = std::stod(box[1]), height = std::stod(box[2]);
  static const std::regex pt(R"(([-0-9.]+),([-0-9.]+))");
  const std::string pts = mem.substr(mem.find("points=\""));
  for (auto it = std::sregex_iterator(pts.begin(), pts.begin() + static_cast<long>(pts.find('"', 8)), pt);
       it != std::sregex_iterator(); ++it) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
    EXPECT_GE(x, 0);
    EXPECT_LE(x, width);
    EXPECT_GE(y, 0);
    EXPECT_LE(y, height);
  }

  // The gate table: five gates, both runs, no_lost failed on the main run.
  const std::string gates = element(dom, "table", "gates");
  ASSERT_FALSE(gates.empty());
  EXPECT_EQ(count(gates, std::regex("<tr class=\"gate\"")), 5);
  for (const char* g : {"no_lost", "no_duplicates", "host_budget", "reserve_line", "degraded_visible"}) {
    EXPECT_NE(gates.find(std::string("data-gate=\"") + g + "\""), std::string::npos) << g;
  }
  EXPECT_GT(count(gates, std::regex("<td class=\"fail\"")), 0);
  EXPECT_GT(count(gates, std::regex("<td class=\"pass\"")), 0);
  EXPECT_NE(gates.find("121"), std::string::npos) << "the lost request's id";
  EXPECT_FALSE(element(dom, "table", "latency").empty());
  EXPECT_NE(element(dom, "table", "recovery").find("alloc_fail"), std::string::npos);

  if (keep == nullptr || *keep == '\0') fs::remove_all(dir);
}

}  // namespace
}  // namespace spw::drill
