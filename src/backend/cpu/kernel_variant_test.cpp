// Kernel variants against the machine: CPUID's view against the kernel's
// (/proc/cpuinfo), the choice of a variant, and every variant that runs here
// computing the same products within rounding.
#include "backend/cpu/kernel_variant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quant_dot.h"
#include "gguf/quant.h"

namespace spw::cpu {
namespace {

// The "flags" line of /proc/cpuinfo's first processor: the extensions the
// kernel found (it leaves out what XCR0 does not enable).
std::set<std::string> proc_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> out;
    for (std::string w; words >> w;) out.insert(w);
    return out;
  }
  return {};
}

// Restores the variant the test binary runs (kernel_variant_test_env.h).
class VariantGuard {
 public:
  VariantGuard() : name_(active_kernel_variant().name) {}
  ~VariantGuard() { EXPECT_TRUE(use_kernel_variant(name_).ok()); }

 private:
  std::string name_;
};

TEST(KernelVariant, CpuidAgreesWithTheKernel) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "CPUID is x86";
#endif
  const auto flags = proc_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const CpuFeatures f = detect_cpu_features();
  EXPECT_FALSE(f.vendor.empty());
  const auto usable = f.usable();
  const std::set<std::string> have(usable.begin(), usable.end());
  // Our name -> the kernel's.
  const std::pair<const char*, const char*> names[] = {{"sse4.2", "sse4_2"},
                                                       {"popcnt", "popcnt"},
                                                       {"avx", "avx"},
                                                       {"avx2", "avx2"},
                                                       {"fma", "fma"},
                                                       {"f16c", "f16c"},
                                                       {"bmi1", "bmi1"},
                                                       {"bmi2", "bmi2"},
                                                       {"lzcnt", "abm"},
                                                       {"movbe", "movbe"},
                                                       {"avx512f", "avx512f"},
                                                       {"avx512bw", "avx512bw"},
                                                       {"avx512cd", "avx512cd"},
                                                       {"avx512dq", "avx512dq"},
                                                       {"avx512vl", "avx512vl"},
                                                       {"avx512vnni", "avx512_vnni"},
                                                       {"avx512bf16", "avx512_bf16"},
                                                       {"avx-vnni", "avx_vnni"},
                                                       {"amx-tile", "amx_tile"},
                                                       {"amx-int8", "amx_int8"}};
  for (const auto& [ours, kernels] : names) {
    EXPECT_EQ(have.count(ours), flags.count(kernels)) << ours << " (/proc/cpuinfo: " << kernels << ")";
  }
}

TEST(KernelVariant, ListsTheBuiltOnesBestFirst) {
  const auto vs = kernel_variants();
  ASSERT_FALSE(vs.empty());
  std::set<std::string> names;
  for (const auto& v : vs) EXPECT_TRUE(names.insert(v.name).second) << v.name << " listed twice";
  // The last is the baseline: the binary runs, so it does.
  EXPECT_TRUE(vs.back().runs_here) << vs.back().name;
  // "auto" takes the first that runs here.
  VariantGuard guard;
  ASSERT_TRUE(use_kernel_variant("auto").ok());
  for (const auto& v : vs) {
    if (!v.runs_here) continue;
    EXPECT_EQ(active_kernel_variant().name, v.name);
    break;
  }
  // Each ISA level adds to the one below it.
  for (size_t i = 0; i + 1 < vs.size(); ++i) {
    std::istringstream lower(vs[i + 1].isa);
    for (std::string ext; lower >> ext;) EXPECT_TRUE(vs[i].uses(ext)) << vs[i].name << " lacks " << ext;
  }
}

TEST(KernelVariant, RefusesUnknownAndUnrunnableNames) {
  VariantGuard guard;
  const Status unknown = use_kernel_variant("x86-64-v9");
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find(kernel_variants().back().name), std::string::npos) << unknown.message();
  for (const auto& v : kernel_variants()) {
    const Status s = use_kernel_variant(v.name);
    if (v.runs_here) {
      EXPECT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(active_kernel_variant().name, v.name);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << v.name;
      EXPECT_NE(s.message().find("lacks"), std::string::npos) << s.message();
    }
  }
}

// Every variant that runs here gives the same F32, F16, Q8_0 and Q4_K
// products within rounding (their summation orders differ), and switching
// changes which code runs: the baseline's quantised dots are the scalar ones.
TEST(KernelVariant, EveryRunnableVariantComputesTheSameProducts) {
  VariantGuard guard;
  constexpr int64_t kRows = 24, kCols = 512, kTokens = 9;  // 9 tokens: the GEMM and its tail
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(kRows * kCols), x(kTokens * kCols);
  for (auto& v : w) v = nd(g);
  for (auto& v : x) v = nd(g);
  std::vector<double> ref(kTokens * kRows, 0.0);
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t k = 0; k < kCols; ++k) ref[t * kRows + r] += double(w[r * kCols + k]) * x[t * kCols + k];

  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_K}) {
    const size_t row = gguf::ggml_nbytes(static_cast<uint32_t>(type), kCols).value();
    std::vector<uint8_t> bytes(row * kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_TRUE(gguf::quantize_row(type, w.data() + r * kCols, bytes.data() + r * row, kCols).ok());
    }
    WeightMatrix m;
    m.type = type;
    m.n_rows = kRows;
    m.n_cols = kCols;
    m.row_bytes = row;
    m.data = bytes.data();
    const double tol = type == gguf::GgmlType::kQ4_K ? 0.15 : type == gguf::GgmlType::kQ8_0 ? 0.02 : 1e-3;
    for (const auto& v : kernel_variants()) {
      if (!v.runs_here) continue;
      ASSERT_TRUE(use_kernel_variant(v.name).ok());
      std::vector<float> y(kTokens * kRows);
      matmul(m, x.data(), kTokens, y.data(), nullptr);
      double err = 0, norm = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        err += (y[i] - ref[i]) * (y[i] - ref[i]);
        norm += ref[i] * ref[i];
      }
      EXPECT_LT(std::sqrt(err / norm), tol) << v.name << " " << gguf::ggml_type_name(static_cast<uint32_t>(type));
      if (v.isa.empty()) {
        EXPECT_STREQ(quant_dot_isa(), "scalar") << v.name;
      }
      if (v.uses("avx2")) {
        EXPECT_STRNE(quant_dot_isa(), "scalar") << v.name;
      }
    }
  }
}

}  // namespace
}  // namespace spw::cpu
