// Runs the real `spillway` binary and checks exit codes and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "core/env.h"
#include "gguf/gguf.h"

namespace {

struct CmdResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("spw_cli_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

CmdResult run(const std::string& args) {
  const std::string out = tmp_path("out"), err = tmp_path("err");
  const std::string cmd = std::string(SPILLWAY_BINARY) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int status = std::system(cmd.c_str());
  CmdResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

const std::string kStories = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";

TEST(CliTest, InspectShowsMetadataAndParameterCount) {
  CmdResult r = run("inspect --json " + kStories);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["metadata"]["general.architecture"], "llama");
  EXPECT_EQ(j["metadata"]["llama.block_count"], 5);
  EXPECT_GT(j["n_params"].get<uint64_t>(), 200000u);
  EXPECT_LT(j["n_params"].get<uint64_t>(), 300000u);
  EXPECT_TRUE(j["bytes_by_type"].contains("F32"));
  // Text mode lists the tensor table.
  CmdResult t = run("inspect " + kStories);
  ASSERT_EQ(t.exit_code, 0);
  EXPECT_NE(t.out.find("blk.0.attn_q.weight"), std::string::npos);
}

TEST(CliTest, InspectMissingAndCorruptFilesFailNamingTheProblem) {
  CmdResult missing = run("inspect /nonexistent/model.gguf");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos);

  // A truncated copy of a real model.
  std::string bytes = slurp(kStories);
  std::string cut = tmp_path("truncated.gguf");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), 5000);
  CmdResult corrupt = run("inspect " + cut);
  EXPECT_EQ(corrupt.exit_code, 1);
  EXPECT_NE(corrupt.err.find("Corruption"), std::string::npos) << corrupt.err;
  std::remove(cut.c_str());
}

TEST(CliTest, TokenizePrintsJsonIds) {
  CmdResult r = run("tokenize --model " + kStories + " 'Once upon a time'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ids = nlohmann::json::parse(r.out);
  ASSERT_TRUE(ids.is_array());
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 1);  // BOS
  CmdResult no_bos = run("tokenize --no-bos --model " + kStories + " 'Once upon a time'");
  ASSERT_EQ(no_bos.exit_code, 0);
  auto ids2 = nlohmann::json::parse(no_bos.out);
  EXPECT_EQ(ids2.size() + 1, ids.size());
  EXPECT_NE(ids2[0], 1);
}

TEST(CliTest, GreedyGenerateTellsTheLilyStory) {
  CmdResult r = run("generate --json --model " + kStories + " --prompt 'Once upon a time' -n 48 --temp 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["text"].get<std::string>().find("Lily"), std::string::npos) << j["text"];
  EXPECT_EQ(j["tokens"].size(), 48u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_GT(j["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["timings"]["peak_rss_bytes"].get<int64_t>(), 0);
  // The same seed gives the same sampled tokens.
  const std::string sampled = "generate --json --model " + kStories + " --prompt 'Once' -n 16 --temp 0.9 --seed 42";
  auto a = nlohmann::json::parse(run(sampled).out);
  auto b = nlohmann::json::parse(run(sampled).out);
  EXPECT_EQ(a["tokens"], b["tokens"]);
}

TEST(CliTest, GenerateRefusesUnknownArchitectureNamingIt) {
  spw::gguf::GgufWriter w;
  w.set("general.architecture", spw::gguf::Value::str("mamba"));
  std::string path = tmp_path("mamba.gguf");
  ASSERT_TRUE(w.write(spw::Env::default_env(), path).ok());
  CmdResult r = run("generate --model " + path + " --prompt hi -n 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("mamba"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(CliTest, DevicesReportsFiguresWithTheirSources) {
  const std::string root = std::string(SPILLWAY_SOURCE_DIR) + "/src/device/testdata/v2";
  CmdResult r = run("devices --json --root " + root);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("8589934592"), std::string::npos) << r.out;  // the fixture's cgroup memory.max
  CmdResult real = run("devices");
  ASSERT_EQ(real.exit_code, 0) << real.err;
  EXPECT_NE(real.out.find("/proc/meminfo"), std::string::npos) << real.out;
  EXPECT_NE(real.out.find("libnvidia-ml.so.1"), std::string::npos) << real.out;  // unknown, with the reason
}

TEST(CliTest, EstimateBreaksDownMemoryByCategory) {
  CmdResult r = run("estimate --json --model " + kStories + " --ctx 256 --ubatch 32 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kv_bytes_per_token"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.is_object());
  // stories260K: 5 layers x 2 (K and V) x 4 KV heads x head dim 8 x 4 bytes.
  EXPECT_NE(r.out.find("\"kv_bytes_per_token\": 1280"), std::string::npos) << r.out;
  EXPECT_EQ(j["plan"]["placement"], "cpu");
  CmdResult bad = run("estimate --model " + kStories + " --device hybrid:x");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--device"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("'hybrid:x'"), std::string::npos) << bad.err;
}

// --device takes what serve and generate take (plus gpu, the older spelling
// of vulkan) and the plan names the placement as it would run: stories260K
// has 5 layers, so hybrid:9 runs (and is estimated) as vulkan.
TEST(CliTest, EstimateSpellsPlacementsAsServeDoes) {
  const std::string base = "estimate --json --model " + kStories + " --ctx 256 --ubatch 32 --device ";
  const std::pair<std::string, std::string> cases[] = {
      {"cpu", "cpu"},           {"hybrid:0", "cpu"},   {"vulkan", "vulkan"}, {"vulkan:0", "vulkan"},
      {"gpu", "vulkan"},        {"hybrid:9", "vulkan"}, {"hybrid:2", "hybrid:2"}, {"hybrid:2:0", "hybrid:2"}};
  for (const auto& [device, placement] : cases) {
    CmdResult r = run(base + device);
    ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["plan"]["placement"], placement) << device;
    const int n_gpu = placement == "cpu" ? 0 : placement == "vulkan" ? 5 : 2;
    EXPECT_EQ(j["plan"]["n_gpu_layers"], n_gpu) << device;
  }
}

// The estimate's host baseline is this binary's own RSS before it opens a
// model, so its total is comparable with the peak RSS `generate` reports for
// the same plan (which fills only part of the context, so it uses less).
TEST(CliTest, EstimateHostTotalCoversGeneratePeakRss) {
  const std::string plan = " --model " + kStories + " --ctx 256 --ubatch 64";
  CmdResult e = run("estimate --json" + plan + " --device cpu");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  auto ej = nlohmann::json::parse(e.out);
  EXPECT_EQ(ej["host_baseline"]["source"], "observed: /proc/self/status") << e.out;
  const uint64_t baseline = ej["host_baseline"]["bytes"].get<uint64_t>();
  EXPECT_GT(baseline, 1u << 20);
  uint64_t host_total = 0;
  for (const auto& d : ej["devices"])
    if (d["device"] == "host") host_total = d["total"].get<uint64_t>();
  ASSERT_GT(host_total, baseline);
  CmdResult g = run("generate --json" + plan + " --prompt 'Once upon a time' -n 64 --temp 0");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  [[maybe_unused]] const uint64_t peak = nlohmann::json::parse(g.out)["timings"]["peak_rss_bytes"].get<uint64_t>();
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (Sanitizer runtimes add shadow memory the estimate does not model.)
  EXPECT_LE(peak, host_total) << "estimate " << host_total << " below generate's peak RSS " << peak;
  EXPECT_GE(peak, host_total * 8 / 10) << "estimate " << host_total << " far above generate's peak RSS " << peak;
#endif

  CmdResult fixed = run("estimate --json --host-baseline 10MiB" + plan);
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  auto fj = nlohmann::json::parse(fixed.out);
  EXPECT_EQ(fj["host_baseline"]["bytes"], 10u << 20);
  EXPECT_EQ(fj["host_baseline"]["source"], "--host-baseline");
  CmdResult bad = run("estimate --host-baseline lots" + plan);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--host-baseline lots"), std::string::npos) << bad.err;
}

TEST(CliTest, GenerateOnVulkanAndHybridGivesTheCpuTokens) {
  auto devices = nlohmann::json::parse(run("devices --json").out);
  if (!devices["vulkan"]["known"].get<bool>() || devices["vulkan"]["devices"].empty()) {
    GTEST_SKIP() << "no Vulkan device: " << devices["vulkan"].dump();
  }
  const std::string base = "generate --json --model " + kStories + " --prompt 'Once upon a time' -n 24 --temp 0";
  auto cpu = nlohmann::json::parse(run(base + " --device cpu").out);
  for (const std::string dev : {"vulkan", "vulkan:0", "hybrid:2"}) {
    CmdResult r = run(base + " --device " + dev);
    ASSERT_EQ(r.exit_code, 0) << dev << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"], cpu["tokens"]) << dev;
    EXPECT_GT(j["device_memory"]["peak_by_category"]["weights"].get<uint64_t>(), 0u) << dev;
  }
  CmdResult tiny = run(base + " --device vulkan --device-memory 64KiB");
  EXPECT_EQ(tiny.exit_code, 1);
  EXPECT_NE(tiny.err.find("ResourceExhausted"), std::string::npos) << tiny.err;
  CmdResult bad = run(base + " --device tpu");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("'tpu'"), std::string::npos) << bad.err;
}

TEST(CliTest, BadUsageExitsNonZero) {
  CmdResult r = run("generate --prompt hi");  // --model missing
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
  CmdResult bad_temp = run("generate --model " + kStories + " --prompt hi --temp nan");
  EXPECT_NE(bad_temp.exit_code, 0);
}

}  // namespace
