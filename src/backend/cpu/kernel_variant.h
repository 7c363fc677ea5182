// Kernel variants: the CPU kernels built for several ISA levels in one binary,
// one of them chosen at start.
//
// Contract: the package is compiled for a baseline (x86-64-v2: SSE4.2 and
// POPCNT, every x86-64 CPU since 2008) and carries the kernel sources
// (kernels.cpp, gemm.cpp, attention.cpp, quant_dot.cpp) once more per higher level:
//   x86-64-v2        the scalar kernels (the compiler's SSE code)
//   x86-64-v3        AVX2, FMA, F16C (Haswell, Zen 1 and later; most home CPUs)
//   x86-64-v4        AVX-512 F/BW/CD/DQ/VL (Skylake-X, Zen 4)
//   x86-64-v4-vnni   v4 and AVX-512 VNNI (Ice Lake, Sapphire Rapids, Zen 4/5):
//                    Q8_0 and Q4_K from 16-row interleaved records
//                    (packed_weights.h)
//   x86-64-v4-amx    v4-vnni and AMX-INT8 (Sapphire Rapids and later Xeons):
//                    the Q8_0 GEMM's integer part in AMX tiles; bitwise the
//                    v4-vnni results (the same exact integers, the same float
//                    steps). Runs only where Linux grants the process the
//                    tile state (arch_prctl, asked when it is considered).
// Why x86-64-v2 and not v3 for the rest of the binary: the package must run
// on CPUs without AVX2 (Sandy and Ivy Bridge Xeons are still common in home
// servers), and what is not a kernel (HTTP, JSON, the journal, the
// scheduler) gains nothing measurable from AVX2; v1 would add only CPUs
// older than 2008, for which the scalar kernels are no answer anyway.
// The first kernel call, or use_kernel_variant("auto"), picks the best one
// this CPU runs (unless SPILLWAY_CPU_VARIANT names another): its CPUID bits and the OS's enabled register state (XCR0:
// AVX needs the YMM state saved, AVX-512 the opmask and ZMM state too). A
// build with SPILLWAY_NATIVE=ON has "native" (the build machine's ISA) and,
// on x86-64, "scalar" (the same sources without vector extensions, kept for
// its tests); a GCC build for 64-bit ARM has one, "aarch64" (the portable
// kernels, which GCC vectorises for Advanced SIMD, present on every ARMv8-A
// CPU); any other build has one, "generic".
// Variants differ in their rounding (their summation orders differ), never
// in what they compute: the kernels' bitwise contracts (batch and thread
// invariance) hold within a variant, and a path's variant is part of its
// numerics identity (gateway: two paths of different variants are the same
// placement only once their equivalence check passed).
// Thread safety: detection and the listing are pure; use_kernel_variant
// switches every later kernel call atomically and must not run while
// kernels run on other threads (call it at start, or in a test's set-up).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_features.h"
#include "core/status.h"

namespace spw::cpu {

// The CPU's extensions (core/cpu_features.h), named here too: the kernel
// variants are chosen from them.
using spw::CpuFeatures;
using spw::detect_cpu_features;

struct KernelVariantInfo {
  std::string name;  // "x86-64-v3", "native", "aarch64", "generic"
  std::string isa;   // the extensions its kernels use: "avx2 fma f16c"; "" = scalar
  bool runs_here = false;

  // Whether its kernels were built with extension `ext` ("fma", "avx2", ...).
  bool uses(std::string_view ext) const;
};

// What code outside the kernels that must round as they do needs to know
// about the chosen variant (the Vulkan backend's exact shaders, the
// estimator); cheap to ask, no allocation.
struct KernelTraits {
  // dot_f32 and attention take the AVX2/AVX-512 order with fused
  // multiply-adds (the Vulkan EXACT_F64 shaders repeat it).
  bool fused_dot_order = false;
  // dot_f32 ends with an 8-element chunk after its 16-element ones (the AVX2
  // kernel; AVX-512 goes on one element at a time): attention.comp's tail8.
  bool dot_tail8 = false;
  // matmul computes Q8_0 and Q4_K matrices of 16k rows from the kQ8_0x16
  // and kQ4_Kx16 layouts (packed_weights.h: the AVX-512 VNNI variants), and every Q8_0 dot
  // product of the variant, packed or not, takes the block order: per block
  // the exact integer dot, then acc = fma(float(i), d_w * d_x, acc), one
  // accumulator in block order (the scalar kernels' order). Its activations
  // carry one more int32 per (token, block), 128 * sum(x): the estimator
  // prices that scratch only then (admission::EstimatorConfig::host_kernels).
  bool q8_0_x16 = false;
};

// The chosen variant's traits (choosing it first if nothing has).
const KernelTraits& active_kernel_traits();

// The variants built into this binary, best first.
std::vector<KernelVariantInfo> kernel_variants();

// The variant kernel calls run now. If nothing chose one before, the first
// kernel call does: the one SPILLWAY_CPU_VARIANT names when it is built and
// runs here, else the best that runs here.
KernelVariantInfo active_kernel_variant();

// Chooses the variant by name, or "auto" for the best that runs here.
// NotFound (naming the built ones) for a name this binary does not have;
// FailedPrecondition (naming the missing extensions) for one this CPU or OS
// cannot run.
Status use_kernel_variant(std::string_view name);

// The environment variable tests and benchmarks choose a variant by (the
// spillway binary takes --cpu-variant, which defaults to it).
inline constexpr const char* kKernelVariantEnv = "SPILLWAY_CPU_VARIANT";

// use_kernel_variant(getenv(kKernelVariantEnv)) when it is set and not empty;
// OK and no change otherwise.
Status use_kernel_variant_from_env();

}  // namespace spw::cpu
