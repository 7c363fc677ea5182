// The rate prior's formula with known numbers, the shares an estimate gives,
// and the bandwidth probe's contract (its real-clock figure is checked for
// sanity only; prior_reality_test in gateway/ compares the prior with what a
// path then does).
#include "admission/prior.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "admission/bandwidth.h"
#include "core/sim_env.h"
#include "tools/modelgen/random_llama.h"

namespace spw::admission {
namespace {

// A share of `weight` bytes a step, `kv` bytes a position, at `bw` bytes/s.
StreamShare share(DeviceKind d, uint64_t weight, uint64_t kv, double bw, double compute_s = 0) {
  StreamShare s;
  s.device = d;
  s.weight_bytes = weight;
  s.kv_bytes_per_position = kv;
  s.bandwidth = bw;
  s.compute_s = compute_s;
  return s;
}

TEST(PriorRates, DecodeIsBandwidthOverBytesPlusTheStepOverhead) {
  // 1 GB of weights at 20 GB/s: 50 ms a step, plus 1 ms overhead.
  PriorConstants c;
  c.step_overhead_s = 1e-3;
  c.prefill_per_decode = 8.0;
  c.decode_bandwidth_share = 1.0;
  std::vector<StreamShare> shares{share(DeviceKind::kHost, 1'000'000'000, 200'000, 20e9)};
  Result<PathRates> r = prior_rates(shares, c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->decode_tps, 1.0 / 0.051, 1e-9);
  // Each earlier position adds its K+V read: 200 kB / 20 GB/s = 10 us.
  EXPECT_NEAR(r->decode_s_per_pos, 10e-6, 1e-15);
  EXPECT_NEAR(r->prefill_tps, 8.0 / 0.051, 1e-9);
  EXPECT_EQ(r->prefill_s_per_pos, 0.0);
  EXPECT_FALSE(r->measured);
  EXPECT_EQ(r->samples, 0u);
  // 100 generated tokens after a 1000-token prompt: 100 x 51 ms plus the
  // positions 1000..1099 x 10 us = 5.1 s + 1.0995 s.
  EXPECT_NEAR(decode_s(*r, 1000, 0, 100), 5.1 + 10e-6 * (1000 * 100 + 99 * 100 / 2.0), 1e-9);
  // Decode's reads get 80% of the probe's bandwidth: 62.5 ms + 1 ms a step.
  c.decode_bandwidth_share = 0.8;
  r = prior_rates(shares, c);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(1.0 / r->decode_tps, 0.0635, 1e-12);
  EXPECT_NEAR(r->decode_s_per_pos, 12.5e-6, 1e-15);
}

TEST(PriorRates, SharesOnTwoMemoriesAddTheirStreamingTimes) {
  // Hybrid: 300 MB on a 300 GB/s device (1 ms), 500 MB on 25 GB/s host (20 ms).
  PriorConstants c;
  c.step_overhead_s = 0;
  c.decode_bandwidth_share = 1.0;
  std::vector<StreamShare> shares{share(DeviceKind::kGpu, 300'000'000, 3000, 300e9),
                                  share(DeviceKind::kHost, 500'000'000, 5000, 25e9)};
  Result<PathRates> r = prior_rates(shares, c);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(1.0 / r->decode_tps, 0.021, 1e-12);
  EXPECT_NEAR(r->decode_s_per_pos, 3000 / 300e9 + 5000 / 25e9, 1e-18);
}

TEST(PriorRates, AComputeBoundShareTakesItsKernelTimeNotItsStreamingTime) {
  // 50 MB at 25 GB/s streams in 2 ms; its Q4_K kernels need 5 ms: 5 ms.
  PriorConstants c;
  c.step_overhead_s = 0;
  c.decode_bandwidth_share = 1.0;
  std::vector<StreamShare> shares{share(DeviceKind::kHost, 50'000'000, 0, 25e9, 5e-3)};
  Result<PathRates> r = prior_rates(shares, c);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(1.0 / r->decode_tps, 5e-3, 1e-12);
  shares[0].compute_s = 1e-3;  // below the streaming: the streaming binds
  EXPECT_NEAR(1.0 / prior_rates(shares, c)->decode_tps, 2e-3, 1e-12);
}

TEST(KernelSeconds, PriceEachTypesBytesAtItsRateOverTheThreads) {
  const auto q4k = static_cast<uint32_t>(gguf::GgmlType::kQ4_K);
  const auto q6k = static_cast<uint32_t>(gguf::GgmlType::kQ6_K);
  const auto f32 = static_cast<uint32_t>(gguf::GgmlType::kF32);
  StreamShare host;
  host.matrix_bytes = {{q4k, 99'000'000}, {q6k, 17'300'000}, {f32, 4'000'000}};
  host.threads = 2;
  const KernelRates ref = reference_kernel_rates();
  EXPECT_EQ(ref.rate(q4k), 9.9e9);
  EXPECT_EQ(ref.rate(f32), 0.0);  // memory-bound on the reference machine
  EXPECT_EQ(ref.rate(999), 0.0);  // not a type: no rate, no crash
  // F32 has no reference rate: left out.
  EXPECT_NEAR(kernel_seconds(host, ref), 99e6 / (9.9e9 * 2) + 17.3e6 / (17.3e9 * 2), 1e-15);
  KernelRates measured;
  measured.bytes_per_s[f32] = 8e9;
  EXPECT_NEAR(kernel_seconds(host, measured), 4e6 / (8e9 * 2), 1e-15);  // only the measured type
  StreamShare gpu = host;
  gpu.device = DeviceKind::kGpu;
  EXPECT_EQ(kernel_seconds(gpu, ref), 0.0);  // a GPU's compute is not modelled
}

TEST(PriorRates, RefusesUnknownBandwidthAndBadConstants) {
  std::vector<StreamShare> shares{share(DeviceKind::kGpu, 1000, 10, 0)};
  Result<PathRates> r = prior_rates(shares);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  shares[0].bandwidth = std::nan("");
  EXPECT_EQ(prior_rates(shares).status().code(), StatusCode::kInvalidArgument);
  shares[0].bandwidth = 1e9;
  EXPECT_TRUE(prior_rates(shares).ok());
  PriorConstants c;
  c.step_overhead_s = -1;
  EXPECT_EQ(prior_rates(shares, c).status().code(), StatusCode::kInvalidArgument);
  c = PriorConstants{};
  c.prefill_per_decode = 0;
  EXPECT_EQ(prior_rates(shares, c).status().code(), StatusCode::kInvalidArgument);
  c = PriorConstants{};
  c.decode_bandwidth_share = 1.5;
  EXPECT_EQ(prior_rates(shares, c).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(prior_rates({}).status().code(), StatusCode::kInvalidArgument);  // streams nothing
}

TEST(StreamShares, CountEveryLayerMatrixTheHeadAndOneEmbeddingRow) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("spw_prior_test_" + std::to_string(::getpid()) + ".gguf")).string();
  modelgen::RandomLlamaSpec s;
  s.n_embd = 64;
  s.n_layer = 3;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 128;
  s.n_ctx = 256;
  s.vocab_path = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
  ASSERT_TRUE(modelgen::write_random_llama(Env::default_env(), path, s).ok());
  auto file = gguf::GgufFile::open(Env::default_env(), path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  Plan plan;
  plan.kv_type = KvType::kF16;
  plan.n_ctx = 256;
  plan.n_batch = 256;
  plan.n_ubatch = 64;
  auto est = estimate(**file, plan);
  ASSERT_TRUE(est.ok()) << est.status().to_string();
  const std::vector<StreamShare> shares = stream_shares(**file, *est);
  ASSERT_EQ(shares.size(), 1u);
  EXPECT_EQ(shares[0].device, DeviceKind::kHost);
  uint64_t expect = 0, vocab = 0;
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (t.name.rfind("blk.", 0) == 0 || t.name == "output.weight" || t.name == "output_norm.weight") expect += t.nbytes;
    if (t.name == "token_embd.weight") {
      vocab = t.ne[1];
      expect += t.nbytes / t.ne[1];
      if ((*file)->find_tensor("output.weight") == nullptr) expect += t.nbytes;
    }
  }
  EXPECT_GT(vocab, 0u);
  EXPECT_EQ(shares[0].weight_bytes, expect);
  // F16 K and V of 3 layers, 2 KV heads of 16: 3 x 2 x 32 x 2 bytes.
  EXPECT_EQ(shares[0].kv_bytes_per_position, 3u * 2u * 32u * 2u);
  EXPECT_EQ(shares[0].compute_s, 0.0);  // left to the caller (kernel_seconds)
  // The matrices by type: everything but the norms' vectors and the
  // embedding's looked-up row (tied: the head's read of it is a matrix's).
  uint64_t matrices = 0;
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    const bool counted = t.name.rfind("blk.", 0) == 0 || t.name == "output.weight" ||
                         (t.name == "token_embd.weight" && (*file)->find_tensor("output.weight") == nullptr);
    if (counted && t.n_dims >= 2) matrices += t.nbytes;
  }
  uint64_t by_type = 0;
  for (const TypeBytes& tb : shares[0].matrix_bytes) by_type += tb.bytes;
  EXPECT_EQ(by_type, matrices);
  EXPECT_GT(matrices, 0u);
  EXPECT_EQ(shares[0].threads, std::max(1, est->plan.n_threads));
  std::filesystem::remove(path);
}

TEST(BandwidthProbe, ValidatesItsOptions) {
  BandwidthProbeOptions o;
  o.n_threads = 0;
  EXPECT_EQ(measure_read_bandwidth(Env::default_env(), o).status().code(), StatusCode::kInvalidArgument);
  o = BandwidthProbeOptions{};
  o.passes = 0;
  EXPECT_EQ(measure_read_bandwidth(Env::default_env(), o).status().code(), StatusCode::kInvalidArgument);
  o = BandwidthProbeOptions{};
  o.buffer_bytes = 4096;
  EXPECT_EQ(measure_read_bandwidth(Env::default_env(), o).status().code(), StatusCode::kInvalidArgument);
}

TEST(BandwidthProbe, ASimulatedClockGivesUnavailableNotAFigure) {
  SimEnv env;
  BandwidthProbeOptions o;
  o.buffer_bytes = size_t{4} << 20;
  o.passes = 1;
  Result<double> r = measure_read_bandwidth(env, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(BandwidthProbe, TheRealClockGivesAPlausibleFigure) {
  // Loose bounds only: from an old laptop's 1 GB/s to an HBM part's 10 TB/s.
  BandwidthProbeOptions o;
  o.n_threads = 2;
  Result<double> r = measure_read_bandwidth(Env::default_env(), o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(*r, 1e9);
  EXPECT_LT(*r, 1e13);
}

}  // namespace
}  // namespace spw::admission
