// Runs the real `spillway` binary and checks exit codes and output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>

#include "core/digest.h"
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
  return (std::filesystem::temp_directory_path() / ("spw_cli_test_" + std::to_string(getpid()) + "_" + name)).string();
}

// `stdin_path`: what the command reads (default: nothing).
CmdResult run(const std::string& args, const std::string& stdin_path = "/dev/null") {
  const std::string out = tmp_path("out"), err = tmp_path("err");
  const std::string cmd = std::string(SPILLWAY_BINARY) + " " + args + " >" + out + " 2>" + err + " <" + stdin_path;
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

const std::string kGpt2Vocab = std::string(SPILLWAY_SOURCE_DIR) + "/tests/data/vocab/ggml-vocab-gpt-2.gguf";

TEST(CliTest, TokenizeAndInspectByteLevelBpe) {
  CmdResult r = run("tokenize --model " + kGpt2Vocab + " 'Hello world'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[15496, 995]"));  // GPT-2 adds no BOS
  CmdResult p = run("tokenize --pieces --model " + kGpt2Vocab + " 'Hello world'");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  auto pieces = nlohmann::json::parse(p.out);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1]["piece"], "\xC4\xA0world");  // as stored: GPT-2's byte symbol for space
  EXPECT_EQ(pieces[1]["text"], " world");

  CmdResult i = run("inspect --json " + kGpt2Vocab);
  ASSERT_EQ(i.exit_code, 0) << i.err;
  auto j = nlohmann::json::parse(i.out);
  EXPECT_EQ(j["tokenizer"]["kind"], "byte-level BPE");
  EXPECT_EQ(j["tokenizer"]["pre_tokenizer"], "gpt-2");
  EXPECT_EQ(j["tokenizer"]["n_vocab"], 50257);
  EXPECT_EQ(j["tokenizer"]["eos"]["text"], "<|endoftext|>");
  CmdResult t = run("inspect " + kStories);
  ASSERT_EQ(t.exit_code, 0);
  EXPECT_NE(t.out.find("tokenizer llama (SentencePiece BPE), 512 tokens"), std::string::npos) << t.out;
}

TEST(CliTest, UnsupportedPreTokenizerIsNamed) {
  spw::gguf::GgufWriter w;
  w.set("tokenizer.ggml.model", spw::gguf::Value::str("gpt2"));
  w.set("tokenizer.ggml.pre", spw::gguf::Value::str("brand-new-pre"));
  w.set("tokenizer.ggml.tokens", spw::gguf::Value::array(spw::gguf::ValueType::kString, {spw::gguf::Value::str("a")}));
  w.set("tokenizer.ggml.merges", spw::gguf::Value::array(spw::gguf::ValueType::kString, {}));
  auto bytes = w.serialize();
  ASSERT_TRUE(bytes.ok());
  const std::string path = tmp_path("newpre.gguf");
  std::ofstream(path, std::ios::binary).write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  CmdResult tok = run("tokenize --model " + path + " hi");
  EXPECT_EQ(tok.exit_code, 1);
  EXPECT_NE(tok.err.find("tokenizer.ggml.pre 'brand-new-pre'"), std::string::npos) << tok.err;
  CmdResult i = run("inspect " + path);
  EXPECT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("tokenizer not supported: "), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("'brand-new-pre'"), std::string::npos) << i.out;
  std::remove(path.c_str());
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
  // Without NVIDIA's library the GPUs are unknown, with the reason naming it;
  // with it (a machine with an NVIDIA GPU), the figures name NVML as their source.
  EXPECT_TRUE(real.out.find("libnvidia-ml.so.1") != std::string::npos ||
              real.out.find("from nvml") != std::string::npos)
      << real.out;
}

TEST(CliTest, EstimateBreaksDownMemoryByCategory) {
  CmdResult r = run("estimate --json --model " + kStories + " --ctx 256 --ubatch 32 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kv_bytes_per_token"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.is_object());
  // stories260K: 5 layers x 2 (K and V) x 4 KV heads x head dim 8 x 2 bytes
  // (f16, the default), x 4 bytes with --kv-type f32.
  EXPECT_NE(r.out.find("\"kv_bytes_per_token\": 640"), std::string::npos) << r.out;
  EXPECT_EQ(j["plan"]["kv_type"], "f16");
  EXPECT_EQ(j["plan"]["placement"], "cpu");
  CmdResult f32 = run("estimate --json --model " + kStories + " --ctx 256 --ubatch 32 --device cpu --kv-type f32");
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_NE(f32.out.find("\"kv_bytes_per_token\": 1280"), std::string::npos) << f32.out;
  CmdResult bad_kv = run("estimate --model " + kStories + " --kv-type f8");
  EXPECT_NE(bad_kv.exit_code, 0);
  EXPECT_NE(bad_kv.err.find("'f8'"), std::string::npos) << bad_kv.err;
  // q8_0 needs head_dim % 32 == 0; stories260K's is 8.
  CmdResult q8 = run("estimate --model " + kStories + " --kv-type q8_0");
  EXPECT_NE(q8.exit_code, 0);
  EXPECT_NE(q8.err.find("head_dim"), std::string::npos) << q8.err;
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
      {"cpu", "cpu"},    {"hybrid:0", "cpu"},    {"vulkan", "vulkan"},     {"vulkan:0", "vulkan"},
      {"gpu", "vulkan"}, {"hybrid:9", "vulkan"}, {"hybrid:2", "hybrid:2"}, {"hybrid:2:0", "hybrid:2"}};
  for (const auto& [device, placement] : cases) {
    CmdResult r = run(base + device);
    ASSERT_EQ(r.exit_code, 0) << device << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["plan"]["placement"], placement) << device;
    const int n_gpu = placement == "cpu" ? 0 : placement == "vulkan" ? 5 : 2;
    EXPECT_EQ(j["plan"]["n_gpu_layers"], n_gpu) << device;
  }
}

// --fit BUDGET walks from vulkan down through hybrid:N to cpu and names the
// first placement whose device total fits: each candidate's total is what
// --device would estimate for it.
TEST(CliTest, EstimateFitNamesTheMostLayersThatFitABudget) {
  const std::string base = "estimate --json --model " + kStories + " --ctx 256 --ubatch 32 ";
  CmdResult hybrid2 = run(base + "--device hybrid:2");
  ASSERT_EQ(hybrid2.exit_code, 0) << hybrid2.err;
  const uint64_t two = nlohmann::json::parse(hybrid2.out)["devices"][1]["total"].get<uint64_t>();
  CmdResult r = run(base + "--fit " + std::to_string(two));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["best"], "hybrid:2") << r.out;
  EXPECT_EQ(j["gpu_layers"], 2);
  ASSERT_EQ(j["candidates"].size(), 4u) << r.out;  // vulkan, hybrid:4, hybrid:3, hybrid:2
  EXPECT_EQ(j["candidates"][0]["device"], "vulkan");
  EXPECT_FALSE(j["candidates"][2]["fits"].get<bool>());
  EXPECT_EQ(j["candidates"][3]["gpu_total"].get<uint64_t>(), two);
  CmdResult all = run(base + "--fit 1GiB");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(nlohmann::json::parse(all.out)["best"], "vulkan");
  CmdResult none = run(base + "--fit 1KiB");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(nlohmann::json::parse(none.out)["best"], "cpu");
  CmdResult bad = run(base + "--fit lots");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--fit lots"), std::string::npos) << bad.err;
  CmdResult both = run(base + "--fit 1GiB --device cpu");
  EXPECT_NE(both.exit_code, 0);
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
#if !defined(SPW_SANITIZE_ADDRESS) && !defined(SPW_SANITIZE_THREAD)
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
    // The device's work: the prompt in some submissions, each decode step
    // the same number (24 tokens: 23 steps).
    EXPECT_GE(j["device_work"]["prefill"]["submissions"].get<uint64_t>(), 1u) << dev;
    const double per_step = j["device_work"]["decode_per_step"]["submissions"].get<double>();
    EXPECT_GE(per_step, 1.0) << dev;
    EXPECT_EQ(per_step, std::floor(per_step)) << dev << ": steps differ";
    EXPECT_GT(j["device_work"]["decode_per_step"]["dispatches"].get<double>(), 0.0) << dev;
  }
  EXPECT_FALSE(cpu.contains("device_work"));
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

// The flags GatewayOptions holds typed are parsed by the app (serve_options.h):
// a value that does not parse is refused naming its flag, before the model
// loads; build_gateway's own checks reach the user with the flag's dashes.
TEST(CliTest, ServeRefusesBadTypedFlagsNamingThem) {
  const std::string base = "serve --model " + kStories + " --journal none ";
  CmdResult replica = run(base + "--replica lazy");
  EXPECT_NE(replica.exit_code, 0);
  EXPECT_NE(replica.err.find("--replica"), std::string::npos) << replica.err;
  CmdResult kv = run(base + "--kv-type f8");
  EXPECT_EQ(kv.exit_code, 1);
  EXPECT_NE(kv.err.find("--kv-type"), std::string::npos) << kv.err;
  EXPECT_NE(kv.err.find("'f8'"), std::string::npos) << kv.err;
  CmdResult device = run(base + "--device tpu");
  EXPECT_EQ(device.exit_code, 1);
  EXPECT_NE(device.err.find("--device"), std::string::npos) << device.err;
  CmdResult co = run(base + "--co-tenant whisper");
  EXPECT_EQ(co.exit_code, 1);
  EXPECT_NE(co.err.find("--co-tenant whisper: expected NAME=SIZE"), std::string::npos) << co.err;
  CmdResult size = run(base + "--device-headroom lots");
  EXPECT_EQ(size.exit_code, 1);
  EXPECT_NE(size.err.find("--device-headroom lots"), std::string::npos) << size.err;
  CmdResult ctx = run(base + "--ctx 99999");
  EXPECT_EQ(ctx.exit_code, 1);
  EXPECT_NE(ctx.err.find("--ctx must be in [2, "), std::string::npos) << ctx.err;
}

CmdResult run_with_stdin(const std::string& args, const std::string& input) {
  const std::string in = tmp_path("in");
  {
    std::ofstream f(in, std::ios::binary);
    f << input;
  }
  CmdResult r = run(args, in);
  std::remove(in.c_str());
  return r;
}

TEST(CliTest, HashKeyPrintsTheConfigLine) {
  const std::string key = "spw-alpha-0123456789abcdef";
  const std::string line = "api-key-hash = \"sha256:" + spw::sha256_hex(key) + "\"\n";
  CmdResult r = run_with_stdin("hash-key", key + "\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, line);
  EXPECT_EQ(r.out.find(key), std::string::npos) << "the key itself is not printed";
  // No trailing newline, or a CRLF one: the same key.
  EXPECT_EQ(run_with_stdin("hash-key", key).out, line);
  EXPECT_EQ(run_with_stdin("hash-key", key + "\r\n").out, line);
}

TEST(CliTest, HashKeyRefusesEmptyAndRuleBreakingKeys) {
  CmdResult none = run("hash-key");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("no key"), std::string::npos) << none.err;
  CmdResult shorty = run_with_stdin("hash-key", "short-key\n");
  EXPECT_EQ(shorty.exit_code, 2);
  EXPECT_NE(shorty.err.find("at least 16"), std::string::npos) << shorty.err;
  EXPECT_EQ(shorty.err.find("short-key"), std::string::npos) << "the key is not quoted";
  CmdResult spaced = run_with_stdin("hash-key", "a key with spaces in it\n");
  EXPECT_EQ(spaced.exit_code, 2);
  EXPECT_NE(spaced.err.find("without spaces"), std::string::npos) << spaced.err;
  EXPECT_TRUE(spaced.out.empty());
  EXPECT_EQ(run_with_stdin("hash-key", "spw-alpha-0123456789abcdef\nspw-bravo-0123456789abcdef\n").exit_code, 2);
}

TEST(CliTest, HashKeyGeneratesAFreshKeyAndItsHash) {
  auto generated = [] {
    CmdResult r = run("hash-key --generate");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string key, hash_line;
    std::istringstream lines(r.out);
    for (std::string l; std::getline(lines, l);) {
      if (l.starts_with("spw-")) key = l;
      if (l.starts_with("api-key-hash = ")) hash_line = l;
    }
    return std::pair(key, hash_line);
  };
  const auto [key, hash_line] = generated();
  ASSERT_EQ(key.size(), 4u + 43u) << key;
  for (char c : key.substr(4)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') << key;
  EXPECT_EQ(hash_line, "api-key-hash = \"sha256:" + spw::sha256_hex(key) + "\"");
  EXPECT_NE(generated().first, key);
}

// `serve --config FILE`: a TOML file of top-level keys named as the flags.
// These runs stop before any model loads: at the file itself (exit 2), at
// --dump-config, or at the API-key and --max-body checks of run_serve.
std::string write_config(const std::string& name, const std::string& toml) {
  const std::string path = tmp_path(name);
  std::ofstream(path, std::ios::binary) << toml;
  return path;
}

const std::string kKeyHash = "sha256:" + spw::sha256_hex("spw-alpha-0123456789abcdef");
const char* const kNoKeyMessage = "--insecure-no-auth to accept that";

TEST(CliTest, ServeConfigRefusesABadValueNamingTheKey) {
  const std::string cfg =
      write_config("bad_value.toml", "api-key-hash = [\"" + kKeyHash + "\"]\ncpu-queue = \"abc\"\n");
  CmdResult r = run("serve --config " + cfg);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cpu-queue"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cfg + "' line 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expected an integer"), std::string::npos) << r.err;
  // A value of the right type that the flag's own check refuses.
  const std::string range = write_config("bad_range.toml", "port = 99999\n");
  CmdResult p = run("serve --config " + range);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.err.find("port"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("65535"), std::string::npos) << p.err;
  std::remove(cfg.c_str());
  std::remove(range.c_str());
}

TEST(CliTest, ServeConfigRefusesUnknownKeysSectionsAndUnreadableFiles) {
  auto refused = [](const std::string& toml, const std::string& needle) {
    const std::string cfg = write_config("refused.toml", toml);
    CmdResult r = run("serve --model " + kStories + " --config " + cfg);
    EXPECT_EQ(r.exit_code, 2) << toml;
    EXPECT_NE(r.err.find(cfg), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    std::remove(cfg.c_str());
  };
  refused("port = 8081\nbogus-key = 1\n", "unknown key 'bogus-key'");
  refused("[serve]\nport = 8081\n", "[serve] is a section");
  refused("port = 8081\nhost = \n", "line 2");  // not TOML
  refused("port = \"8081\"\n", "port: expected an integer, got a string");
  refused("port = [8081]\n", "port: takes one value");
  refused("log-requests = \"yes\"\n", "log-requests: expected true or false");
  refused("api-key-hash = [true]\n", "api-key-hash: expected an array of strings, got a boolean");
  refused("host = { a = 1 }\n", "host: expected a string, got a table");
  refused("config = \"other.toml\"\n", "'config' cannot be set");
  // A text setting takes a string, not a number that would become a file name.
  refused("port = 8081\njournal = 5\n", "line 2: journal: expected a string, got an integer");
  refused("api-key = [\"0123456789abcdef\",\n  5]\n", "line 2: api-key: expected an array of strings, got an integer");
  // A key's rules are checked where the file gives it (lengths, never the key).
  refused("port = 8081\napi-key = [\"short-key\"]\n", "line 2: api-key: an API key (--api-key) must be at least 16");
  refused("admin-token = \"tok\"\n", "line 1: admin-token: the admin token (--admin-token) must be at least 16");
  // A size is a byte count or a string with its unit, nothing else.
  refused("journal-max-bytes = 1.5\n", "journal-max-bytes: expected a size");
  const std::string missing = tmp_path("missing.toml");
  CmdResult r = run("serve --model " + kStories + " --config " + missing);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(missing + "': does not exist"), std::string::npos) << r.err;
}

TEST(CliTest, ServeConfigSettingsAreApplied) {
  // host from the file: a non-loopback address without keys is refused
  // before the model loads (the default host is loopback).
  const std::string open = write_config("open.toml", "host = \"0.0.0.0\"\nport = 0\nmax-body = \"lots\"\n");
  CmdResult no_key = run("serve --model " + kStories + " --config " + open);
  EXPECT_EQ(no_key.exit_code, 1);
  EXPECT_NE(no_key.err.find(kNoKeyMessage), std::string::npos) << no_key.err;
  // The same with a key, a key hash (the scalar line `hash-key` prints) or
  // `insecure-no-auth = true` in the file: past that check, stopped by the
  // file's max-body instead.
  for (const std::string& auth : {std::string("api-key = [\"0123456789abcdefXYZ\"]\n"),
                                  "api-key-hash = \"" + kKeyHash + "\"\n", std::string("insecure-no-auth = true\n")}) {
    const std::string cfg = write_config(
        "keyed.toml", "model = \"" + kStories + "\"\nhost = \"0.0.0.0\"\n" + "max-body = \"lots\"\n" + auth);
    CmdResult r = run("serve --config " + cfg);  // --model from the file too
    EXPECT_EQ(r.exit_code, 1) << auth;
    EXPECT_EQ(r.err.find(kNoKeyMessage), std::string::npos) << auth << r.err;
    EXPECT_NE(r.err.find("--max-body: "), std::string::npos) << auth << r.err;
    std::remove(cfg.c_str());
  }
  // A bad hash in the file reaches the key check, which names it.
  const std::string bad_hash = write_config("bad_hash.toml", "api-key-hash = [\"sha256:zz\"]\n");
  CmdResult h = run("serve --model " + kStories + " --config " + bad_hash);
  EXPECT_EQ(h.exit_code, 1);
  EXPECT_NE(h.err.find("--api-key-hash: "), std::string::npos) << h.err;
  // Every kind of value lands: what --dump-config prints after reading it.
  const std::string all =
      write_config("all.toml",
                   "port = 9123\ncpu-queue = 5\nhost-memory-share = 0.25\nno-batching = true\n"
                   "log-requests = false\nco-tenant = [\"a=1GiB\", \"b=2GiB\"]\njournal-max-bytes = 1048576\n"
                   "journal-max-body-bytes = \"32KiB\"\n");
  CmdResult d = run("serve --config " + all + " --dump-config");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  for (const char* line :
       {"\nport = 9123\n", "\ncpu-queue = 5\n", "\nhost-memory-share = 0.25\n", "\nno-batching = true\n",
        "\nlog-requests = false\n", "\nco-tenant = [\"a=1GiB\", \"b=2GiB\"]\n", "\nqueue = 64\n",
        "\njournal-max-bytes = 1048576\n", "\njournal-max-body-bytes = \"32KiB\"\n"}) {
    EXPECT_NE(d.out.find(line), std::string::npos) << line << d.out;
  }
  for (const std::string& f : {open, bad_hash, all}) std::remove(f.c_str());
}

TEST(CliTest, ServeCommandLineWinsOverConfig) {
  const std::string cfg = write_config("override.toml",
                                       "cpu-queue = 5\nhost = \"0.0.0.0\"\nmax-body = \"lots\"\n"
                                       "co-tenant = [\"a=1GiB\"]\n");
  CmdResult d = run("serve --config " + cfg + " --cpu-queue 7 --co-tenant b=2GiB --dump-config");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("\ncpu-queue = 7\n"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("\nco-tenant = [\"b=2GiB\"]\n"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("\nhost = \"0.0.0.0\"\n"), std::string::npos) << d.out;
  // --host on the command line (before --config, too) replaces the file's
  // non-loopback one: no key needed, stopped by the file's max-body.
  CmdResult r = run("serve --host 127.0.0.1 --model " + kStories + " --config " + cfg);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.find(kNoKeyMessage), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--max-body: "), std::string::npos) << r.err;
  std::remove(cfg.c_str());
}

TEST(CliTest, ServeConfigModelTablesAreTheCatalogueFlags) {
  const std::string cfg = write_config("models.toml", "[[model]]\npath = \"" + kStories +
                                                          "\"\n\n[[model]]\nname = \"coder\"\npath = \"/m/c.gguf\"\n"
                                                          "pinned = true\nkeep_alive = \"30m\"\n\n[[model]]\n"
                                                          "path = \"/m/small.gguf\"\npreload = true\nkeep_alive = 60\n");
  CmdResult d = run("serve --config " + cfg + " --dump-config");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("\nmodel = [\"" + kStories + "\", \"coder=/m/c.gguf\", \"/m/small.gguf\"]\n"), std::string::npos)
      << d.out;
  EXPECT_NE(d.out.find("\npin = [\"coder\"]\n"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("\npreload = [\"small\"]\n"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("\nmodel-keep-alive = [\"coder=30m\", \"small=60\"]\n"), std::string::npos) << d.out;
  // Mistakes name the file, the line and the key.
  const std::string bad = write_config("bad-models.toml", "[[model]]\npath = \"a.gguf\"\n\n[[model]]\nfile = \"b\"\n");
  CmdResult b = run("serve --config " + bad + " --dump-config");
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("line 4"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("unknown key 'file'"), std::string::npos) << b.err;
  std::remove(cfg.c_str());
  std::remove(bad.c_str());
}

TEST(CliTest, ServeRefusesABadCatalogueEntryNamingIt) {
  CmdResult r = run("serve --model " + kStories + " --model coder=/nonexistent/c.gguf --port 0 --journal none");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--model coder (/nonexistent/c.gguf): "), std::string::npos) << r.err;
  r = run("serve --model " + kStories + " --model " + kStories + " --port 0 --journal none");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("another model of the catalogue has this name"), std::string::npos) << r.err;
  r = run("serve --model " + kStories + " --pin coder --port 0 --journal none");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--pin coder: no catalogue model has this name"), std::string::npos) << r.err;
  r = run("serve --model " + kStories + " --keep-alive 5x --port 0 --journal none");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--keep-alive: duration '5x'"), std::string::npos) << r.err;
}

TEST(CliTest, ServeDumpConfigReadsBack) {
  // The defaults: every key, readable as a config file giving the same.
  CmdResult defaults = run("serve --dump-config");
  ASSERT_EQ(defaults.exit_code, 0) << defaults.err;
  for (const char* line : {"\nport = 8080\n", "\nhost = \"127.0.0.1\"\n", "\ncpu-queue = 8\n", "\napi-key-hash = []\n",
                           "\nno-batching = false\n", "\nmax-body = \"16MiB\"\n", "\nmodel = []\n"}) {
    EXPECT_NE(defaults.out.find(line), std::string::npos) << line << defaults.out;
  }
  const std::string dumped = write_config("dumped.toml", defaults.out);
  CmdResult again = run("serve --config " + dumped + " --dump-config");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, defaults.out);
  // Settings given as flags come back the same through a file.
  CmdResult set = run("serve --port 9000 --cpu-queue 3 --no-batching --api-key-hash " + kKeyHash +
                      " --co-tenant a=1GiB --co-tenant b=2GiB --host-memory-share 0.25 --host-budget 2GiB "
                      "--admin-token 'tok\"en-0123456789abcdef' --dump-config");
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_NE(set.out.find("\napi-key-hash = [\"" + kKeyHash + "\"]\n"), std::string::npos) << set.out;
  const std::string dumped_set = write_config("dumped_set.toml", set.out);
  CmdResult set_again = run("serve --config " + dumped_set + " --dump-config");
  ASSERT_EQ(set_again.exit_code, 0) << set_again.err;
  EXPECT_EQ(set_again.out, set.out);
  std::remove(dumped.c_str());
  std::remove(dumped_set.c_str());
}

}  // namespace
