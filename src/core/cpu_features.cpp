#include "core/cpu_features.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SPW_X86 1
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define SPW_ARM64_HWCAP 1
#endif

namespace spw {
namespace {

#if defined(SPW_X86)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d) == 0) return {};
  return r;
}

// XCR0, the register state the OS saves on a context switch: an extension
// whose registers it does not save cannot be used even where CPUID has it.
uint64_t xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

// Which register state an extension's registers need the OS to save.
enum class OsState : uint8_t { kNone, kYmm, kZmm, kTiles };

// Where CPUID reports each extension, and its name in CpuFeatures::usable().
struct FeatureBit {
  bool CpuFeatures::*field;
  unsigned leaf, sub;
  char reg;  // 'a', 'b', 'c', 'd'
  int bit;
  const char* name;
  OsState state;
};

constexpr FeatureBit kFeatureBits[] = {
    {&CpuFeatures::sse42, 1, 0, 'c', 20, "sse4.2", OsState::kNone},
    {&CpuFeatures::popcnt, 1, 0, 'c', 23, "popcnt", OsState::kNone},
    {&CpuFeatures::avx, 1, 0, 'c', 28, "avx", OsState::kYmm},
    {&CpuFeatures::avx2, 7, 0, 'b', 5, "avx2", OsState::kYmm},
    {&CpuFeatures::fma, 1, 0, 'c', 12, "fma", OsState::kYmm},
    {&CpuFeatures::f16c, 1, 0, 'c', 29, "f16c", OsState::kYmm},
    {&CpuFeatures::bmi1, 7, 0, 'b', 3, "bmi1", OsState::kNone},
    {&CpuFeatures::bmi2, 7, 0, 'b', 8, "bmi2", OsState::kNone},
    {&CpuFeatures::lzcnt, 0x80000001u, 0, 'c', 5, "lzcnt", OsState::kNone},
    {&CpuFeatures::movbe, 1, 0, 'c', 22, "movbe", OsState::kNone},
    {&CpuFeatures::avxvnni, 7, 1, 'a', 4, "avx-vnni", OsState::kYmm},
    {&CpuFeatures::avx512f, 7, 0, 'b', 16, "avx512f", OsState::kZmm},
    {&CpuFeatures::avx512bw, 7, 0, 'b', 30, "avx512bw", OsState::kZmm},
    {&CpuFeatures::avx512cd, 7, 0, 'b', 28, "avx512cd", OsState::kZmm},
    {&CpuFeatures::avx512dq, 7, 0, 'b', 17, "avx512dq", OsState::kZmm},
    {&CpuFeatures::avx512vl, 7, 0, 'b', 31, "avx512vl", OsState::kZmm},
    {&CpuFeatures::avx512vnni, 7, 0, 'c', 11, "avx512vnni", OsState::kZmm},
    {&CpuFeatures::avx512bf16, 7, 1, 'a', 5, "avx512bf16", OsState::kZmm},
    {&CpuFeatures::amx_tile, 7, 0, 'd', 24, "amx-tile", OsState::kTiles},
    {&CpuFeatures::amx_int8, 7, 0, 'd', 25, "amx-int8", OsState::kTiles},
    {&CpuFeatures::amx_bf16, 7, 0, 'd', 22, "amx-bf16", OsState::kTiles},
};

// AArch64's, in the order usable() lists them (the names /proc/cpuinfo uses).
struct ArmFeature {
  bool CpuFeatures::*field;
  const char* name;
};
constexpr ArmFeature kArmFeatures[] = {
    {&CpuFeatures::asimd, "asimd"}, {&CpuFeatures::asimd_fp16, "asimdhp"}, {&CpuFeatures::asimd_dotprod, "asimddp"},
    {&CpuFeatures::sve, "sve"},     {&CpuFeatures::i8mm, "i8mm"},           {&CpuFeatures::arm_bf16, "bf16"},
};

}  // namespace

std::vector<std::string> CpuFeatures::usable() const {
  std::vector<std::string> out;
  for (const FeatureBit& b : kFeatureBits) {
    const bool os = b.state == OsState::kNone || (b.state == OsState::kYmm && os_avx) ||
                    (b.state == OsState::kZmm && os_avx512) || (b.state == OsState::kTiles && os_amx);
    if (this->*b.field && os) out.emplace_back(b.name);
  }
  for (const ArmFeature& a : kArmFeatures)
    if (this->*a.field) out.emplace_back(a.name);
  return out;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(SPW_X86)
  const Regs v = cpuid(0, 0);
  const unsigned max_leaf = v.a;
  const unsigned max_ext = cpuid(0x80000000u, 0).a;
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  for (const FeatureBit& b : kFeatureBits) {
    if (b.leaf > (b.leaf >= 0x80000000u ? max_ext : max_leaf)) continue;
    const Regs r = cpuid(b.leaf, b.sub);
    const unsigned reg = b.reg == 'a' ? r.a : b.reg == 'b' ? r.b : b.reg == 'c' ? r.c : r.d;
    f.*b.field = ((reg >> b.bit) & 1u) != 0;
  }
  if (((cpuid(1, 0).c >> 27) & 1u) != 0) {  // OSXSAVE: XGETBV is available
    const uint64_t x = xcr0();
    f.os_avx = (x & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (x & 0xE0) == 0xE0;
    f.os_amx = (x & 0x60000) == 0x60000;
  }
  if (max_ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    std::string b = brand;
    const size_t s = b.find_first_not_of(' ');
    const size_t e = b.find_last_not_of(' ');
    f.brand = s == std::string::npos ? "" : b.substr(s, e - s + 1);
  }
#endif
#if defined(SPW_ARM64_HWCAP)
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimd = (hw & HWCAP_ASIMD) != 0;
  f.asimd_fp16 = (hw & HWCAP_ASIMDHP) != 0;
  f.asimd_dotprod = (hw & HWCAP_ASIMDDP) != 0;
  f.sve = (hw & HWCAP_SVE) != 0;
  f.i8mm = (hw2 & HWCAP2_I8MM) != 0;
  f.arm_bf16 = (hw2 & HWCAP2_BF16) != 0;
#endif
  return f;
}

const CpuFeatures& host_cpu_features() {
  static const CpuFeatures f = detect_cpu_features();
  return f;
}

}  // namespace spw
