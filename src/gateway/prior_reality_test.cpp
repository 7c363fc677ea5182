// The rate prior against reality (admission/prior.h): a gateway with the real
// CPU backend and no warm-up quotes a request from its prior (nothing has run
// on the path yet), then runs it; the quoted decode time per token must be
// within 2x of what the request's tokens really took.
// Timing on a shared machine (2 cores, other engineers' builds): the prior
// predicts a path that has its cores; neighbours take them away, which
// stretches wall time but not the CPU time the request's work takes. So
// reality's figure is the process CPU time from the first token to the end
// (one CPU thread: the worker; the test thread sleeps in next_event), the
// fastest of three runs; wall time is printed beside it. Memory contention
// from neighbours still shows, as it would in service. The bandwidth probe
// keeps its fastest pass for the same reason. A 2x margin is what the issue
// asks; the physics leaves less slack than that only where the model ignores
// something real (see prior.h), which is what this test is for.
// Bounded: each case generates a few hundred tokens at most, every wait is
// capped (collect-like loop, 60 s).
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "admission/controller.h"
#include "gateway/builder.h"
#include "tools/modelgen/random_llama.h"

namespace spw::gateway {
namespace {

std::string src(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }

// Client-side times of one request: first token to finish.
struct Run {
  bool ok = false;
  int32_t completion_tokens = 0;
  double decode_s = 0;      // wall: first text event to the finished event
  double decode_cpu_s = 0;  // the process's CPU time over the same span
};

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

Run run_once(Gateway& gw, const RouteRequest& r) {
  Run out;
  auto a = gw.submit(r);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  if (!a.ok()) return out;
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::seconds(60);
  clock::time_point first{};
  double first_cpu = 0;
  while (clock::now() < until) {
    serve::RequestEvent ev;
    const serve::PopResult pr = a->ticket->next_event(ev, std::chrono::milliseconds(20));
    if (pr == serve::PopResult::kClosed) break;
    if (pr == serve::PopResult::kTimeout) continue;
    const auto now = clock::now();
    if (ev.kind == serve::RequestEvent::Kind::kText) {
      if (first == clock::time_point{}) {
        first = now;
        first_cpu = process_cpu_s();
      }
      continue;
    }
    out.ok = ev.state == serve::RequestState::kDone;
    EXPECT_TRUE(out.ok) << ev.status.to_string();
    out.completion_tokens = ev.completion_tokens;
    out.decode_s = std::chrono::duration<double>(now - first).count();
    out.decode_cpu_s = process_cpu_s() - first_cpu;
    return out;
  }
  ADD_FAILURE() << "request did not finish";
  return out;
}

struct Outcome {
  double bandwidth = 0;          // bytes/s the prior used
  uint64_t weight_bytes = 0;     // a decode step streams
  double prior_s_per_token = 0;  // the cold quote's decode time / tokens
  double real_s_per_token = 0;   // fastest run: CPU time (first token .. end) / (tokens - 1)
  double wall_s_per_token = 0;   // the same run's wall time
  double ratio() const { return prior_s_per_token / real_s_per_token; }
};

Outcome prior_vs_real(const std::string& model, int threads, int32_t max_tokens, const char* label) {
  GatewayOptions o;
  o.model = model;
  o.device = Placement::cpu();
  o.threads = threads;
  o.journal = "none";
  o.warmup = false;  // the quote below must be the cold one
  o.ctx = 512;
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return {};
  Gateway& gw = *b->gateway;
  RouteRequest r;
  r.generation.prompt = "Once upon a time";
  r.generation.max_tokens = max_tokens;
  r.generation.ignore_eos = true;
  r.generation.sampler.temperature = 0;
  Outcome out;
  {
    const GatewayStatus st = gw.status();
    EXPECT_EQ(st.paths.size(), 1u);
    if (st.paths.empty()) return {};
    const PathStatus& p = st.paths[0];
    EXPECT_TRUE(p.prior.computed) << p.prior.why;
    EXPECT_FALSE(p.rates.measured);
    EXPECT_EQ(rates_source(p.rates, p.prior), "prior");
    // No bandwidth given: every matrix type's decode kernel was probed here.
    EXPECT_FALSE(p.prior.kernels.empty());
    for (const admission::KernelRate& k : p.prior.kernels) {
      EXPECT_TRUE(k.measured) << gguf::ggml_type_name(k.ggml_type);
      EXPECT_GT(k.bytes_per_s, 0) << gguf::ggml_type_name(k.ggml_type);
    }
    out.bandwidth = p.prior.host_bandwidth;
    out.weight_bytes = p.prior.weight_bytes_per_token;
  }
  Result<Quote> q = gw.quote(r);
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  if (!q.ok() || q->paths.empty()) return {};
  EXPECT_EQ(q->paths[0].rates_source, "prior");
  EXPECT_FALSE(q->paths[0].rates_measured);
  const admission::Timing& t = q->paths[0].timing;
  // The quote prices max_tokens decode steps (completion share 1 before any sample).
  out.prior_s_per_token = (t.total_s - t.ttft_s) / max_tokens;
  for (int i = 0; i < 3; ++i) {
    const Run run = run_once(gw, r);
    if (!run.ok) return {};
    EXPECT_EQ(run.completion_tokens, max_tokens);
    const double steps = std::max(1, run.completion_tokens - 1);
    // CPU time cannot exceed wall time on one thread; the smaller is the work.
    const double per = std::min(run.decode_cpu_s, run.decode_s) / steps;
    if (out.real_s_per_token == 0 || per < out.real_s_per_token) {
      out.real_s_per_token = per;
      out.wall_s_per_token = run.decode_s / steps;
    }
  }
  // Measured rates took over at the first finished request.
  const GatewayStatus st = gw.status();
  EXPECT_TRUE(st.paths[0].rates.measured);
  EXPECT_EQ(rates_source(st.paths[0].rates, st.paths[0].prior), "measured");
  std::printf(
      "[prior] %s threads=%d bandwidth=%.2f GB/s weights/token=%.2f MB prior=%.3f ms/token "
      "real=%.3f ms/token (wall %.3f) prior/real=%.2f\n",
      label, threads, out.bandwidth / 1e9, static_cast<double>(out.weight_bytes) / 1e6, out.prior_s_per_token * 1e3,
      out.real_s_per_token * 1e3, out.wall_s_per_token * 1e3, out.ratio());
  return out;
}

class PriorRealityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spw_prior_reality_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A model big enough that decode streams far more than the caches hold
  // (96 MB a step as Q8_0, 190 MB as F16), with the bundled model's vocabulary.
  std::string big_model(gguf::GgmlType type, modelgen::RandomLlamaMix mix = modelgen::RandomLlamaMix::kNone) {
    modelgen::RandomLlamaSpec s;
    s.mix = mix;
    s.n_embd = 1024;
    s.n_layer = 8;
    s.n_head = 16;
    s.n_head_kv = 4;
    s.n_ff = 2816;
    s.n_ctx = 512;
    s.type = type;
    s.vocab_path = src("models/stories260K.gguf");
    const std::string path = (dir_ / "big.gguf").string();
    const Status st = modelgen::write_random_llama(Env::default_env(), path, s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(PriorRealityTest, ABandwidthBoundModelsColdQuoteIsWithin2xOfItsFirstRequests) {
  const Outcome o = prior_vs_real(big_model(gguf::GgmlType::kQ8_0), 1, 32, "generated-q8_0");
  ASSERT_GT(o.real_s_per_token, 0);
  EXPECT_GT(o.ratio(), 0.5);
  EXPECT_LT(o.ratio(), 2.0);
}

// Q4_K decodes slower than its bytes stream on this CPU: the prior's kernel
// term (KernelRates, measured at start on this host: 9.9 GB/s a thread on
// the reference Zen 5, 5.8 on a Zen 3) is what keeps it within 2x (0.34
// without; 0.50 on the Zen 3 with the reference figure).
TEST_F(PriorRealityTest, AComputeBoundQ4KModelsColdQuoteIsWithin2xThanksToTheKernelTerm) {
  const Outcome o =
      prior_vs_real(big_model(gguf::GgmlType::kQ4_K, modelgen::RandomLlamaMix::kQ4_K_M), 1, 32, "generated-q4_k_m");
  ASSERT_GT(o.real_s_per_token, 0);
  EXPECT_GT(o.ratio(), 0.5);
  EXPECT_LT(o.ratio(), 2.0);
}

TEST_F(PriorRealityTest, TheBundledOverheadBoundModelsColdQuoteIsWithin2xThanksToTheStepOverhead) {
  const Outcome o = prior_vs_real(src("models/stories260K.gguf"), 1, 128, "stories260K");
  ASSERT_GT(o.real_s_per_token, 0);
  EXPECT_GT(o.ratio(), 0.5);
  EXPECT_LT(o.ratio(), 2.0);
}

// A given bandwidth is used as is (no probe), and a lavapipe GPU path, whose
// "device memory" is host memory, takes the host figure; both show in status.
TEST_F(PriorRealityTest, AGivenBandwidthIsUsedAsIsAndLavapipeTakesTheHostFigure) {
  GatewayOptions o;
  o.model = src("models/stories260K.gguf");
  o.device = Placement::cpu();
  o.threads = 1;
  o.journal = "none";
  o.warmup = false;
  o.ctx = 256;
  o.host_bandwidth = 20e9;
  {
    Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    const GatewayStatus st = b->gateway->status();
    ASSERT_EQ(st.paths.size(), 1u);
    const admission::RatePrior& p = st.paths[0].prior;
    ASSERT_TRUE(p.computed) << p.why;
    EXPECT_EQ(p.host_bandwidth, 20e9);
    // A given bandwidth: no probes; F32 has no reference kernel rate, so no kernel term.
    EXPECT_EQ(p.compute_s_per_token, 0.0);
    ASSERT_EQ(p.kernels.size(), 1u);
    EXPECT_EQ(p.kernels[0].ggml_type, static_cast<uint32_t>(gguf::GgmlType::kF32));
    EXPECT_FALSE(p.kernels[0].measured);
    const double bw = 20e9 * p.constants.decode_bandwidth_share;
    EXPECT_NEAR(1.0 / p.rates.decode_tps,
                p.constants.step_overhead_s + static_cast<double>(p.weight_bytes_per_token) / bw, 1e-12);
    EXPECT_NEAR(p.rates.decode_s_per_pos, static_cast<double>(p.kv_bytes_per_position) / bw, 1e-18);
    EXPECT_EQ(st.paths[0].rates.decode_tps, p.rates.decode_tps);  // what the path quotes with
  }
  o.host_bandwidth = -1;
  Result<BuiltGateway> bad = build_gateway(Env::default_env(), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().field(), "host-bandwidth");

  auto devs = list_vulkan_devices();
  if (!devs.ok() || devs->empty()) GTEST_SKIP() << "no Vulkan device";
  o.host_bandwidth = 20e9;
  o.device = Placement::vulkan();
  o.device_memory = uint64_t{64} << 20;
  o.kv_type = KvType::kF32;
  Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const GatewayStatus st = b->gateway->status();
  ASSERT_FALSE(st.paths.empty());
  const admission::RatePrior& g = st.paths[0].prior;
  if ((*devs)[0].type != "cpu" && (*devs)[0].type != "integrated-gpu") {
    EXPECT_FALSE(g.computed);  // not measured without --device-bandwidth
    EXPECT_EQ(rates_source(st.paths[0].rates, g), "default");
    GTEST_SKIP() << "a discrete GPU";
  }
  ASSERT_TRUE(g.computed) << g.why;
  EXPECT_EQ(g.device_bandwidth, 20e9);
  EXPECT_NE(g.device_bandwidth_source.find("host memory"), std::string::npos) << g.device_bandwidth_source;
  Result<Quote> q = b->gateway->quote([] {
    RouteRequest r;
    r.generation.prompt = "Once upon a time";
    r.generation.max_tokens = 8;
    return r;
  }());
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->paths[0].rates_source, "prior");
}

// The figures of docs/PERFORMANCE.md ("Rate prior"): more weight types and
// 2 threads, printed, not asserted (minutes of generation on a shared
// machine): SPW_PRIOR_SWEEP=1 to run.
TEST_F(PriorRealityTest, Sweep) {
  if (std::getenv("SPW_PRIOR_SWEEP") == nullptr) GTEST_SKIP() << "SPW_PRIOR_SWEEP=1 runs it";
  for (int threads : {1, 2}) {
    (void)prior_vs_real(src("models/stories260K.gguf"), threads, 128, "stories260K");
    (void)prior_vs_real(big_model(gguf::GgmlType::kF32), threads, 32, "generated-f32");
    (void)prior_vs_real(big_model(gguf::GgmlType::kF16), threads, 32, "generated-f16");
    (void)prior_vs_real(big_model(gguf::GgmlType::kQ8_0), threads, 32, "generated-q8_0");
    (void)prior_vs_real(big_model(gguf::GgmlType::kQ4_K, modelgen::RandomLlamaMix::kQ4_K_M), threads, 32,
                        "generated-q4_k_m");
  }
}

}  // namespace
}  // namespace spw::gateway
