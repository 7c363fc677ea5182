// Test set-up for the kernel tests: runs them on the variant named by
// SPILLWAY_CPU_VARIANT (kernel_variant.h; ctest's TEST.NAME runs set it), or
// the best when it is unset. A variant this CPU cannot run skips the whole
// binary with "does not run on this machine", which ctest reports as skipped
// (SKIP_REGULAR_EXPRESSION, src/backend/CMakeLists.txt). Include from one
// source of a test binary.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/kernel_variant.h"

namespace spw::cpu {

class KernelVariantEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const Status s = use_kernel_variant_from_env();
    if (s.code() == StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << "kernel variant does not run on this machine: " << s.message();
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    std::printf("CPU kernel variant: %s\n", active_kernel_variant().name.c_str());
  }
};

inline ::testing::Environment* const kKernelVariantEnvironment =
    ::testing::AddGlobalTestEnvironment(new KernelVariantEnvironment);

}  // namespace spw::cpu
