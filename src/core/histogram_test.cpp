#include "core/histogram.h"

#include <gtest/gtest.h>

#include <cmath>

namespace spw {
namespace {

TEST(Histogram, CountsEachObservationInTheFirstBucketThatHoldsIt) {
  Histogram h({1.0, 2.0, 4.0});
  for (double x : {0.5, 1.0, 1.5, 4.0, 9.0, std::nan("")}) h.observe(x);
  // <= 1: 0.5, 1.0; <= 2: + 1.5; <= 4: + 4.0; +Inf: + 9.0. NaN ignored.
  EXPECT_EQ(h.cumulative(), (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(h.count(), 5u);
  EXPECT_DOUBLE_EQ(h.sum(), 16.0);
  EXPECT_EQ(Histogram::exponential(0.5, 2.0, 4), (std::vector<double>{0.5, 1.0, 2.0, 4.0}));
  Histogram empty;
  empty.observe(1.0);
  EXPECT_EQ(empty.count(), 0u) << "no buckets, nothing counted";
}

}  // namespace
}  // namespace spw
