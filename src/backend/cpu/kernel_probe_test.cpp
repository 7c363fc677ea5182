// The decode-kernel probe (kernel_probe.h): real kernels on the real clock,
// and what it refuses.
#include "backend/cpu/kernel_probe.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/kernel_variant.h"
#include "core/sim_env.h"

namespace spw::cpu {
namespace {

TEST(KernelProbe, GivesAPlausibleRateForEachTypeTheBackendRuns) {
  // Loose bounds: one thread of an old laptop's vector kernels reads more
  // than 100 MB/s of weights, the scalar variant (no vector extension) more
  // than 10 MB/s even under ASan (49-720 MB/s there, by type); nothing reads
  // a TB/s from one core's L2.
  const double floor = active_kernel_variant().isa.empty() ? 1e7 : 1e8;
  for (gguf::GgmlType t : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0,
                           gguf::GgmlType::kQ4_0, gguf::GgmlType::kQ4_K, gguf::GgmlType::kQ6_K}) {
    KernelProbeOptions o;
    o.passes = 2;
    o.bytes_per_pass = size_t{1} << 20;
    Result<double> r = measure_decode_kernel_rate(Env::default_env(), t, o);
    ASSERT_TRUE(r.ok()) << gguf::ggml_type_name(static_cast<uint32_t>(t)) << ": " << r.status().to_string();
    std::printf("[probe] %s %.2f GB/s\n", gguf::ggml_type_name(static_cast<uint32_t>(t)).c_str(), *r / 1e9);
    EXPECT_GT(*r, floor) << gguf::ggml_type_name(static_cast<uint32_t>(t));
    EXPECT_LT(*r, 1e12) << gguf::ggml_type_name(static_cast<uint32_t>(t));
  }
}

TEST(KernelProbe, RefusesTypesTheBackendDoesNotRunAndBadOptions) {
  Result<double> r = measure_decode_kernel_rate(Env::default_env(), gguf::GgmlType::kIQ2_XXS);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("IQ2_XXS"), std::string::npos) << r.status().message();
  KernelProbeOptions o;
  o.passes = 0;
  EXPECT_EQ(measure_decode_kernel_rate(Env::default_env(), gguf::GgmlType::kQ8_0, o).status().code(),
            StatusCode::kInvalidArgument);
  o = KernelProbeOptions{};
  o.bytes_per_pass = o.matrix_bytes / 2;
  EXPECT_EQ(measure_decode_kernel_rate(Env::default_env(), gguf::GgmlType::kQ8_0, o).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(KernelProbe, ASimulatedClockGivesUnavailableNotAFigure) {
  SimEnv env;
  KernelProbeOptions o;
  o.passes = 1;
  o.bytes_per_pass = o.matrix_bytes;
  Result<double> r = measure_decode_kernel_rate(env, gguf::GgmlType::kQ4_K, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace spw::cpu
