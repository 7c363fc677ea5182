// The host CPU's instruction-set extensions: from CPUID and XGETBV on x86-64,
// from the kernel's hardware capability words (getauxval) on 64-bit ARM.
//
// Contract: detect_cpu_features() reads them (pure; a few CPUID
// instructions); host_cpu_features() is the same, read once per process and
// kept (thread-safe). An extension counts only where the OS also saves its
// registers (XCR0): AVX/F16C/FMA need the YMM state, AVX-512 the opmask and
// ZMM state, AMX the tile state; usable() applies that. On AArch64 Linux
// reports in AT_HWCAP/AT_HWCAP2 only what it enabled, so those bits are
// usable as read; vendor/brand stay empty there (no CPUID). Elsewhere every
// flag is false.
// Why in core: the CPU kernel variants (backend/cpu/kernel_variant.h) choose
// from it, and so do the few loops outside them that use an extension behind
// a runtime check (kv_cache's F16C conversions); one detector, since
// compilers' own checks differ (clang 14's __builtin_cpu_supports has no
// "f16c").
#pragma once

#include <string>
#include <vector>

namespace spw {

// What CPUID and XGETBV (x86-64) or the hardware capability words (AArch64)
// report; false for the other architecture's fields.
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD"; empty off x86
  std::string brand;   // "AMD EPYC 9B45", ...
  bool sse42 = false, popcnt = false;
  bool avx = false, avx2 = false, fma = false, f16c = false, bmi1 = false, bmi2 = false, lzcnt = false, movbe = false;
  bool avx512f = false, avx512bw = false, avx512cd = false, avx512dq = false, avx512vl = false, avx512vnni = false,
       avx512bf16 = false, avxvnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool os_avx = false;     // XCR0 bits 1-2: the OS saves XMM and YMM state
  bool os_avx512 = false;  // XCR0 bits 5-7: opmask, ZMM0-15 upper halves, ZMM16-31
  bool os_amx = false;     // XCR0 bits 17-18: tile config and data
  // AArch64 (AT_HWCAP, AT_HWCAP2): Advanced SIMD, its half-precision
  // arithmetic, the int8 dot product (SDOT/UDOT), SVE, int8 matrix multiply
  // and BF16: what ARM kernel variants would be chosen by.
  bool asimd = false, asimd_fp16 = false, asimd_dotprod = false, sve = false, i8mm = false, arm_bf16 = false;

  // The names of the extensions the CPU has and the OS enabled ("avx2",
  // "avx512f", ...), in a fixed order.
  std::vector<std::string> usable() const;
};

CpuFeatures detect_cpu_features();

// detect_cpu_features(), once.
const CpuFeatures& host_cpu_features();

}  // namespace spw
