#include "core/size.h"

#include <string>

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

// One domain for every size: at most 1 PiB, so sums of sizes never wrap
// (a reservation of 2^64 - 2 GiB once turned a ledger's co-tenant total into 1 byte).
TEST(ByteSize, DomainEndsAtOnePebibyteForTextAndNumbers) {
  EXPECT_EQ(parse_byte_size("1024T").value(), kMaxByteSize);
  EXPECT_EQ(parse_byte_size(std::to_string(kMaxByteSize)).value(), kMaxByteSize);
  for (const std::string& big : {std::string("1025T"), std::to_string(kMaxByteSize + 1), std::string("18446744071669442151"),
                                std::string("18446744073709551615"), std::string("99999999999999999999999")}) {
    auto r = parse_byte_size(big);
    ASSERT_FALSE(r.ok()) << big;
    EXPECT_NE(r.status().message().find("1 PiB"), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(check_byte_size(kMaxByteSize, "bytes").ok());
  EXPECT_TRUE(check_byte_size(0, "bytes", /*allow_zero=*/true).ok());
  const Status zero = check_byte_size(0, "bytes");
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("bytes: must be above 0"), std::string::npos) << zero.message();
  const Status wrap = check_byte_size(18446744071669442151ull, "bytes");
  EXPECT_EQ(wrap.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrap.message().find("18446744071669442151 bytes is more than"), std::string::npos) << wrap.message();
}

TEST(ByteSize, FormattedWithThreeSignificantDigits) {
  EXPECT_EQ(format_byte_size(0), "0 B");
  EXPECT_EQ(format_byte_size(1023), "1023 B");
  EXPECT_EQ(format_byte_size(1024), "1.00 KiB");
  EXPECT_EQ(format_byte_size(1'184'000), "1.13 MiB");
  EXPECT_EQ(format_byte_size(26'633'830), "25.4 MiB");
  EXPECT_EQ(format_byte_size(uint64_t{972} << 20), "972 MiB");
  EXPECT_EQ(format_byte_size(uint64_t{8} << 30), "8.00 GiB");
  EXPECT_EQ(format_byte_size(uint64_t{3} << 39), "1.50 TiB");
  EXPECT_EQ(format_byte_size(kMaxByteSize), "1.00 PiB");
  EXPECT_EQ(format_byte_size(UINT64_MAX), "16.0 EiB");
  // Each formatted size reads back (parse_byte_size) to within its rounding.
  for (uint64_t b : {uint64_t{1536}, uint64_t{7} << 20, uint64_t{123456789}}) {
    auto back = parse_byte_size(format_byte_size(b));
    ASSERT_TRUE(back.ok()) << format_byte_size(b);
    EXPECT_NEAR(static_cast<double>(*back), static_cast<double>(b), static_cast<double>(b) * 0.006)
        << format_byte_size(b);
  }
}

}  // namespace
}  // namespace spw
