// Estimator's GPU side vs what the Vulkan backend's DeviceAllocator really
// allocates (VulkanBackend::memory_stats() peaks by category), on whatever
// Vulkan device is present (lavapipe in CI). Each case opens a device session
// (vulkan or hybrid:N), prefills, decodes two tokens and then runs one full
// ubatch that ends at position n_ctx: the worst case the estimate sizes for
// (the attention scores of a ubatch against the whole context).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "admission/estimator.h"
#include "admission/estimator_test_util.h"
#include "backend/vulkan/device_spec.h"
#include "backend/vulkan/vulkan_backend.h"
#include "engine/device_session.h"
#include "model/model.h"
#include "tools/modelgen/random_llama.h"

namespace spw::admission {
namespace {

std::string src(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }

// Empty when a Vulkan device exists, else why not.
std::string vulkan_missing() {
  auto devs = list_vulkan_devices();
  if (!devs.ok()) return devs.status().to_string();
  if (devs->empty()) return "no Vulkan device";
  return "";
}

std::shared_ptr<const Model> generated(gguf::GgmlType type, uint32_t n_embd, uint32_t n_ff, uint32_t n_head,
                                       uint32_t n_head_kv, uint32_t n_layer, bool tied) {
  return testing::generated(testing::spec(type, n_embd, n_ff, n_head, n_head_kv, n_layer, tied, /*seed=*/5));
}

std::map<std::string, double>& worst() {
  static std::map<std::string, double> w;
  return w;
}

// Within `tolerance` of the measurement and never below it by more than the
// allowance; records the relative error for the summary.
void expect_close(const std::string& cat, const std::string& what, uint64_t est, uint64_t allowance, uint64_t measured,
                  double tolerance) {
  ASSERT_GT(measured, 0u) << cat << " " << what;
  const double err = (static_cast<double>(est) - static_cast<double>(measured)) / static_cast<double>(measured);
  auto [it, fresh] = worst().emplace(cat, err);
  if (!fresh && std::abs(err) > std::abs(it->second)) it->second = err;
  EXPECT_LE(std::abs(err), tolerance) << cat << " " << what << ": estimate " << est << " vs measured " << measured;
  EXPECT_GE(est + allowance, measured) << cat << " " << what << ": estimate " << est << " + allowance " << allowance
                                       << " below measured " << measured;
}

struct Case {
  int32_t n_ctx;
  int32_t n_ubatch;
  int32_t gpu_layers;  // 0 = vulkan (all layers + head), else hybrid:N
  int32_t block_tokens = 16;
  bool logits_all = false;
  KvType kv_type = KvType::kF32;
  bool cpu_experts = false;  // +cpu-experts
  int32_t cpu_expert_layers = 0;  // with cpu_experts: +cpu-experts:K
};

std::vector<TokenId> tokens(int n, int n_vocab, int salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + 11 + salt) % n_vocab;
  return t;
}

void run_case(const std::string& name, const std::shared_ptr<const Model>& model, const Case& c) {
  const auto& hp = model->hparams();
  const std::string experts = !c.cpu_experts ? ""
                              : "+cpu-experts" + (c.cpu_expert_layers > 0 ? ":" + std::to_string(c.cpu_expert_layers)
                                                                          : std::string());
  const std::string what = name + " " + (c.gpu_layers > 0 ? "hybrid:" + std::to_string(c.gpu_layers) : "vulkan") +
                           experts +
                           " ctx=" + std::to_string(c.n_ctx) + " ub=" + std::to_string(c.n_ubatch) +
                           " bt=" + std::to_string(c.block_tokens) + (c.logits_all ? " all-logits" : "") +
                           " kv=" + std::string(kv_type_name(c.kv_type));
  SCOPED_TRACE(what);
  DeviceSessionOptions o;
  auto spec = Placement::parse((c.gpu_layers > 0 ? "hybrid:" + std::to_string(c.gpu_layers) : "vulkan") + experts);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  o.device = *spec;
  o.n_ctx = c.n_ctx;
  o.n_ubatch = c.n_ubatch;
  o.kv_block_tokens = c.block_tokens;
  o.kv_type = c.kv_type;
  const auto t0 = std::chrono::steady_clock::now();
  auto ds = open_device_session(model, o);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  ASSERT_NE(ds->vulkan, nullptr);
  Session& s = *ds->session;

  // Prefill, two decode steps, then one full ubatch ending at n_ctx.
  const int32_t prefill = c.n_ctx - c.n_ubatch - 2;
  ASSERT_GE(prefill, 1);
  auto eval = [&](int n, int salt) -> Status {
    const auto t = tokens(n, hp.n_vocab, salt);
    if (c.logits_all) return s.eval_all_logits(t).status();
    return s.eval(t).status();
  };
  ASSERT_TRUE(eval(prefill, 0).ok());
  ASSERT_TRUE(eval(1, 1).ok());
  ASSERT_TRUE(eval(1, 2).ok());
  ASSERT_TRUE(eval(c.n_ubatch, 3).ok());
  ASSERT_EQ(s.n_past(), c.n_ctx);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const DeviceMemoryStats ms = ds->vulkan->memory_stats();
  const auto peak = [&](MemoryCategory k) { return ms.peak_by_category[static_cast<size_t>(k)]; };

  Plan p;
  p.placement = *spec;  // the placement the session ran on, as parsed
  p.n_ctx = c.n_ctx;
  p.n_batch = c.n_ctx;
  p.n_ubatch = c.n_ubatch;
  p.kv_block_tokens = c.block_tokens;
  p.logits_all = c.logits_all;
  p.kv_type = c.kv_type;
  EstimatorConfig cfg;
  const VulkanDeviceInfo& info = ds->vulkan->device_info();
  cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(info);
  auto e = estimate(model->file(), p, cfg);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const DeviceEstimate& g = e->gpu();
  ASSERT_TRUE(g.used);

  std::printf("%-44s weights %8llu/%8llu  kv %8llu/%8llu  scratch %8llu/%8llu  staging %7llu/%7llu  (%.1f s)\n",
              what.c_str(), static_cast<unsigned long long>(g.weights.bytes),
              static_cast<unsigned long long>(peak(MemoryCategory::kWeights)),
              static_cast<unsigned long long>(g.kv.bytes), static_cast<unsigned long long>(peak(MemoryCategory::kKv)),
              static_cast<unsigned long long>(g.scratch.bytes),
              static_cast<unsigned long long>(peak(MemoryCategory::kScratch)),
              static_cast<unsigned long long>(g.gpu_terms.staging),
              static_cast<unsigned long long>(peak(MemoryCategory::kStaging)), secs);
  EXPECT_EQ(g.weights.bytes, peak(MemoryCategory::kWeights)) << "weights are exact";
  EXPECT_EQ(g.kv.bytes, peak(MemoryCategory::kKv)) << "the KV buffers are exact, whatever their type";
  expect_close("weights", what, g.weights.bytes, g.weights.allowance, peak(MemoryCategory::kWeights), 0.0);
  expect_close("kv", what, g.kv.bytes, g.kv.allowance, peak(MemoryCategory::kKv), 0.10);
  expect_close("scratch", what, g.scratch.bytes, g.scratch.allowance, peak(MemoryCategory::kScratch), 0.10);
  expect_close("staging", what, g.gpu_terms.staging, 0, peak(MemoryCategory::kStaging), 0.10);
  // Staging is the GPU's whole overhead unless a fixed one is configured.
  EXPECT_EQ(g.overhead.bytes, g.gpu_terms.staging);
  EXPECT_EQ(g.logits.bytes, 0u) << "device logits are scratch";
  // The session's requests add no GPU scratch: it is resident in the backend.
  auto r = e->request(c.n_ctx / 2, 8);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->scratch[static_cast<int>(DeviceKind::kGpu)].bytes, 0u);
}

TEST(EstimatorVulkan, GpuCategoriesMatchTheDeviceAllocator) {
  const std::string why = vulkan_missing();
  if (!why.empty()) GTEST_SKIP() << "no Vulkan device: " << why;
  using gguf::GgmlType;

  auto stories = Model::load(Env::default_env(), src("models/stories260K.gguf"));
  ASSERT_TRUE(stories.ok()) << stories.status().to_string();
  for (const Case& c : {Case{128, 48, 0}, Case{256, 32, 3}, Case{128, 16, 1, 8}, Case{96, 24, 0, 16, true}})
    run_case("stories260K", *stories, c);

  // F16 KV (the server's default): the device buffers and the host stage's
  // pool and conversion tile follow it.
  for (const Case& c : {Case{128, 48, 0, 16, false, KvType::kF16}, Case{256, 32, 3, 16, false, KvType::kF16}})
    run_case("stories260K", *stories, c);

  auto f16 = generated(GgmlType::kF16, 64, 96, 4, 2, 2, false);  // GQA 2:1
  ASSERT_NE(f16, nullptr);
  for (const Case& c : {Case{256, 64, 0}, Case{128, 32, 1}, Case{128, 32, 1, 16, false, KvType::kF16}})
    run_case("small-F16-gqa", f16, c);

  auto q8 = generated(GgmlType::kQ8_0, 64, 128, 4, 1, 2, false);  // GQA 4:1
  ASSERT_NE(q8, nullptr);
  for (const Case& c : {Case{200, 48, 0, 32}, Case{160, 16, 1}}) run_case("small-Q8_0-gqa", q8, c);

  auto f32 = generated(GgmlType::kF32, 128, 256, 8, 8, 3, true);  // tied head
  ASSERT_NE(f32, nullptr);
  for (const Case& c : {Case{128, 64, 0}, Case{160, 32, 2}}) run_case("wide-F32-tied", f32, c);

  auto qwen3 = testing::generated(
      testing::as_arch(testing::spec(GgmlType::kQ8_0, 64, 128, 4, 2, 2, false, 5), "qwen3", 32));  // Q wider than n_embd
  ASSERT_NE(qwen3, nullptr);
  for (const Case& c : {Case{128, 32, 0}, Case{128, 16, 1}}) run_case("qwen3-Q8_0-hd32", qwen3, c);
  auto qwen2 = testing::generated(testing::as_arch(testing::spec(GgmlType::kF32, 64, 96, 4, 2, 2, false, 5), "qwen2"));
  ASSERT_NE(qwen2, nullptr);
  run_case("qwen2-F32", qwen2, Case{128, 32, 0});
  auto phi3 = testing::generated(testing::as_arch(testing::spec(GgmlType::kQ8_0, 64, 128, 4, 2, 2, false, 5), "phi3"));
  ASSERT_NE(phi3, nullptr);
  run_case("phi3-Q8_0", phi3, Case{128, 32, 1});
  // Gemma: the post-norms' buffer, and Gemma 3's second RoPE table.
  for (const char* arch : {"gemma2", "gemma3"}) {
    auto sp = testing::as_arch(testing::spec(GgmlType::kQ8_0, 64, 128, 4, 2, 6, true, 5), arch, 32);
    sp.sliding_window = 8;
    auto gemma = testing::generated(sp);
    ASSERT_NE(gemma, nullptr) << arch;
    for (const Case& c : {Case{128, 32, 0}, Case{96, 16, 3}}) run_case(std::string(arch) + "-Q8_0", gemma, c);
  }
  // A mixture of experts: experts on the device (router, routing table and
  // gathered rows' buffers), or with +cpu-experts attention, norms and head
  // on the device and the router and experts on the host (no device FFN
  // buffers either). Each case opens its own backend.
  auto moe = testing::generated(
      testing::as_moe(testing::spec(GgmlType::kQ8_0, 64, 128, 4, 2, 2, false, 5), "qwen3moe", 8, 2, 64));
  ASSERT_NE(moe, nullptr);
  for (const Case& c : {Case{128, 32, 0}, Case{96, 16, 1}, Case{128, 32, 0, 16, false, KvType::kF32, true},
                        Case{96, 16, 1, 16, false, KvType::kF32, true},
                        Case{128, 32, 0, 16, false, KvType::kF32, true, 1}})  // layer 0's experts on the host
    run_case("qwen3moe-Q8_0", moe, c);

  // Low-bit weights on the device: a Q4_K_M mix (Q4_K, Q6_K attn_v / ffn_down /
  // head: a quantised head sizes xq/xd for its rows) and a legacy type.
  auto q4km_spec = testing::spec(GgmlType::kF32, 256, 512, 4, 2, 2, false, 5);
  q4km_spec.mix = modelgen::RandomLlamaMix::kQ4_K_M;
  auto q4km = testing::generated(q4km_spec);
  ASSERT_NE(q4km, nullptr);
  for (const Case& c : {Case{128, 32, 0}, Case{96, 16, 1}, Case{64, 8, 0, 16, true}}) run_case("small-Q4_K_M", q4km, c);
  auto q5_1 = generated(GgmlType::kQ5_1, 64, 128, 4, 2, 2, false);
  ASSERT_NE(q5_1, nullptr);
  run_case("small-Q5_1", q5_1, Case{128, 32, 0});

  // Q8_0 KV is CPU only: a plan with a GPU stage is refused by name.
  {
    Plan p;
    p.placement = Placement::parse("hybrid:1").value();
    p.n_ctx = 128;
    p.n_batch = 128;
    p.kv_type = KvType::kQ8_0;
    auto wide = generated(GgmlType::kQ8_0, 128, 256, 4, 2, 2, false);  // head_dim 32
    ASSERT_NE(wide, nullptr);
    auto e = estimate(wide->file(), p);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("Vulkan"), std::string::npos) << e.status().to_string();
    p.placement = Placement::cpu();
    EXPECT_TRUE(estimate(wide->file(), p).ok());
  }

  for (const auto& [cat, err] : worst())
    std::printf("worst relative error gpu %-10s %+.2f%%\n", cat.c_str(), 100 * err);
}

}  // namespace
}  // namespace spw::admission
