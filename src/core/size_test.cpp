#include "core/size.h"

#include <gtest/gtest.h>

namespace spw {
namespace {

TEST(ByteSize, PowersOf1024WithOrWithoutIbAndSpaces) {
  EXPECT_EQ(parse_byte_size("512M").value(), 512ull << 20);
  EXPECT_EQ(parse_byte_size("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(parse_byte_size("64 MiB").value(), 64ull << 20);
  EXPECT_EQ(parse_byte_size(" 2kb ").value(), 2048u);
  EXPECT_EQ(parse_byte_size("1048576").value(), 1048576u);
  EXPECT_EQ(parse_byte_size("7b").value(), 7u);
  EXPECT_EQ(parse_byte_size("1T").value(), 1ull << 40);
}

TEST(ByteSize, RefusalsNameTheText) {
  for (const char* bad : {"", "-5", "+5", "inf", "nan", "0x10", "5X", "5 MB extra", "M", "1e30"}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(parse_byte_size("0").ok()) << "zero is no size for a budget";
  EXPECT_FALSE(parse_byte_size("0.2").ok()) << "rounds to zero";
  EXPECT_EQ(parse_byte_size("0", /*allow_zero=*/true).value(), 0u);
}

}  // namespace
}  // namespace spw
