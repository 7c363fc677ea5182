// Integration: `spillway drill` end to end. The real binary runs the shipped
// default scenario (drills/default.toml: ~55 s of phases on the bundled
// model) against a `spillway serve` of its own on lavapipe, with every fault
// kind:
// a declared co-tenant step to nearly the whole device budget (pressure),
// an undeclared `spillway occupy`, a cancel of a request waiting in the CPU
// queue, alloc_fail and device_lost (mid-generation) through the admin API,
// and a kill -9 with a restart on the same journal. It must exit 0, write
// report.json with every gate of the main run passed and report.html, and
// its history must show each fault fired and at least one degraded response
// that said so. Skips without a Vulkan device. Bad input (a small inline
// scenario): a missing scenario file or a live drill without --report exit 2
// with a message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "backend/vulkan/vulkan_backend.h"
#include "spillway_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<std::string> no_vulkan() {
  auto d = spw::list_vulkan_devices();
  if (!d.ok()) return d.status().to_string();
  if (d->empty()) return std::string("no Vulkan device");
  return std::nullopt;
}

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("spw-drill-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string scenario_text() {
  return R"(name = "drill-test"
description = "Small drill: every fault kind, including a kill, on lavapipe"
seed = 7
drain_s = 20

[server]
model = ")" + spw::testing::kStoriesModel + R"("
device = "vulkan"
device_memory = "64MiB"
args = ["--ctx", "256", "--threads", "1", "--breaker-cooldown-s", "1", "--breaker-max-cooldown-s", "1",
        "--health-interval-s", "0", "--checkpoint-every", "4", "--cpu-queue", "4"]

[[class]]
name = "short"
prompt = "Once upon a time"
max_tokens = 24
idempotency_share = 0.5
retry_share = 0.5

[[class]]
name = "long"
prompt = "The little dog ran to the park. "
prompt_repeat = 4
max_tokens = 96

[[class]]
name = "seeded"
prompt = "One day"
max_tokens = 16
stream = false
greedy = false
idempotency_share = 1.0

[[phase]]
name = "warm"
duration_s = 5
  [[phase.load]]
  class = "short"
  rate_per_s = 2
  concurrency = 2
  [[phase.load]]
  class = "long"
  rate_per_s = 0.5
  concurrency = 1

[[phase]]
name = "squeeze"
duration_s = 6
cotenant_bytes = "8MiB"
undeclared_bytes = "4MiB"
  [[phase.load]]
  class = "short"
  rate_per_s = 2
  concurrency = 2
  [[phase.load]]
  class = "seeded"
  rate_per_s = 1
  concurrency = 1
  [[phase.fault]]
  kind = "pressure"
  at_s = 1
  bytes = "62MiB"
  [[phase.fault]]
  kind = "cancel_queued"
  at_s = 3
  path = "cpu"

[[phase]]
name = "device-faults"
duration_s = 8
  [[phase.load]]
  class = "short"
  rate_per_s = 2
  concurrency = 2
  [[phase.load]]
  class = "long"
  rate_per_s = 0.5
  concurrency = 1
  [[phase.fault]]
  kind = "alloc_fail"
  at_s = 0.5
  path = "gpu"
  [[phase.fault]]
  kind = "device_lost"
  at_s = 2
  path = "gpu"
  count = 3
  after_submits = 5

[[phase]]
name = "crash"
duration_s = 8
  [[phase.load]]
  class = "short"
  rate_per_s = 2
  concurrency = 2
  [[phase.load]]
  class = "long"
  rate_per_s = 0.5
  concurrency = 2
  [[phase.fault]]
  kind = "kill"
  at_s = 3
  restart_after_s = 1
)";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first value under `key` in a depth-first walk (objects before arrays
// of the same level as they come), or null.
const json* find_key(const json& j, const std::string& key) {
  if (j.is_object()) {
    if (auto it = j.find(key); it != j.end()) return &*it;
    for (const auto& [k, v] : j.items()) {
      if (const json* f = find_key(v, key)) return f;
    }
  } else if (j.is_array()) {
    for (const json& v : j) {
      if (const json* f = find_key(v, key)) return f;
    }
  }
  return nullptr;
}

TEST(Drill, MissingScenarioExits2WithAMessage) {
  int err = -1;
  const pid_t pid = spw::testing::start({"drill", "--scenario", "/nonexistent/drill.toml", "--report", "/tmp/x"}, &err);
  const auto f = spw::testing::wait_for(pid, err, std::chrono::seconds(30));
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("/nonexistent/drill.toml"), std::string::npos) << f.err;
}

TEST(Drill, LiveDrillWithoutReportExits2) {
  const fs::path dir = temp_dir("noreport");
  std::ofstream(dir / "s.toml") << scenario_text();
  int err = -1;
  const pid_t pid = spw::testing::start({"drill", "--scenario", (dir / "s.toml").string()}, &err);
  const auto f = spw::testing::wait_for(pid, err, std::chrono::seconds(30));
  EXPECT_EQ(f.exit_code, 2) << f.err;
  EXPECT_NE(f.err.find("--report"), std::string::npos) << f.err;
  fs::remove_all(dir);
}

// The shipped default scenario (drills/default.toml), as a user runs it.
// Under a sanitizer the server's RSS is mostly the sanitizer's (ASan's shadow
// and quarantine: ~900 MiB for this drill), which no host budget of the
// scenario's size can hold: that run gets a copy whose budget is 4 GiB
// (everything else as shipped), so host_budget still checks the bound.
TEST(Drill, DefaultScenarioEveryFaultKindAndNoAcceptedRequestLost) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  const fs::path dir = temp_dir("live");
  fs::path scenario = fs::path(SPILLWAY_SOURCE_DIR) / "drills" / "default.toml";
  if (const char* san = std::getenv("SPILLWAY_SANITIZE"); san && *san) {
    std::string text = slurp(scenario);
    for (auto [from, to] : {std::pair<std::string, std::string>{R"("--host-budget", "512MiB")",
                                                                 R"("--host-budget", "4GiB")"},
                            {R"(model = "models/stories260K.gguf")",
                             "model = \"" + spw::testing::kStoriesModel + "\""}}) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << "drills/default.toml no longer has " << from;
      text.replace(at, from.size(), to);
    }
    scenario = dir / "default-sanitized.toml";
    std::ofstream(scenario) << text;
  }
  const fs::path report = dir / "report";
  int err = -1;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = spw::testing::start({"drill", "--scenario", scenario.string(), "--report", report.string()}, &err);
  const auto f = spw::testing::wait_for(pid, err, std::chrono::seconds(200));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("drill took %.1f s\n", took);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  ASSERT_TRUE(fs::exists(report / "report.html")) << f.err;
  const json r = json::parse(slurp(report / "report.json"), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << "report.json does not parse";

  // The main run's gates (it comes first; baselines were not asked for).
  const json* gates = find_key(r, "gates");
  ASSERT_NE(gates, nullptr) << "no gates in report.json";
  ASSERT_TRUE(gates->is_array() && !gates->empty());
  for (const json& g : *gates) EXPECT_TRUE(g.value("passed", false)) << g.dump();

  const json* events = find_key(r, "events");
  const json* ops = find_key(r, "ops");
  ASSERT_NE(events, nullptr);
  ASSERT_NE(ops, nullptr);
  std::set<std::string> kinds;
  std::string fired;
  for (const json& e : *events) {
    kinds.insert(e.value("kind", ""));
    if (e.value("kind", "") == "fault_fired") fired += e.value("detail", "") + "\n";
  }
  for (const char* k : {"pressure", "cotenant", "undeclared", "alloc_fail", "device_lost", "cancel_queued", "kill",
                        "restart", "breaker_open"}) {
    EXPECT_TRUE(kinds.count(k)) << "no " << k << " event in the history";
  }
  EXPECT_NE(fired.find("device_lost"), std::string::npos) << fired;
  EXPECT_NE(fired.find("alloc_fail"), std::string::npos) << fired;
  bool cancelled = false, degraded_shown = false, resumed = false;
  for (const json& o : *ops) {
    if (o.value("type", "") != "ok") continue;
    if (o.value("f", "") == "cancel") cancelled = true;
    if (o.value("f", "") == "resume") resumed = true;
    if (o.value("degraded", false) && o.value("degraded_shown", false)) degraded_shown = true;
  }
  EXPECT_TRUE(cancelled) << "no queued request was cancelled";
  EXPECT_TRUE(degraded_shown) << "no degraded response that showed it";
  EXPECT_TRUE(resumed) << "nothing interrupted was resumed";
  fs::remove_all(dir);
}

// drills/two-models.toml (issue 32): the served model and a catalogue model
// under shrinking device memory, a device fault and a kill -9. Release only
// (the sanitizer stages run the default drill's code paths already).
TEST(Drill, TwoModelsScenarioLosesNothingOfEitherModel) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  if (const char* san = std::getenv("SPILLWAY_SANITIZE"); san && *san) GTEST_SKIP() << "release only";
  const fs::path dir = temp_dir("two-models");
  const fs::path report = dir / "report";
  int err = -1;
  const fs::path scenario = fs::path(SPILLWAY_SOURCE_DIR) / "drills" / "two-models.toml";
  const pid_t pid = spw::testing::start({"drill", "--scenario", scenario.string(), "--report", report.string()}, &err);
  const auto f = spw::testing::wait_for(pid, err, std::chrono::seconds(200));
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const json r = json::parse(slurp(report / "report.json"), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << "report.json does not parse";
  const json* gates = find_key(r, "gates");
  ASSERT_NE(gates, nullptr);
  for (const json& g : *gates) EXPECT_TRUE(g.value("passed", false)) << g.dump();
  const json* ops = find_key(r, "ops");
  ASSERT_NE(ops, nullptr);
  // Both models answered, the second on its own paths (the device's and,
  // squeezed, the CPU's).
  std::set<std::string> second_paths;
  bool served = false;
  for (const json& o : *ops) {
    if (o.value("type", "") != "ok" || o.value("replayed", false)) continue;
    if (o.value("model", "") == "second") second_paths.insert(o.value("path", ""));
    if (o.value("model", "") == "stories260K") served = true;
  }
  EXPECT_TRUE(served);
  EXPECT_TRUE(second_paths.count("gpu/second")) << "no second-model request on its GPU path";
  EXPECT_TRUE(second_paths.count("cpu/second")) << "no second-model request redirected to its CPU path";
  for (const std::string& p : second_paths) EXPECT_TRUE(p == "gpu/second" || p == "cpu/second") << p;
  fs::remove_all(dir);
}

}  // namespace
