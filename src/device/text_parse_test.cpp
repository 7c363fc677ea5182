#include "device/text_parse.h"

#include <gtest/gtest.h>

namespace spw::device {
namespace {

TEST(TextParse, JoinRoot) {
  EXPECT_EQ(join_root("/", "/proc/meminfo"), "/proc/meminfo");
  EXPECT_EQ(join_root("", "/proc/meminfo"), "/proc/meminfo");
  EXPECT_EQ(join_root("/tmp/r", "/proc/meminfo"), "/tmp/r/proc/meminfo");
  EXPECT_EQ(join_root("/tmp/r//", "/proc/meminfo"), "/tmp/r/proc/meminfo");
}

TEST(TextParse, U64AcceptsOnlyPlainDecimal) {
  EXPECT_EQ(*parse_u64("4096\n"), 4096u);
  EXPECT_EQ(*parse_u64("  0 "), 0u);
  EXPECT_EQ(*parse_u64("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", " \n", "-1", "+1", "12abc", "1 2", "0x10", "18446744073709551616", "1.5"}) {
    auto r = parse_u64(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(TextParse, HexAndLimit) {
  EXPECT_EQ(*parse_hex_u64("0x1002\n"), 0x1002u);
  EXPECT_EQ(*parse_hex_u64("0XaBcD"), 0xabcdu);
  EXPECT_FALSE(parse_hex_u64("1002").ok());
  EXPECT_FALSE(parse_hex_u64("0x").ok());
  EXPECT_FALSE(parse_hex_u64("0x10g2").ok());
  EXPECT_FALSE(parse_hex_u64("0x11112222333344445").ok());

  EXPECT_EQ(*parse_cgroup_limit("max\n"), ByteLimit::none());
  EXPECT_EQ(*parse_cgroup_limit("8589934592\n"), ByteLimit::of(8589934592ull));
  auto bad = parse_cgroup_limit("lots");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected 'max' or bytes"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(parse_cgroup_limit("Max").ok());
  EXPECT_FALSE(parse_cgroup_limit("").ok());
}

TEST(TextParse, KbValues) {
  EXPECT_EQ(*parse_kb_value("24683568 kB"), 24683568ull * 1024);
  EXPECT_EQ(*parse_kb_value("0 kB"), 0u);
  EXPECT_FALSE(parse_kb_value("1234").ok());         // no unit
  EXPECT_FALSE(parse_kb_value("1234 MB").ok());      // wrong unit
  EXPECT_FALSE(parse_kb_value("abc kB").ok());
  EXPECT_FALSE(parse_kb_value("18014398509481984 kB").ok());  // 2^54 kB = 2^64 bytes overflows
  EXPECT_EQ(*parse_kb_value("18014398509481983 kB"), 18014398509481983ull * 1024);
}

TEST(TextParse, KeyedLines) {
  auto c = parse_colon_lines("MemTotal:  10 kB\nno colon here\nMemTotal: 20 kB\n: empty key\nName:\tx y\n");
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c["MemTotal"], "10 kB");  // first occurrence wins
  EXPECT_EQ(c["Name"], "x y");
  auto s = parse_space_lines("oom 1\n  oom_kill\t2\nlonely\n\n");
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s["oom"], "1");
  EXPECT_EQ(s["oom_kill"], "2");

  Reading<uint64_t> r = kb_field(c, "MemTotal", "/proc/meminfo");
  ASSERT_TRUE(r.known());
  EXPECT_EQ(r.value(), 10240u);
  EXPECT_EQ(r.source(), "/proc/meminfo");
  Reading<uint64_t> missing = kb_field(c, "MemAvailable", "/proc/meminfo");
  EXPECT_FALSE(missing.known());
  EXPECT_EQ(missing.reason(), "MemAvailable not found in /proc/meminfo");
  EXPECT_EQ(missing.value_or(7), 7u);
}

TEST(TextParse, LongGarbageIsQuotedShort) {
  std::string garbage(10000, 'z');
  auto r = parse_u64(garbage);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 120u);
}

}  // namespace
}  // namespace spw::device
