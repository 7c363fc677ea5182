// Decode-kernel throughput of this host, measured once at start: the kernel
// term C_m of a path's rate prior (admission/prior.h, KernelRates).
//
// Why measure: a decode step's matvec is bound by the memory for some weight
// types and by its own arithmetic for others, and which is which depends on
// the CPU. Q4_K decodes at 9.9 GB/s a thread on the Zen 5 (AVX-512) machine
// the constants were first taken on and at 5.8 GB/s on a Zen 3 (AVX2) one;
// a constant from one machine put the prior at half of reality on the
// other (docs/PERFORMANCE.md, "Rate prior").
//
// Contract: measure_decode_kernel_rate(env, type, options) builds a weight
// matrix of `type` of about options.matrix_bytes (2048 columns: one
// quantised row, repeated, so building it costs one row's quantisation),
// small enough to stay in a core's L2 so that the passes measure the kernel,
// not the memory. A pass runs cpu::matmul on one token (decode's call) until
// it has read options.bytes_per_pass of weights; each size's figure is the
// fastest of options.passes passes on one thread, timed on env's monotonic
// clock (the fastest, as the bandwidth probe keeps: on a shared machine the
// slower passes measure the neighbours). It times the whole matrix and its
// first quarter and returns the marginal weight bytes per second between
// the two: a call's fixed part (quantising the activation row, 1-3 us for
// 2048 columns, more before the Q8_0 quantiser had an AVX2 path) cancels
// out, as it nearly does for decode's large matrices.
// Cost on the machines measured: a few ms a type.
// InvalidArgument for a type the CPU backend cannot run (gguf/quant.h's
// has_reference_codec) or options out of range; Unavailable when the clock
// did not advance over a pass (a simulated Env: the caller keeps its
// reference figures).
// Thread safety: reentrant; runs on the calling thread only.
#pragma once

#include <cstddef>

#include "core/env.h"
#include "core/status.h"
#include "gguf/ggml_types.h"

namespace spw::cpu {

struct KernelProbeOptions {
  // 192 KiB: inside every x86 core's L2 of the last decade (256 KiB on
  // Skylake client cores, 512 KiB-2 MiB since), with room for the
  // activation row and the outputs.
  size_t matrix_bytes = size_t{192} << 10;
  size_t bytes_per_pass = size_t{4} << 20;  // ~0.3-1 ms of kernel a pass
  int passes = 7;
};

Result<double> measure_decode_kernel_rate(Env& env, gguf::GgmlType type, const KernelProbeOptions& options = {});

}  // namespace spw::cpu
