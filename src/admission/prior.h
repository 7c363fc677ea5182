// A path's rate prior: the speeds admission quotes with before the path has
// finished a request of its own (PathRates::measured false), from what a
// decode step must stream and the measured bandwidth of the memory it
// streams from (admission/bandwidth.h).
//
// Contract: decode is modelled as memory-bound (a few weight types: compute).
// A decode step at position p reads every weight matrix of the model once
// (each layer's, the output head, one row of the embedding) and the K and V
// rows of the p earlier positions, from the memory of the device each layer
// is on, so it costs
//   step_overhead_s + sum over memories m of (max(W_m / B_m, C_m) + KV_m * p / B_m)
// seconds (W_m: weight bytes a step reads from m, KV_m: K+V bytes per
// position of the layers on m, B_m: m's read bandwidth, C_m: the CPU
// kernels' own time for those bytes where it exceeds the streaming, see
// KernelRates). Hence
//   decode_tps = 1 / (step_overhead_s + sum max(W_m / B_m, C_m)),
//   decode_s_per_pos = sum KV_m / B_m.
// step_overhead_s is the fixed cost of a step that is not streaming: one
// dispatch per operator per layer, the sampler over the vocabulary, the
// scheduler's event to the client. It is what a model small enough to sit in
// cache runs at (docs/PERFORMANCE.md: the bundled 260K model is bound by it,
// not by bandwidth), a figure measured on the reference machine.
// Prefill is compute-bound (a chunk of rows shares each weight read), so
// bandwidth says little about it; without a compute measurement the prior
// takes prefill_tps = prefill_per_decode x decode_tps, the ratio measured on
// the reference machine (docs/PERFORMANCE.md), and no growth with position.
// What the model ignores: the overlap of compute and streaming (the larger
// of the two is taken, not a sum: right at either end, optimistic where they
// are close), the Vulkan kernels' compute, attention's arithmetic beyond its
// KV reads, several requests sharing one weight read (continuous batching:
// the prior is for a request alone, as a quote is), the cache serving part of
// a model that fits in it, and a co-tenant's share of the bandwidth.
// The measured rates replace the prior at the first finished request
// (Scheduler::record_rates_locked weighs the first sample 1): a real request
// on this path is better evidence than any prior, and the fit's decaying
// weights then carry on from real samples only.
// prior_rates() is InvalidArgument when a share has no positive finite
// bandwidth, no share streams anything, or a constant is out of range.
// Thread safety: pure functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "admission/controller.h"
#include "admission/estimator.h"
#include "core/status.h"
#include "gguf/gguf.h"

namespace spw::admission {

// Weight bytes of one ggml type in a share.
struct TypeBytes {
  uint32_t ggml_type = 0;
  uint64_t bytes = 0;
};

// What a decode step streams from one device's memory.
struct StreamShare {
  DeviceKind device = DeviceKind::kHost;
  uint64_t weight_bytes = 0;           // W_m: weight bytes read per step
  uint64_t kv_bytes_per_position = 0;  // KV_m: K+V bytes per earlier position
  double bandwidth = 0;                // B_m: bytes/s (0: unknown)
  double compute_s = 0;                // C_m: kernel seconds per step where known (0: none)
  // The matrices' part of weight_bytes by type (the embedding's one row is
  // a lookup, not a kernel's): what kernel_seconds() prices.
  std::vector<TypeBytes> matrix_bytes;
  int threads = 1;  // CPU threads the share's kernels run on (the plan's)
};

// Weight bytes per second one CPU thread's decode matvec (one token against a
// matrix held in cache) gets through, by ggml type; 0: not known, and the
// type is taken as memory-bound. Measured at start on the host
// (backend/cpu/kernel_probe.h) unless the gateway skips its probes; else
// reference_kernel_rates().
struct KernelRates {
  static constexpr uint32_t kTypes = 32;  // ggml type ids below this
  std::array<double, kTypes> bytes_per_s{};
  std::array<bool, kTypes> measured{};  // false: the reference machine's figure (or none)
  double rate(uint32_t ggml_type) const { return ggml_type < kTypes ? bytes_per_s[ggml_type] : 0.0; }
  bool is_measured(uint32_t ggml_type) const { return ggml_type < kTypes && measured[ggml_type]; }
};

// One weight type's rate as a path's prior used it (status).
struct KernelRate {
  uint32_t ggml_type = 0;
  double bytes_per_s = 0;  // 0: none, the type taken as memory-bound
  bool measured = false;   // on this host; else the reference machine's
};

// The reference machine's figures (AMD EPYC Zen 5, AVX-512, 1 thread;
// docs/PERFORMANCE.md "Low-bit types beside Q8_0"): Q4_K 9.9 GB/s, Q6_K
// 17.3 GB/s; Q5_K, not measured, taken as Q4_K (the same scale unpacking);
// the other types 0 (memory-bound there: F32, F16, Q8_0 decode at the
// bandwidth). Another CPU may differ by 2x (kernel_probe.h): these are the
// fallback when nothing was measured.
KernelRates reference_kernel_rates();

// C_m of a host share: the sum over its matrix_bytes of bytes / (rate x
// threads), types without a rate left out; 0 for a GPU share (its kernels'
// compute is not modelled).
double kernel_seconds(const StreamShare& share, const KernelRates& rates);

struct PriorConstants {
  // Measured with the bundled 260K model at 1 thread: a step takes 33-37 us
  // on a quiet AMD machine (33: Zen 3 in CI, 2026-12-07; 37: the Zen 5
  // reference), 55-112 us on the Zen 3 beside other tests, and 72-93 us on
  // a quiet Intel Xeon VM (Sapphire Rapids class, 2026-12-07). Its 1 MiB of
  // weights is read from the caches; the probe reads a buffer that size
  // (18-31 GB/s on the Zen 3, 87 GB/s on the Xeon, whose 2 MiB L2 holds it),
  // so the streaming term is 42-72 us there and ~16 us here. 34 us keeps
  // the prior within 2x of every one of those steps (Zen 3: 0.68-1.93;
  // Xeon: 0.54-0.69); 12 us read 0.29-0.32 on the Xeon, 25 us read 2.14
  // against a 33 us step when the probe read DRAM (docs/PERFORMANCE.md,
  // "Rate prior"). A figure per machine class, not a measurement: a step's
  // fixed cost measured at start would be the fix. Negligible beside a
  // bandwidth-bound model's milliseconds.
  double step_overhead_s = 34e-6;
  // Prefill tokens/s over decode tokens/s at position 0. Measured at 1 thread
  // on the reference machine (docs/PERFORMANCE.md): 1.9 (Q8_0), 2.2 (the
  // bundled model), 3.2 (F16), 5.4 (F32): prefill is compute-bound, so the
  // ratio grows with the bytes per weight that decode streams. 3 is within 2x
  // of all of them.
  double prefill_per_decode = 3.0;
  // The share of the probe's bandwidth a decode step's reads get: decode
  // interleaves dequantisation and dot products with its loads, the probe's
  // loop only adds. Measured on the reference machine at 1 thread: 64-94%
  // (docs/PERFORMANCE.md, the engine table of 2026-12-02 and "Rate prior").
  // Since then the bandwidth-bound rows read pessimistic at 0.8: 1.4-1.6 on
  // a Zen 3 (2026-12-06), and 2.15 for Q8_0 on an Intel Xeon once its
  // kernels were repacked (2026-12-07: 96 MB a step in 5.0 ms against a probe
  // of 11.3 GB/s beside other tests; the 480 MB L3 holds the model). At 1.0
  // those read ~1.1-1.3 and 1.72. B_m above is the probe's figure x this.
  double decode_bandwidth_share = 1.0;
};

// The shares of a path's estimate (one per device its layers are on), their
// bandwidth and compute_s left 0 for the caller to fill in (kernel_seconds).
// `file` is the estimate's model; threads is the plan's n_threads.
std::vector<StreamShare> stream_shares(const gguf::GgufFile& file, const Estimate& estimate);

// The prior (measured false, samples 0, completion_share 1).
Result<PathRates> prior_rates(const std::vector<StreamShare>& shares, const PriorConstants& constants = {});

// What status shows of a path's prior.
struct RatePrior {
  bool computed = false;                // false: `why`, and the path starts from the default rates
  std::string why;                      // why not computed
  double host_bandwidth = 0;            // bytes/s of host memory as used for the host share (0: none)
  double device_bandwidth = 0;          // bytes/s for the GPU share (0: none)
  std::string device_bandwidth_source;  // e.g. "host memory (lavapipe)", "" when none
  uint64_t weight_bytes_per_token = 0;  // over every share
  uint64_t kv_bytes_per_position = 0;
  double compute_s_per_token = 0;  // sum of the shares' compute_s
  std::vector<KernelRate> kernels;  // the host share's matrix types, as compute_s priced them
  PriorConstants constants;
  PathRates rates;  // the prior, as it was given to the path
};

}  // namespace spw::admission
