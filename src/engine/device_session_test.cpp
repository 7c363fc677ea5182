#include "engine/device_session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <utility>

#include "engine/device_test_util.h"
#include "engine/engine_test_util.h"
#include "engine/generate.h"

namespace spw {
namespace {

std::vector<TokenId> greedy_tokens(Session& s, const Model& m, int n) {
  GenerateOptions go;
  go.max_tokens = n;
  go.sampler.temperature = 0.0f;
  go.ignore_eos = true;
  auto r = generate(s, m.tokenizer().encode("Once upon a time", true), go);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->tokens : std::vector<TokenId>{};
}

DeviceSessionOptions options_for(const std::string& spec, uint64_t budget = 0) {
  DeviceSessionOptions o;
  o.device = Placement::parse(spec).value();
  o.device_memory_bytes = budget;
  o.n_ctx = 128;
  return o;
}

// The reference: greedy tokens of a CPU session.
std::vector<TokenId> cpu_greedy_tokens(const std::shared_ptr<const Model>& model, int n) {
  auto cpu = open_device_session(model, options_for("cpu"));
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  return cpu.ok() ? greedy_tokens(*cpu->session, *model, n) : std::vector<TokenId>{};
}

TEST(DeviceSessionTest, CpuPlacement) {
  auto model = testing::stories();
  auto ds = open_device_session(model, options_for("cpu"));
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->placement, "cpu");
  EXPECT_NE(ds->cpu, nullptr);
  EXPECT_EQ(ds->vulkan, nullptr);
  EXPECT_EQ(ds->session->n_ctx(), 128);
}

TEST(DeviceSessionTest, VulkanAndHybridGiveTheCpuTokens) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();
  const std::vector<TokenId> expected = cpu_greedy_tokens(model, 16);
  ASSERT_EQ(expected.size(), 16u);
  for (const std::string spec : {"vulkan", "hybrid:2", "hybrid:0", "hybrid:99"}) {
    auto ds = open_device_session(model, options_for(spec));
    ASSERT_TRUE(ds.ok()) << spec << ": " << ds.status().to_string();
    EXPECT_EQ(greedy_tokens(*ds->session, *model, 16), expected) << spec << " on " << ds->placement;
    if (spec == "hybrid:2") {
      EXPECT_NE(ds->placement.find("layers 0-1"), std::string::npos) << ds->placement;
      EXPECT_NE(ds->placement.find("2-4 cpu"), std::string::npos) << ds->placement;
      EXPECT_NE(ds->cpu, nullptr);
      EXPECT_NE(ds->vulkan, nullptr);
    }
    if (spec == "hybrid:0") {
      EXPECT_EQ(ds->placement, "cpu");  // N = 0: nothing on the GPU
    }
    if (spec == "hybrid:99") {
      EXPECT_EQ(ds->cpu, nullptr);  // N clamped to n_layer
    }
  }
}

// Phi-3's fused tensors (Q, K, V and gate, up as row ranges of attn_qkv and
// ffn_up) with partial RoPE, and the mixtures of experts (their experts on
// the device, or on the host with +cpu-experts: vulkan_backend.h), give the
// same greedy tokens on every placement; +cpu-experts on a dense model is
// refused by name.
TEST(DeviceSessionTest, ArchitecturesGiveTheCpuTokensOnVulkanAndHybrid) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto phi3 = testing::small_spec(gguf::GgmlType::kQ8_0);
  phi3.arch = "phi3";
  phi3.rope_dims = 12;
  auto qwen3moe = testing::small_spec(gguf::GgmlType::kQ8_0);
  qwen3moe.arch = "qwen3moe";
  qwen3moe.n_expert = 8;
  qwen3moe.n_expert_used = 2;
  qwen3moe.n_ff_exp = 64;
  auto mixtral = testing::small_spec(gguf::GgmlType::kQ4_K);
  mixtral.n_embd = mixtral.n_ff = 256;
  mixtral.n_expert = 4;
  mixtral.n_expert_used = 2;
  for (const auto& spec : {phi3, qwen3moe, mixtral, testing::gemma_spec("gemma2", gguf::GgmlType::kQ8_0),
                           testing::gemma_spec("gemma3")}) {
    auto model = testing::random_model(spec);
    ASSERT_NE(model, nullptr) << spec.arch;
    const std::vector<TokenId> expected = cpu_greedy_tokens(model, 12);
    ASSERT_EQ(expected.size(), 12u);
    std::vector<std::string> placements = {"vulkan", "hybrid:1"};
    if (spec.n_expert > 0) {
      placements.insert(placements.end(), {"vulkan+cpu-experts", "hybrid:1+cpu-experts", "vulkan+cpu-experts:1"});
    }
    for (const std::string& placement : placements) {
      auto ds = open_device_session(model, options_for(placement));
      ASSERT_TRUE(ds.ok()) << placement << ": " << ds.status().to_string();
      EXPECT_EQ(greedy_tokens(*ds->session, *model, 12), expected)
          << spec.arch << " " << placement << " on " << ds->placement;
      if (placement.ends_with("+cpu-experts")) {
        EXPECT_NE(ds->placement.find("experts on the cpu"), std::string::npos) << ds->placement;
      }
      if (placement.ends_with("+cpu-experts:1")) {
        EXPECT_NE(ds->placement.find("experts of layers 0 on the cpu"), std::string::npos) << ds->placement;
      }
    }
  }
  auto dense = open_device_session(testing::stories(), options_for("vulkan+cpu-experts"));
  ASSERT_FALSE(dense.ok());
  EXPECT_EQ(dense.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dense.status().message().find("no experts"), std::string::npos) << dense.status().to_string();
}

// Gemma's sliding layers in the window plane on the device (a ring of
// blocks per session, kv_cache.h): 70 greedy tokens with a window of 4,
// blocks of 4 and ubatches of 8 (so the prompt and the decode slide the
// window many blocks on) give the CPU's tokens on vulkan and hybrid:2, and
// the device's sliding-layer buffers hold the ring's blocks only.
TEST(DeviceSessionTest, GemmaWindowPlaneGivesTheCpuTokens) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  for (const char* arch : {"gemma2", "gemma3"}) {
    auto model = testing::random_model(testing::gemma_spec(arch, gguf::GgmlType::kQ8_0));
    ASSERT_NE(model, nullptr) << arch;
    auto opts = [](const std::string& placement) {
      DeviceSessionOptions o = options_for(placement);
      o.n_ctx = 128;
      o.kv_block_tokens = 4;
      o.n_ubatch = 8;
      return o;
    };
    auto cpu = open_device_session(model, opts("cpu"));
    ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
    const std::vector<TokenId> expected = greedy_tokens(*cpu->session, *model, 70);
    ASSERT_EQ(expected.size(), 70u);
    for (const std::string placement : {"vulkan", "hybrid:2"}) {
      auto ds = open_device_session(model, opts(placement));
      ASSERT_TRUE(ds.ok()) << placement << ": " << ds.status().to_string();
      EXPECT_EQ(greedy_tokens(*ds->session, *model, 70), expected) << arch << " " << placement;
    }
  }
}

// The serving layout on a GPU: N sessions over one VulkanBackend (weights
// uploaded once) and one pool per stage, run at the same time on N threads,
// each giving the CPU's greedy tokens; the pools hold every session's blocks.
TEST(DeviceSessionTest, GroupSharesOneBackendAndPoolPerStageAcrossThreads) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();
  const std::vector<TokenId> expected = cpu_greedy_tokens(model, 16);
  for (const std::string spec : {"vulkan", "hybrid:3"}) {
    SCOPED_TRACE(spec);
    SessionGroupOptions o;
    o.device = Placement::parse(spec).value();
    o.n_sessions = 3;
    o.n_ctx = 64;
    auto g = open_session_group(model, o);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_NE(g->vulkan, nullptr);
    EXPECT_EQ(g->pools.size(), spec == "vulkan" ? 1u : 2u);
    EXPECT_EQ(g->n_gpu_layers, spec == "vulkan" ? 5 : 3);
    EXPECT_TRUE(g->full_pool);
    for (const auto& p : g->pools) EXPECT_EQ(p->n_blocks(), 3 * 4) << "3 sessions x 64 positions / 16";
    const uint64_t weights_once = g->vulkan->memory_stats().used_by_category[0];
    std::vector<std::vector<TokenId>> got(g->sessions.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < g->sessions.size(); ++i) {
      threads.emplace_back([&, i] { got[i] = greedy_tokens(*g->sessions[i], *model, 16); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected) << "session " << i;
    EXPECT_EQ(g->vulkan->memory_stats().used_by_category[0], weights_once) << "weights uploaded once";
    for (const auto& p : g->pools) EXPECT_EQ(p->blocks_in_use(), 3 * 2) << "each session holds 21 positions";
  }
  SessionGroupOptions bad;
  bad.n_sessions = 0;
  EXPECT_EQ(open_session_group(model, bad).status().code(), StatusCode::kInvalidArgument);
  bad.n_sessions = 2;
  EXPECT_EQ(open_device_session(model, bad).status().code(), StatusCode::kInvalidArgument) << "one session only";
  bad = {};
  bad.device = Placement::parse("vulkan").value();
  EXPECT_EQ(session_group_host_pool(*model, bad).status().code(), StatusCode::kInvalidArgument)
      << "all layers on Vulkan: no host stage";
}

// SessionGroupOptions::kv_type reaches every stage's pool; the KV bytes
// follow it; a type a stage cannot store is refused by name.
TEST(DeviceSessionTest, KvTypeReachesEveryStagePool) {
  auto model = testing::stories();
  SessionGroupOptions o;
  o.n_sessions = 2;
  o.n_ctx = 64;
  o.kv_type = KvType::kF16;
  auto cpu = open_session_group(model, o);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  ASSERT_EQ(cpu->pools.size(), 1u);
  EXPECT_EQ(cpu->pools[0]->type(), KvType::kF16);
  EXPECT_EQ(cpu->pools[0]->bytes_per_token(), 640u);  // 5 layers x K,V x 32 x 2 bytes
  EXPECT_EQ(cpu->sessions[0]->kv_type(), KvType::kF16);
  auto host = session_group_host_pool(*model, o);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->type, KvType::kF16);
  // stories260K's head_dim is 8: no whole Q8_0 blocks per head.
  o.kv_type = KvType::kQ8_0;
  auto q8 = open_session_group(model, o);
  ASSERT_FALSE(q8.ok());
  EXPECT_EQ(q8.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q8.status().message().find("head_dim"), std::string::npos) << q8.status().to_string();
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  o.kv_type = KvType::kF16;
  o.device = Placement::parse("hybrid:3").value();
  auto g = open_session_group(model, o);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->pools.size(), 2u);
  for (const auto& p : g->pools) EXPECT_EQ(p->type(), KvType::kF16);
  EXPECT_EQ(g->pools[0]->device_storage()->bytes(), 3u * 2 * 8 * 16 * 32 * 2) << "3 layers, K and V, 8 blocks";
  EXPECT_EQ(greedy_tokens(*g->sessions[0], *model, 16),
            greedy_tokens(*cpu->sessions[0], *model, 16)) << "hybrid f16 = cpu f16";
  // A model whose head_dim allows Q8_0 on the CPU is still refused on Vulkan.
  auto spec = testing::small_spec(gguf::GgmlType::kQ8_0);
  spec.n_embd = 128;
  auto m32 = testing::random_model(spec);
  ASSERT_NE(m32, nullptr);
  o.kv_type = KvType::kQ8_0;
  o.device = Placement::parse("vulkan").value();
  auto vq = open_session_group(m32, o);
  ASSERT_FALSE(vq.ok());
  EXPECT_EQ(vq.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(vq.status().message().find("q8_0"), std::string::npos) << vq.status().to_string();
}

TEST(DeviceSessionTest, BudgetTooSmallForTheWeightsIsResourceExhausted) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();  // 1.1 MB of weights
  auto ds = open_device_session(model, options_for("vulkan", 256 * 1024));
  if (ds.ok()) {
    // Weights upload lazily at the first eval; the budget must refuse them then.
    auto r = ds->session->eval(model->tokenizer().encode("Once", true));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  } else {
    EXPECT_EQ(ds.status().code(), StatusCode::kResourceExhausted) << ds.status().to_string();
  }
}

// Echo with logprobs computes every prompt row's logits on the placement
// that runs the head: the entries on Vulkan and hybrid equal the CPU's
// (logits agree to float rounding, the ids and order of the alternatives
// exactly).
TEST(DeviceSessionTest, PromptLogprobsAgreeOnCpuAndVulkan) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();
  const std::vector<TokenId> prompt =
      model->tokenizer().encode("Once upon a time, there was a little girl named Lily. She", true);
  auto entries_on = [&](const std::string& spec) {
    auto ds = open_device_session(model, options_for(spec));
    EXPECT_TRUE(ds.ok()) << spec << ": " << ds.status().to_string();
    if (!ds.ok()) return std::vector<TokenLogprobs>{};
    GenerateOptions go;
    go.max_tokens = 4;
    go.sampler.temperature = 0.0f;
    go.prompt_logprobs = 5;
    auto r = generate(*ds->session, prompt, go);
    EXPECT_TRUE(r.ok()) << spec << ": " << r.status().to_string();
    return r.ok() ? r->prompt_logprobs : std::vector<TokenLogprobs>{};
  };
  const std::vector<TokenLogprobs> cpu = entries_on("cpu");
  ASSERT_EQ(cpu.size(), prompt.size());
  for (const std::string spec : {"vulkan", "hybrid:2"}) {
    const std::vector<TokenLogprobs> dev = entries_on(spec);
    ASSERT_EQ(dev.size(), cpu.size()) << spec;
    for (size_t i = 1; i < cpu.size(); ++i) {
      EXPECT_NEAR(dev[i].token.logprob, cpu[i].token.logprob, 1e-4) << spec << " token " << i;
      ASSERT_EQ(dev[i].top.size(), cpu[i].top.size()) << spec;
      for (size_t k = 0; k < cpu[i].top.size(); ++k) {
        EXPECT_NEAR(dev[i].top[k].logprob, cpu[i].top[k].logprob, 1e-4) << spec << " token " << i << " alt " << k;
      }
      EXPECT_EQ(dev[i].top[0].id, cpu[i].top[0].id) << spec << " token " << i;
    }
    EXPECT_TRUE(std::isnan(dev[0].token.logprob));
  }
}


// OpenAI's n > 1 on a device pool: Session::fork shares the prompt's full
// blocks (no byte copy on the device) and recomputes the positions after
// them; the choices equal lone runs on the same placement, and the device
// pool holds the shared blocks once.
TEST(DeviceSessionTest, ChoicesOnDevicePoolsShareThePromptAndEqualLoneRuns) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  auto model = testing::stories();
  std::string text;
  std::vector<TokenId> long_prompt;
  while (long_prompt.size() < 40) {
    text += "Once upon a time there was a little girl named Lily. ";
    long_prompt = model->tokenizer().encode(text, true);
  }
  // 40: 2 full blocks of 16 and 8 positions; 32: 2 full blocks, the last
  // holding the position a choice evaluates again. {length, peak blocks}:
  // choice 0 ceil((n + 12) / 16), each other from block (n - 1) / 16 on.
  for (const auto& [n_prompt, want_peak] : {std::pair{40, 4 + 2 + 2}, std::pair{32, 3 + 2 + 2}})
  for (const std::string spec : {"vulkan", "hybrid:2"}) {
    const std::vector<TokenId> prompt(long_prompt.begin(), long_prompt.begin() + n_prompt);
    SessionGroupOptions o = options_for(spec);
    o.kv_blocks = 24;
    auto g = open_session_group(model, o);
    ASSERT_TRUE(g.ok()) << spec << ": " << g.status().to_string();
    Session& s = *g->sessions[0];
    KvPool& dev_pool = *g->pools.front();
    ASSERT_FALSE(dev_pool.on_host()) << spec;
    GenerateOptions go;
    go.max_tokens = 12;
    go.sampler.temperature = 0.0f;
    go.reserve_kv = true;
    auto lone = generate(s, prompt, go);
    ASSERT_TRUE(lone.ok()) << spec << ": " << lone.status().to_string();
    ASSERT_TRUE(s.truncate(0).ok());
    int32_t peak = 0;
    auto three = generate_choices(s, prompt, go, 3, [&](int32_t, std::string_view, TokenId, std::span<const TokenLogprobs>) {
      peak = std::max(peak, dev_pool.blocks_in_use());
      return true;
    });
    ASSERT_TRUE(three.ok()) << spec << ": " << three.status().to_string();
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*three)[i].tokens, lone->tokens) << spec << " choice " << i;
    EXPECT_EQ(peak, want_peak) << spec << " prompt " << n_prompt;
    ASSERT_TRUE(s.truncate(0).ok());
    EXPECT_EQ(dev_pool.blocks_in_use(), 0) << spec;
    // Seeded: choice i is the lone run with seed + i.
    go.sampler.temperature = 1.0f;
    go.sampler.seed = 5;
    auto seeded = generate_choices(s, prompt, go, 3);
    ASSERT_TRUE(seeded.ok()) << spec;
    for (int32_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(s.truncate(0).ok());
      GenerateOptions one = go;
      one.sampler.seed = choice_seed(5, i);
      auto r = generate(s, prompt, one);
      ASSERT_TRUE(r.ok()) << spec;
      EXPECT_EQ((*seeded)[static_cast<size_t>(i)].tokens, r->tokens) << spec << " choice " << i;
    }
  }
}

}  // namespace
}  // namespace spw
