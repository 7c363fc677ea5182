#include "core/duration.h"

#include <gtest/gtest.h>

namespace spw {
namespace {

TEST(Duration, SecondsAndUnits) {
  EXPECT_DOUBLE_EQ(*parse_duration_s("300"), 300);
  EXPECT_DOUBLE_EQ(*parse_duration_s(" 1.5 "), 1.5);
  EXPECT_DOUBLE_EQ(*parse_duration_s("5m"), 300);
  EXPECT_DOUBLE_EQ(*parse_duration_s("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(*parse_duration_s("90s"), 90);
  EXPECT_DOUBLE_EQ(*parse_duration_s("250ms"), 0.25);
  EXPECT_DOUBLE_EQ(*parse_duration_s("0"), 0);
  EXPECT_DOUBLE_EQ(*parse_duration_s("+2m"), 120);
}

TEST(Duration, NegativeMeansForever) {
  EXPECT_DOUBLE_EQ(*parse_duration_s("-1"), -1);
  EXPECT_DOUBLE_EQ(*parse_duration_s("-5m"), -1);
  EXPECT_DOUBLE_EQ(*parse_duration_s("-0"), 0);
}

TEST(Duration, BadTextIsNamed) {
  for (const char* t : {"", " ", "-", "m", "5x", "5m3", "1..2s", ".s", "nan", "inf", "99999999999h"}) {
    Result<double> r = parse_duration_s(t);
    ASSERT_FALSE(r.ok()) << t;
    EXPECT_NE(r.status().message().find(std::string("'") + t + "'"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace spw
