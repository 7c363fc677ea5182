// build_gateway() end to end on real components: the bundled model, a
// generated fallback model sharing its tokenizer, the CPU engine and Vulkan on
// lavapipe (tests needing Vulkan skip without a device). Covers what the
// composition decides at start (which paths, replica modes, the offload
// path's share of the device) and that the decisions then use them.
#include "gateway/builder.h"

#include <gtest/gtest.h>

#include <map>

#include <chrono>
#include <filesystem>
#include <string>

#include "backend/vulkan/device_spec.h"
#include "backend/vulkan/vulkan_backend.h"
#include "serve/testing/collect.h"
#include "tools/modelgen/random_llama.h"

namespace spw::gateway {
namespace {

using admission::DecisionKind;
using serve::testing::collect;
using serve::testing::Collected;

std::string src(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }
std::string stories() { return src("models/stories260K.gguf"); }

std::string vulkan_missing() {
  auto devs = list_vulkan_devices();
  if (!devs.ok()) return devs.status().to_string();
  if (devs->empty()) return "no Vulkan device";
  return "";
}

class BuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spw_builder_test_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A smaller random model; with the bundled model's vocabulary by default.
  std::string fallback(const std::string& vocab = "models/stories260K.gguf") {
    modelgen::RandomLlamaSpec s;
    s.n_embd = 32;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 64;
    s.n_ctx = 2048;
    s.vocab_path = src(vocab);
    const std::string path = (dir_ / "fallback.gguf").string();
    const Status st = modelgen::write_random_llama(Env::default_env(), path, s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return path;
  }

  // The GPU path: 3.475 MiB of lavapipe for the
  // bundled model leaves a handful of KV blocks (of F32 rows: the figures
  // below were sized for them; F16 would fit twice the blocks).
  GatewayOptions gpu_options() const {
    GatewayOptions o;
    o.kv_type = KvType::kF32;
    o.model = stories();
    o.device = Placement::vulkan();
    o.device_memory = *parse_memory_size("3.475MiB");  // as --device-memory 3.475MiB
    o.ctx = 512;
    o.cpu_ctx = 2048;
    o.journal = "none";
    o.threads = 1;
    return o;
  }

  static RouteRequest request(const std::string& prompt, int32_t max_tokens) {
    RouteRequest r;
    r.generation.prompt = prompt;
    r.generation.max_tokens = max_tokens;
    r.generation.sampler.temperature = 0;
    return r;
  }

  // Points into `s`: keep the status alive while using it.
  static const PathStatus* path_status(const GatewayStatus& s, const std::string& name) {
    for (const PathStatus& p : s.paths)
      if (p.name == name) return &p;
    return nullptr;
  }

  std::filesystem::path dir_;
};

std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 20; ++i) p += "Once upon a time there was a little girl. ";
  return p;
}

TEST_F(BuilderTest, AFallbackModelWithAnotherTokenizerIsRefusedNamingTheFlag) {
  GatewayOptions o;
  o.model = stories();
  o.device = Placement::vulkan();
  o.journal = "none";
  o.fallback_model = fallback("tests/data/ggml-vocab-llama-spm.gguf");
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().reason(), FailureReason::kInvalidField);
  EXPECT_EQ(b.status().field(), "fallback-model");
  EXPECT_NE(b.status().message().find("tokenizer differs"), std::string::npos) << b.status().to_string();

  // With a CPU first path there is no fallback to serve it on.
  o.device = Placement::cpu();
  o.fallback_model = fallback();
  b = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().field(), "fallback-model");
}

// A replica mode that is not one is refused where the text is parsed
// (parse_replica_mode; `spillway serve --replica lazy`: cli_test).
TEST_F(BuilderTest, BadReplicaAndOffloadOptionsNameTheirFlag) {
  GatewayOptions o;
  o.model = stories();
  o.journal = "none";
  Result<ReplicaMode> lazy = parse_replica_mode("lazy");
  ASSERT_FALSE(lazy.ok());
  EXPECT_NE(lazy.status().message().find("'lazy'"), std::string::npos) << lazy.status().to_string();
  ASSERT_TRUE(parse_replica_mode("auto").ok());
  o.replica = *parse_replica_mode("auto");
  o.offload_layers = 2;  // with --device cpu
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().field(), "offload-layers");
  o.device = Placement::vulkan();
  o.offload_layers = 5;  // the model has 5 layers: nothing would be offloaded
  b = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().field(), "offload-layers");
  EXPECT_NE(b.status().message().find("[1, 4]"), std::string::npos) << b.status().to_string();
}

// --kv-type: f16 by default, shown per path; the host ledger holds the f16
// plan (less than the f32 one by half the pool); a bad value or q8_0 on a GPU
// placement is refused naming the flag.
TEST_F(BuilderTest, KvTypeDefaultsToF16AndIsCheckedByFlag) {
  GatewayOptions o;
  o.model = stories();
  o.journal = "none";
  o.threads = 1;
  o.ctx = 512;
  uint64_t reserved[2] = {0, 0};
  for (const char* t : {"f16", "f32"}) {
    o.kv_type = *parse_kv_type(t);
    Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    GatewayStatus st = b->gateway->status();
    ASSERT_EQ(st.paths.size(), 1u);
    EXPECT_EQ(st.paths[0].kv_type, t);
    reserved[std::string(t) == "f32"] = b->host_ledger->snapshot().reserved_ours;
  }
  // stories260K: 640 B a token in f16, 1280 in f32; 512 positions x 1 worker:
  // at least the pools' difference, less the f16 attention's 2 KiB conversion
  // tile. (Not more precisely: each plan's overhead allowance is a share of
  // the RSS observed at its start, which grows from one gateway to the next.)
  ASSERT_GT(reserved[1], reserved[0]);
  EXPECT_GE(reserved[1] - reserved[0], 512u * 640u - 4096u) << "the ledgers follow the KV type";
  EXPECT_EQ(GatewayOptions{}.kv_type, KvType::kF16);
  // A type that is not one is refused where the text is parsed (`spillway
  // serve --kv-type f8` names the flag: cli_test).
  Result<KvType> f8 = parse_kv_type("f8");
  ASSERT_FALSE(f8.ok());
  EXPECT_NE(f8.status().message().find("'f8'"), std::string::npos) << f8.status().to_string();
  o.kv_type = KvType::kQ8_0;
  o.device = Placement::vulkan();
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().field(), "kv-type");
  EXPECT_NE(b.status().message().find("CPU only"), std::string::npos) << b.status().to_string();
}

TEST_F(BuilderTest, AutoReplicaFollowsTheRecoveryBudgetAndShowsItsFigures) {
  // CPU first path with a fallback needs a GPU path; without Vulkan the CPU
  // path is built alone and its replica is still chosen.
  GatewayOptions o = gpu_options();
  o.fallback_model = fallback();
  o.warmup = false;
  o.recovery_budget_ms = 0;  // nothing can be made ready in no time: warm
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  GatewayStatus st = b->gateway->status();
  const PathStatus* cpu = path_status(st, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->replica.mode, "warm");
  EXPECT_TRUE(cpu->replica.loaded);
  EXPECT_GE(cpu->replica.load_ms, 0);
  EXPECT_GE(cpu->replica.page_in_ms, 0);
  EXPECT_EQ(cpu->replica.recovery_ms, 0);
  EXPECT_NE(cpu->replica.why.find("auto: load"), std::string::npos) << cpu->replica.why;
  EXPECT_NE(cpu->replica.why.find("recovery budget 0 ms"), std::string::npos) << cpu->replica.why;
  EXPECT_TRUE(cpu->fallback_model);
  EXPECT_EQ(cpu->model, "fallback");
  b->gateway->shutdown(std::chrono::milliseconds(0));

  // A 0.2 MiB model maps and reads in far within a minute: on-demand.
  o.recovery_budget_ms = 60000;
  b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  st = b->gateway->status();
  cpu = path_status(st, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->replica.mode, "on-demand");
  EXPECT_FALSE(cpu->replica.loaded);
  EXPECT_NEAR(cpu->replica.recovery_ms, cpu->replica.load_ms + cpu->replica.page_in_ms, 1e-9);
}

TEST_F(BuilderTest, OnDemandFallbackModelLoadsAtTheFirstRedirectAndIsLabelled) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  GatewayOptions o = gpu_options();
  o.fallback_model = fallback();
  o.replica = ReplicaMode::kOnDemand;
  o.reservation_max_share = 1;  // its co-tenant takes the whole device on purpose
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Gateway& gw = *b->gateway;
  ASSERT_EQ(gw.paths().size(), 2u);
  ASSERT_EQ(gw.paths()[0].name, "gpu");
  {
    const GatewayStatus st = gw.status();
    const PathStatus* cpu = path_status(st, "cpu");
    ASSERT_NE(cpu, nullptr);
    EXPECT_EQ(cpu->replica.mode, "on-demand");
    EXPECT_FALSE(cpu->replica.loaded);
    EXPECT_EQ(cpu->stats.done, 0u) << "an on-demand path is not warmed up (that would load it)";
  }
  // Short requests stay on the GPU with the model itself.
  auto a = gw.submit(request("Once upon a time", 8));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->path->name, "gpu");
  EXPECT_FALSE(a->path->fallback_model);
  EXPECT_EQ(collect(*a->ticket).fin.state, serve::RequestState::kDone);

  // A co-tenant takes the device: the next request goes to the CPU path,
  // whose quote includes loading its replica first.
  ASSERT_TRUE(gw.reserve_cotenant("whisper", 4u << 20, 60).ok());
  Result<Quote> q = gw.quote(request("Once upon a time", 8));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->decision.kind, DecisionKind::kRedirect);
  EXPECT_EQ(q->model, "fallback");
  EXPECT_TRUE(q->fallback_model);
  const double recovery_s = gw.paths()[1].replica->info().recovery_ms / 1e3;
  EXPECT_GE(q->decision.timing.delay_s, recovery_s);

  a = gw.submit(request("Once upon a time", 8));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->path->name, "cpu");
  EXPECT_EQ(a->path->model, "fallback");
  EXPECT_TRUE(a->path->fallback_model);
  EXPECT_EQ(a->ticket->decision().kind, DecisionKind::kRedirect);
  const Collected c = collect(*a->ticket);
  EXPECT_EQ(c.fin.state, serve::RequestState::kDone) << c.fin.status.to_string();
  EXPECT_EQ(c.fin.completion_tokens, 8);
  const GatewayStatus st = gw.status();
  const PathStatus* cpu = path_status(st, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_TRUE(cpu->replica.loaded);
  EXPECT_GE(cpu->replica.loaded_in_ms, 0);
  // Loaded: later requests no longer wait for it.
  EXPECT_EQ(gw.paths()[1].replica->startup_s(), 0);
}

// The default replica mode on a small model is on-demand: its equivalence
// with the GPU path is checked at start by loading it for the check and
// giving it back, so it is a migration target; the verdict is kept in the
// journal and a second start on the same journal takes it without loading.
TEST_F(BuilderTest, AnOnDemandReplicaIsCheckedOnceGivenBackAndItsVerdictKept) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  GatewayOptions o = gpu_options();
  o.kv_type = KvType::kF16;
  o.replica = ReplicaMode::kOnDemand;
  o.journal = (dir_ / "journal.sqlite").string();
  o.reservation_max_share = 1;  // its co-tenant takes the whole device on purpose
  auto check = [&](const char* source) {
    Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    Gateway& gw = *b->gateway;
    ASSERT_EQ(gw.paths().size(), 2u);
    const GatewayStatus st = gw.status();
    const PathStatus* cpu = path_status(st, "cpu");
    ASSERT_NE(cpu, nullptr);
    EXPECT_EQ(cpu->replica.mode, "on-demand");
    EXPECT_FALSE(cpu->replica.loaded) << source << ": the replica was not given back after the check";
    ASSERT_EQ(st.equivalence.size(), 1u);
    EXPECT_TRUE(st.equivalence[0].passed) << st.equivalence[0].detail;
    EXPECT_EQ(st.equivalence[0].source, source);
    EXPECT_GT(st.equivalence[0].checked_ms, 0);
    EXPECT_TRUE(gw.migration_allowed(0, 1).ok()) << gw.migration_allowed(0, 1).to_string();
    // It still serves: a redirected request loads it again.
    ASSERT_TRUE(gw.reserve_cotenant("whisper", 4u << 20, 60).ok());
    auto a = gw.submit(request("Once upon a time", 8));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->path->name, "cpu");
    EXPECT_EQ(collect(*a->ticket).fin.state, serve::RequestState::kDone);
    EXPECT_TRUE(gw.paths()[1].replica->info().loaded);
    b->gateway->shutdown(std::chrono::milliseconds(0));
  };
  check("checked");
  check("stored");
}

// Issue 31: a Q4_K_M file (Q4_K, with Q6_K for the output and half the
// layers' attn_v / ffn_down) passes the equivalence check at start, so the
// CPU path is a migration target: the device's K-type matmuls are bitwise
// the CPU's (vulkan_backend_test), which a Q4_K_M model failed before.
TEST_F(BuilderTest, AQ4KMModelPassesTheEquivalenceCheck) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  modelgen::RandomLlamaSpec s;
  s.n_embd = 256;  // the K types' rows are multiples of 256
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_ctx = 2048;
  s.mix = modelgen::RandomLlamaMix::kQ4_K_M;
  s.vocab_path = stories();
  const std::string path = (dir_ / "q4_k_m.gguf").string();
  ASSERT_TRUE(modelgen::write_random_llama(Env::default_env(), path, s).ok());
  GatewayOptions o = gpu_options();
  o.model = path;
  o.device_memory = uint64_t{64} << 20;
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Gateway& gw = *b->gateway;
  ASSERT_EQ(gw.paths().size(), 2u);
  const GatewayStatus st = gw.status();
  ASSERT_EQ(st.equivalence.size(), 1u);
  EXPECT_TRUE(st.equivalence[0].passed) << st.equivalence[0].detail;
  EXPECT_TRUE(gw.migration_allowed(0, 1).ok()) << gw.migration_allowed(0, 1).to_string();
  b->gateway->shutdown(std::chrono::milliseconds(0));
}

// A mixture of experts on a device whose budget holds its attention, KV and
// head but not its experts: the GPU path is planned with the experts on the
// CPU (vulkan+cpu-experts), says so, and serves the CPU path's greedy text;
// with room for everything it keeps them on the device. +cpu-experts on a
// dense model is refused naming the flag.
TEST_F(BuilderTest, AMixtureWhoseExpertsDoNotFitPutsThemOnTheCpu) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  modelgen::RandomLlamaSpec s;
  s.arch = "qwen3moe";
  s.n_embd = 128;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 256;
  s.n_expert = 16;
  s.n_expert_used = 2;
  s.n_ctx = 2048;
  s.type = gguf::GgmlType::kQ8_0;
  s.vocab_path = stories();  // experts: 2 layers x 16 x 3 x 128 x 256 Q8_0 = 3.3 MiB
  const std::string path = (dir_ / "moe.gguf").string();
  ASSERT_TRUE(modelgen::write_random_llama(Env::default_env(), path, s).ok());
  std::string expected;
  // 2 MiB: every expert on the CPU; 4.75 MiB: layer 1's experts fit beside
  // the KV pool the path wants, layer 0's go (+cpu-experts:1, measured: from
  // 4.5 MiB to past 5); 64 MiB: all on the device. The same text each time.
  const std::map<std::string, std::string> want = {
      {"2MiB", "vulkan+cpu-experts"}, {"4.75MiB", "vulkan+cpu-experts:1"}, {"64MiB", "vulkan"}};
  for (const auto& [budget, placement] : want) {
    SCOPED_TRACE(budget);
    GatewayOptions o = gpu_options();
    o.model = path;
    o.device_memory = *parse_memory_size(budget);
    Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    Gateway& gw = *b->gateway;
    ASSERT_EQ(gw.paths().size(), 2u);
    EXPECT_EQ(gw.paths()[0].placement, placement);
    auto a = gw.submit(request("Once upon a time", 12));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->path->name, "gpu");
    const Collected c = collect(*a->ticket);
    EXPECT_EQ(c.fin.state, serve::RequestState::kDone) << c.fin.status.to_string();
    if (expected.empty()) expected = c.text;
    EXPECT_EQ(c.text, expected);
    b->gateway->shutdown(std::chrono::milliseconds(0));
  }
  GatewayOptions dense = gpu_options();
  dense.device = Placement::vulkan().with_cpu_experts();
  Result<BuiltGateway> refused = build_gateway(Env::default_env(), dense);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("+cpu-experts"), std::string::npos) << refused.status().to_string();
}

TEST_F(BuilderTest, OffloadPathTakesALongPromptTheGpuPoolCannotHold) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  GatewayOptions o = gpu_options();
  o.offload_layers = 1;
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Gateway& gw = *b->gateway;
  ASSERT_EQ(gw.paths().size(), 3u);
  EXPECT_EQ(gw.paths()[1].name, "hybrid");
  EXPECT_EQ(gw.paths()[1].placement, "hybrid:1");
  EXPECT_EQ(gw.paths()[1].role, admission::PathRole::kOffload);
  const GatewayStatus st = gw.status();
  const PathStatus* gpu = path_status(st, "gpu");
  const PathStatus* hybrid = path_status(st, "hybrid");
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(hybrid, nullptr);
  EXPECT_EQ(hybrid->kv_blocks_total, 32) << "one full context of 512 positions";
  EXPECT_LT(gpu->kv_blocks_total, 17) << "the long prompt below must not fit the GPU pool";
  EXPECT_EQ(hybrid->replica.mode, "shared");
  // The same file on the CPU path: the hybrid path runs CPU layers from the
  // mapping, so it stays shared and resident.
  EXPECT_EQ(path_status(st, "cpu")->replica.mode, "shared");

  auto a = gw.submit(request(long_prompt(), 16));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->path->name, "hybrid");
  EXPECT_EQ(a->ticket->decision().kind, DecisionKind::kOffload);
  EXPECT_TRUE(a->ticket->decision().degraded());
  EXPECT_NE(a->ticket->decision().reason.find("its whole KV budget is"), std::string::npos)
      << a->ticket->decision().reason;
  const Collected c = collect(*a->ticket);
  EXPECT_EQ(c.fin.state, serve::RequestState::kDone) << c.fin.status.to_string();
  EXPECT_EQ(c.fin.completion_tokens, 16);

  // The device plan holds both paths' KV: the ledger never went over.
  ASSERT_NE(b->device_ledger, nullptr);
  const admission::LedgerSnapshot l = b->device_ledger->snapshot();
  EXPECT_LE(l.used, l.limit);
}

TEST_F(BuilderTest, MmapReplicaOfTheSameFileServesTheRedirect) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << why;
  GatewayOptions o = gpu_options();
  o.replica = ReplicaMode::kMmap;
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Gateway& gw = *b->gateway;
  const GatewayStatus st = gw.status();
  const PathStatus* cpu = path_status(st, "cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->replica.mode, "mmap");
  EXPECT_FALSE(cpu->fallback_model);
  EXPECT_EQ(cpu->replica.recovery_ms, cpu->replica.page_in_ms);
  // Both paths serve the same model: greedy text agrees across them up to
  // the backends' float tolerance, so only the path and the label differ.
  auto a = gw.submit(request(long_prompt(), 8));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->path->name, "cpu") << a->ticket->decision().reason;
  EXPECT_EQ(a->path->model, "stories260K");
  EXPECT_EQ(collect(*a->ticket).fin.state, serve::RequestState::kDone);
}

}  // namespace
}  // namespace spw::gateway
