// The drill's simulation over the real gateway: determinism, every fault
// kind, and the properties of the baselines (what the plan buys).
// Environment: SPW_SIM_SEEDS (seeds per property; CI under sanitizers sets
// fewer), SPW_SIM_JOBS (simulate_seeds' threads), SPW_SIM_SCENARIO (another
// scenario file without server.args for the determinism and fault tests:
// src/drill reads no flags; app/drill_scenario_test runs the shipped
// scenario files, their flags parsed as `spillway drill` does),
// SPW_SIM_SEED + SPW_SIM_DUMP (one seed's history as JSON, to look at a
// failure), SPW_SIM_DETERMINISM_SEEDS + SPW_SIM_DUMP_DIR (a longer hunt for
// nondeterminism, both histories of a differing seed written out).
#include "drill/simulation.h"
#include "drill/simulation_test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <set>
#include <string>

#include "drill/checker.h"
#include "drill/history.h"
#include "drill/scenario.h"

namespace spw::drill {
namespace {

std::string model_path() { return std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf"; }

// A device of 1 GiB (limit 972.8 MiB with the 5% headroom); Spillway's plan
// is 64 MiB, each gpu run holds 4 MiB. Phases: traffic with device faults and
// a cancel; a declared co-tenant between the line and the capacity (the
// plan redirects, a free-memory check does not), then a pressure step past
// the capacity (real out-of-memory for whoever runs on the gpu); memory
// nobody declared; a kill.
constexpr const char* kScenario = R"(
name = "sim-test"
drain_s = 20

[server]
model = "models/stories260K.gguf"
device_memory = "1GiB"

[[class]]
name = "short"
prompt = "Once upon a time"
max_tokens = 12
stream = true
idempotency_share = 0.5
retry_share = 0.5

[[class]]
name = "long"
prompt = "The little dog ran to the park. "
prompt_repeat = 3
max_tokens = 24
stream = false
greedy = false
idempotency_share = 1.0

[[class]]
name = "story"
prompt = "Tell me a story"
max_tokens = 120
stream = true

[[phase]]
name = "warm"
duration_s = 3
[[phase.load]]
class = "short"
rate_per_s = 2
concurrency = 3
[[phase.load]]
class = "long"
rate_per_s = 0.5
concurrency = 1

[[phase]]
name = "faults"
duration_s = 6
[[phase.load]]
class = "short"
rate_per_s = 2
concurrency = 3
[[phase.load]]
class = "long"
rate_per_s = 0.5
concurrency = 2
[[phase.fault]]
kind = "alloc_fail"
at_s = 0.5
[[phase.fault]]
kind = "device_lost"
at_s = 2
after_submits = 3
[[phase.fault]]
kind = "cancel_queued"
at_s = 4

[[phase]]
name = "cotenant"
duration_s = 6
cotenant_bytes = "920MiB"
[[phase.load]]
class = "short"
rate_per_s = 2
concurrency = 3
[[phase.fault]]
kind = "pressure"
at_s = 3
bytes = "1000MiB"

[[phase]]
name = "undeclared"
duration_s = 4
undeclared_bytes = "970MiB"
[[phase.load]]
class = "short"
rate_per_s = 2
concurrency = 3

[[phase]]
name = "crash"
duration_s = 6
[[phase.load]]
class = "short"
rate_per_s = 2
concurrency = 3
[[phase.load]]
class = "long"
rate_per_s = 0.5
concurrency = 1
[[phase.load]]
class = "story"
rate_per_s = 1
concurrency = 2
[[phase.fault]]
kind = "kill"
at_s = 2
restart_after_s = 1
)";

Scenario scenario() {
  Result<Scenario> s = parse_scenario(kScenario, "sim-test.toml");
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : Scenario{};
}

SimOptions options(uint64_t seed, SimMode mode = SimMode::kPlanned) {
  SimOptions o;
  o.seed = seed;
  o.mode = mode;
  o.model_path = model_path();
  o.scenario_file = "sim-test.toml";
  // The server `spillway serve --parallel 2 --cpu-parallel 2
  // --checkpoint-every 4 --cpu-queue 8` (what `spillway drill` would parse
  // from server.args; the rest the defaults).
  gateway::GatewayOptions server;
  server.parallel = 2;
  server.cpu_parallel = 2;
  server.checkpoint_every = 4;
  server.cpu_queue = 8;
  o.server = server;
  if (const char* j = std::getenv("SPW_SIM_JOBS")) o.jobs = std::atoi(j);
  return o;
}

TEST(DrillSimulationTest, TheSameSeedGivesTheSameHistoryByteForByte) {
  const Scenario sc = scenario();
  for (SimMode mode : {SimMode::kPlanned, SimMode::kNaiveFreeMemory}) {
    Result<History> a = simulate(sc, options(7, mode));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    Result<History> b = simulate(sc, options(7, mode));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    const std::string ja = history_to_json(*a);
    const std::string jb = history_to_json(*b);
    EXPECT_EQ(ja.size(), jb.size());
    if (ja != jb) {
      size_t k = 0;
      while (k < ja.size() && k < jb.size() && ja[k] == jb[k]) ++k;
      ADD_FAILURE() << sim_mode_name(mode) << ": histories differ at byte " << k << ": ..."
                    << ja.substr(k > 200 ? k - 200 : 0, 400) << "\n vs ...\n"
                    << jb.substr(k > 200 ? k - 200 : 0, 400);
    }
    EXPECT_GT(a->ops.size(), 20u);
    Result<History> other = simulate(sc, options(8, mode));
    ASSERT_TRUE(other.ok()) << other.status().to_string();
    EXPECT_NE(history_to_json(*other), ja) << "another seed, another workload";
  }
}

// Many seeds, each run twice at the same time (so the two runs' threads
// interleave differently): every history is the same byte for byte.
TEST(DrillSimulationTest, ManySeedsReplayBitForBitWhileRunningSideBySide) {
  Scenario sc = scenario();
  if (const char* other = std::getenv("SPW_SIM_SCENARIO")) {
    Result<Scenario> o = load_scenario(other);
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    sc = *o;
  }
  const int64_t n = std::min<int64_t>(seeds_from_env(12), 12);
  const char* det = std::getenv("SPW_SIM_DETERMINISM_SEEDS");  // a longer hunt
  const int64_t seeds = det ? std::atoll(det) : n;
  for (int64_t i = 0; i < seeds; ++i) {
    const uint64_t seed = 1000 + static_cast<uint64_t>(i);
    const SimMode mode = static_cast<SimMode>(i % 3);
    auto a = std::async(std::launch::async, [&] { return simulate(sc, options(seed, mode)); });
    Result<History> b = simulate(sc, options(seed, mode));
    Result<History> ra = a.get();
    ASSERT_TRUE(ra.ok() && b.ok()) << ra.status().to_string() << " " << b.status().to_string();
    const std::string ja = history_to_json(*ra), jb = history_to_json(*b);
    if (ja != jb) {
      if (const char* dir = std::getenv("SPW_SIM_DUMP_DIR")) {
        for (const auto& [name, text] : {std::pair{"a", &ja}, std::pair{"b", &jb}}) {
          const std::string file = std::string(dir) + "/" + std::to_string(seed) + name + ".json";
          if (FILE* f = std::fopen(file.c_str(), "w")) {
            std::fwrite(text->data(), 1, text->size(), f);
            std::fclose(f);
          }
        }
      }
      size_t k = 0;
      while (k < ja.size() && k < jb.size() && ja[k] == jb[k]) ++k;
      ADD_FAILURE() << "seed " << seed << " (" << sim_mode_name(mode) << "): histories differ at byte " << k << ": ..."
                    << ja.substr(k > 300 ? k - 300 : 0, 500) << "\n vs ...\n"
                    << jb.substr(k > 300 ? k - 300 : 0, 500);
    }
  }
}

TEST(DrillSimulationTest, EveryFaultKindFiresAndIsRecorded) {
  Scenario sc = scenario();
  // SPW_SIM_SCENARIO (with SPW_SIM_DUMP): look at a seed of another scenario.
  if (const char* other = std::getenv("SPW_SIM_SCENARIO")) {
    Result<Scenario> o = load_scenario(other);
    ASSERT_TRUE(o.ok()) << o.status().to_string();
    sc = *o;
  }
  // SPW_SIM_SEED / SPW_SIM_DUMP: another seed, and its history as JSON.
  const char* seed_env = std::getenv("SPW_SIM_SEED");
  Result<History> h = simulate(sc, options(seed_env ? std::strtoull(seed_env, nullptr, 10) : 3));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  if (const char* dump = std::getenv("SPW_SIM_DUMP")) {
    if (FILE* f = std::fopen(dump, "w")) {
      const std::string j = history_to_json(*h);
      std::fwrite(j.data(), 1, j.size(), f);
      std::fclose(f);
    }
  }
  std::set<std::string> kinds;
  for (const Event& e : h->events) kinds.insert(e.kind);
  for (const char* k : {"phase", "pressure", "alloc_fail", "device_lost", "cancel_queued", "kill", "restart"}) {
    EXPECT_TRUE(kinds.count(k)) << "no " << k << " event";
  }
  int cancels = 0, infos = 0, continued = 0, failed_over = 0, cancelled = 0;
  for (const Op& op : h->ops) {
    if (op.f == "cancel" && op.type == OpType::kOk) ++cancels;
    if (op.type == OpType::kInfo) ++infos;
    if (op.type != OpType::kInvoke && op.continues != 0 && op.f != "cancel") ++continued;
    if (op.type == OpType::kOk && op.failovers + op.migrations > 0) ++failed_over;
    if (op.type == OpType::kFail && op.error_code == "cancelled") ++cancelled;
  }
  EXPECT_GE(cancels, 1) << "a queued request was cancelled";
  EXPECT_GE(cancelled, 1) << "and its client saw it end cancelled";
  EXPECT_GE(infos, 1) << "the kill interrupted a request in flight";
  EXPECT_GE(continued, 1) << "resumes or retries continued something";
  EXPECT_GE(failed_over, 1) << "a device fault moved a request to the cpu path";
  EXPECT_FALSE(h->samples.empty());
  bool down = false;
  for (const Sample& s : h->samples) down = down || !s.up;
  EXPECT_TRUE(down) << "a sample saw the server down";
  EXPECT_FALSE(h->finals.empty());
  for (const auto& [id, f] : h->finals) {
    EXPECT_TRUE(f.found) << id;
    EXPECT_NE(f.state, "running") << "request " << id << " left running";
  }
  EXPECT_EQ(h->reference.count("short/greedy"), 1u);
  const CheckResult c = check(*h);
  EXPECT_TRUE(c.passed) << [&] {
    std::string s;
    for (const Gate& g : c.gates)
      if (!g.passed) s += g.name + ": " + g.detail + "\n";
    return s;
  }();
}

TEST(DrillSimulationTest, PlannedPassesEveryGateAndTheBaselinesShowWhatThePlanBuys) {
  const Scenario sc = scenario();
  const int64_t n = std::min<int64_t>(seeds_from_env(40), 40);
  Result<SimSummary> planned = simulate_seeds(sc, options(0), 100, n, SimMode::kPlanned);
  ASSERT_TRUE(planned.ok()) << planned.status().to_string();
  Result<SimSummary> none = simulate_seeds(sc, options(0), 100, n, SimMode::kNoFailover);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  Result<SimSummary> naive = simulate_seeds(sc, options(0), 100, n, SimMode::kNaiveFreeMemory);
  ASSERT_TRUE(naive.ok()) << naive.status().to_string();
  std::printf("%s\n%s\n%s\n", describe(*planned).c_str(), describe(*none).c_str(), describe(*naive).c_str());
  std::printf("planned: %.1f seeds/s\n", static_cast<double>(planned->seeds) / planned->real_seconds);

  EXPECT_EQ(planned->passed, n) << describe(*planned);
  EXPECT_TRUE(planned->failures.empty());
  EXPECT_EQ(planned->over_reserve, 0);
  for (const SeedFailure& f : planned->failures) {
    EXPECT_EQ(f.command, replay_command("sim-test.toml", f.seed, SimMode::kPlanned));
  }
  // Without failover, device faults and out-of-memory end requests.
  EXPECT_LT(none->success_rate, planned->success_rate) << describe(*none);
  // A free-memory check does not see the declared co-tenant: it admits to
  // the gpu over the reserve line.
  EXPECT_GT(naive->over_reserve, 0) << describe(*naive);
  for (const SeedFailure& f : naive->failures) {
    EXPECT_NE(f.command.find("--mode naive_free_memory"), std::string::npos) << f.command;
    EXPECT_NE(f.command.find("--seed " + std::to_string(f.seed)), std::string::npos) << f.command;
  }
}

TEST(DrillSimulationTest, ReplayCommandAndModes) {
  EXPECT_EQ(replay_command("drills/default.toml", 42, SimMode::kPlanned),
            "spillway drill --simulate --scenario drills/default.toml --seed 42");
  EXPECT_EQ(replay_command("x.toml", 1, SimMode::kNoFailover),
            "spillway drill --simulate --scenario x.toml --seed 1 --mode no_failover");
  EXPECT_EQ(parse_sim_mode("naive_free_memory").value(), SimMode::kNaiveFreeMemory);
  EXPECT_FALSE(parse_sim_mode("nope").ok());
  Scenario sc = scenario();
  sc.phases[1].faults[0].path = "hybrid";
  EXPECT_EQ(simulate(sc, options(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(simulate_seeds(scenario(), options(1), 1, 0, SimMode::kPlanned).status().code(),
            StatusCode::kInvalidArgument);
}

// Server options out of range for the simulation, or server.args it was
// not given parsed, are refused.
TEST(DrillSimulationTest, ServerOptionsAreCheckedAndArgsMustBeParsed) {
  Scenario sc = scenario();
  SimOptions o = options(1);
  o.server->queue = 0;
  EXPECT_EQ(simulate(sc, o).status().code(), StatusCode::kInvalidArgument);
  o.server->queue = 64;
  o.server->breaker_cooldown_s = 0;
  EXPECT_EQ(simulate(sc, o).status().field(), "breaker-cooldown-s");
  sc.server.args = {"--parallel", "2"};
  o.server.reset();
  Result<History> h = simulate(sc, o);
  EXPECT_EQ(h.status().field(), "server.args") << h.status().to_string();
}

}  // namespace
}  // namespace spw::drill
