// The shipped drill scenario on the simulation as `spillway drill --simulate`
// runs it: its server.args read by the serve flags' parser
// (serve_options.h), so the simulated server has the settings, defaults and
// checks `spillway serve` would. (src/drill's own tests give the simulation
// typed options: src/drill reads no flags.)
// Environment: SPW_SIM_SEEDS (seeds; CI under sanitizers sets fewer),
// SPW_SIM_JOBS (simulate_seeds' threads), SPW_SIM_SCENARIO (another scenario
// file).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "app/serve_options.h"
#include "drill/scenario.h"
#include "drill/simulation.h"
#include "drill/simulation_test_util.h"

namespace spw::drill {
namespace {

// The shipped scenario, over many seeds (1,000 by default; SPW_SIM_SEEDS
// lowers it under sanitizers).
TEST(DrillScenarioTest, DefaultScenarioPassesOverManySeeds) {
  // SPW_SIM_SCENARIO: another scenario file.
  const char* other = std::getenv("SPW_SIM_SCENARIO");
  const std::string path = other ? std::string(other) : std::string(SPILLWAY_SOURCE_DIR) + "/drills/default.toml";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " does not exist";
  Result<Scenario> sc = load_scenario(path);
  ASSERT_TRUE(sc.ok()) << sc.status().to_string();
  SimOptions o;
  o.model_path = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
  o.scenario_file = "drills/default.toml";
  if (const char* j = std::getenv("SPW_SIM_JOBS")) o.jobs = std::atoi(j);
  Result<gateway::GatewayOptions> server = app::parse_serve_args(simulated_serve_args(*sc, o.model_path));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  o.server = *server;
  const int64_t n = seeds_from_env(1000);
  Result<SimSummary> s = simulate_seeds(*sc, o, 1, n, SimMode::kPlanned);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::printf("%s\n%.1f seeds/s (%.1f s for %lld seeds)\n", describe(*s).c_str(),
              static_cast<double>(s->seeds) / s->real_seconds, s->real_seconds, static_cast<long long>(s->seeds));
  EXPECT_EQ(s->passed, n) << describe(*s);
}

// drills/two-models.toml (issue 32): two models behind one device ledger
// under shrinking memory, a device fault and a kill, over 100 seeds (a
// tenth of SPW_SIM_SEEDS under the sanitizers).
TEST(DrillScenarioTest, TwoModelsScenarioPassesOverSeeds) {
  const std::string path = std::string(SPILLWAY_SOURCE_DIR) + "/drills/two-models.toml";
  Result<Scenario> sc = load_scenario(path);
  ASSERT_TRUE(sc.ok()) << sc.status().to_string();
  ASSERT_EQ(sc->server.models, std::vector<std::string>{"second=models/stories260K.gguf"});
  SimOptions o;
  o.model_path = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
  o.scenario_file = "drills/two-models.toml";
  Result<gateway::GatewayOptions> server = app::parse_serve_args(simulated_serve_args(*sc, o.model_path));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ASSERT_EQ(server->models.size(), 1u);
  o.server = *server;
  // A tenth of the default scenario's seeds: 100 in release, 6 under a
  // sanitizer (SPW_SIM_SEEDS=60), where each seed costs ~15x.
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(seeds_from_env(1000) / 10, 100));
  Result<SimSummary> s = simulate_seeds(*sc, o, 1, n, SimMode::kPlanned);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::printf("%s\n", describe(*s).c_str());
  EXPECT_EQ(s->passed, n) << describe(*s);
}

// The scenario's flags are the server's: parsed with serve's defaults, and a
// flag serve does not know is refused.
TEST(DrillScenarioTest, ServerArgsAreParsedAsServeParsesThem) {
  Result<gateway::GatewayOptions> g =
      app::parse_serve_args({"--model", "m.gguf", "--ctx", "256", "--breaker-cooldown-s=1", "--host-budget", "512MiB"});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->ctx, 256);
  EXPECT_EQ(g->breaker_cooldown_s, 1);
  EXPECT_EQ(g->host_budget, uint64_t{512} << 20);
  EXPECT_EQ(g->queue, gateway::GatewayOptions{}.queue);
  EXPECT_FALSE(app::parse_serve_args({"--model", "m.gguf", "--no-such-flag", "1"}).ok());
  EXPECT_FALSE(app::parse_serve_args({"--model", "m.gguf", "--parallel", "0"}).ok());
}

}  // namespace
}  // namespace spw::drill
