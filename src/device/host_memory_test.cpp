#include "device/host_memory.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "device/device_test_util.h"

namespace spw::device {
namespace {

using testing::fixture;
using testing::ScratchRoot;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(HostMemoryProbe, ReadsFixtureInBytes) {
  HostMemory m = HostMemoryProbe(Env::default_env(), fixture("v2")).read();
  ASSERT_TRUE(m.mem_total_bytes.known()) << m.mem_total_bytes.reason();
  EXPECT_EQ(m.mem_total_bytes.value(), 32768000ull * 1024);
  EXPECT_EQ(m.mem_total_bytes.source(), "/proc/meminfo");
  EXPECT_EQ(m.mem_available_bytes.value(), 24000000ull * 1024);
  EXPECT_EQ(m.mem_free_bytes.value(), 20000000ull * 1024);
  EXPECT_EQ(m.swap_total_bytes.value(), 8388604ull * 1024);
  EXPECT_EQ(m.swap_free_bytes.value(), 8000000ull * 1024);
  ASSERT_TRUE(m.process_rss_bytes.known()) << m.process_rss_bytes.reason();
  EXPECT_EQ(m.process_rss_bytes.value(), 256000ull * 1024);
  EXPECT_EQ(m.process_rss_bytes.source(), "/proc/self/status");
  EXPECT_EQ(m.process_peak_rss_bytes.value(), 512000ull * 1024);
  EXPECT_EQ(m.process_peak_rss_bytes.source(), "/proc/self/status");
  EXPECT_EQ(m.process_rss_anon_bytes.value(), 200000ull * 1024);
  EXPECT_EQ(m.process_rss_file_bytes.value(), 52000ull * 1024);
}

TEST(HostMemoryProbe, MappedRssSumsTheFilesSmapsEntries) {
  HostMemoryProbe p(Env::default_env(), fixture("v2"));
  auto r = p.mapped_rss("/models/m.gguf");
  ASSERT_TRUE(r.known()) << r.reason();
  EXPECT_EQ(r.value(), (65536ull + 1024) * 1024);
  EXPECT_EQ(r.source(), "/proc/self/smaps");
  auto spaced = p.mapped_rss("/models/with space.gguf");
  ASSERT_TRUE(spaced.known()) << spaced.reason();
  EXPECT_EQ(spaced.value(), 4096u);
  auto none = p.mapped_rss("/models/other.gguf");
  ASSERT_FALSE(none.known());
  EXPECT_TRUE(contains(none.reason(), "not mapped")) << none.reason();
  auto missing = HostMemoryProbe(Env::default_env(), fixture("v1")).mapped_rss("/models/m.gguf");
  EXPECT_FALSE(missing.known());
}

TEST(HostMemoryProbe, MalformedFieldsAreUnknownWithReasons) {
  HostMemory m = HostMemoryProbe(Env::default_env(), fixture("malformed")).read();
  ASSERT_FALSE(m.mem_total_bytes.known());
  EXPECT_TRUE(contains(m.mem_total_bytes.reason(), "MemTotal")) << m.mem_total_bytes.reason();
  EXPECT_TRUE(contains(m.mem_total_bytes.reason(), "not an unsigned decimal")) << m.mem_total_bytes.reason();
  ASSERT_FALSE(m.mem_available_bytes.known());
  EXPECT_EQ(m.mem_available_bytes.reason(), "MemAvailable not found in /proc/meminfo");
  ASSERT_FALSE(m.mem_free_bytes.known());
  EXPECT_TRUE(contains(m.mem_free_bytes.reason(), "no 'kB' unit")) << m.mem_free_bytes.reason();
  ASSERT_FALSE(m.swap_total_bytes.known());
  EXPECT_TRUE(contains(m.swap_total_bytes.reason(), "overflows")) << m.swap_total_bytes.reason();
  ASSERT_FALSE(m.swap_free_bytes.known());
  EXPECT_TRUE(contains(m.swap_free_bytes.reason(), "'-5'")) << m.swap_free_bytes.reason();
  ASSERT_FALSE(m.process_rss_bytes.known());
  EXPECT_TRUE(contains(m.process_rss_bytes.reason(), "VmRSS")) << m.process_rss_bytes.reason();
  // The fixture is not the real root, so no getrusage fallback may hide this.
  ASSERT_FALSE(m.process_peak_rss_bytes.known());
  EXPECT_EQ(m.process_peak_rss_bytes.reason(), "VmHWM not found in /proc/self/status");
}

TEST(HostMemoryProbe, ContradictoryFiguresAreNotTrusted) {
  HostMemory m = HostMemoryProbe(Env::default_env(), fixture("inconsistent")).read();
  EXPECT_TRUE(m.mem_total_bytes.known());
  ASSERT_FALSE(m.mem_available_bytes.known());
  EXPECT_TRUE(contains(m.mem_available_bytes.reason(), "exceeds MemTotal")) << m.mem_available_bytes.reason();
  EXPECT_FALSE(m.mem_free_bytes.known());
  EXPECT_FALSE(m.swap_free_bytes.known());
  EXPECT_TRUE(m.process_rss_bytes.known());
  ASSERT_FALSE(m.process_peak_rss_bytes.known());
  EXPECT_TRUE(contains(m.process_peak_rss_bytes.reason(), "below VmRSS")) << m.process_peak_rss_bytes.reason();
}

TEST(HostMemoryProbe, MissingFilesGiveUnknownNamingThePath) {
  ScratchRoot root;
  HostMemory m = HostMemoryProbe(Env::default_env(), root.path()).read();
  for (const Reading<uint64_t>* r : {&m.mem_total_bytes, &m.mem_available_bytes, &m.mem_free_bytes,
                                     &m.swap_total_bytes, &m.swap_free_bytes}) {
    ASSERT_FALSE(r->known());
    EXPECT_TRUE(contains(r->reason(), root.path() + "/proc/meminfo")) << r->reason();
  }
  ASSERT_FALSE(m.process_rss_bytes.known());
  EXPECT_TRUE(contains(m.process_rss_bytes.reason(), "/proc/self/status")) << m.process_rss_bytes.reason();
  EXPECT_FALSE(m.process_peak_rss_bytes.known());
}

TEST(HostMemoryProbe, ZeroTotalIsUnknown) {
  ScratchRoot root;
  root.write("proc/meminfo", "MemTotal: 0 kB\nMemAvailable: 0 kB\n");
  HostMemory m = HostMemoryProbe(Env::default_env(), root.path()).read();
  EXPECT_FALSE(m.mem_total_bytes.known());
  EXPECT_TRUE(m.mem_available_bytes.known());  // 0 available is a real (dire) reading
  EXPECT_EQ(m.mem_available_bytes.value(), 0u);
}

TEST(HostMemoryProbe, RealMachineIsConsistent) {
  // Touch memory so this process has a visible resident set.
  std::vector<char> block(8 << 20, 1);
  HostMemory m = HostMemoryProbe(Env::default_env()).read();
  ASSERT_TRUE(m.mem_total_bytes.known()) << m.mem_total_bytes.reason();
  ASSERT_TRUE(m.mem_available_bytes.known()) << m.mem_available_bytes.reason();
  EXPECT_GT(m.mem_total_bytes.value(), 0u);
  EXPECT_LE(m.mem_available_bytes.value(), m.mem_total_bytes.value());
  EXPECT_LE(m.mem_free_bytes.value(), m.mem_total_bytes.value());
  ASSERT_TRUE(m.swap_total_bytes.known());
  ASSERT_TRUE(m.swap_free_bytes.known());
  EXPECT_LE(m.swap_free_bytes.value(), m.swap_total_bytes.value());
  ASSERT_TRUE(m.process_rss_bytes.known()) << m.process_rss_bytes.reason();
  ASSERT_TRUE(m.process_peak_rss_bytes.known()) << m.process_peak_rss_bytes.reason();
  EXPECT_GE(m.process_rss_bytes.value(), block.size());
  EXPECT_LE(m.process_rss_bytes.value(), m.process_peak_rss_bytes.value());
  EXPECT_LT(m.process_peak_rss_bytes.value(), m.mem_total_bytes.value());
  volatile char sink = block[block.size() / 2];
  (void)sink;
  ASSERT_TRUE(m.process_rss_anon_bytes.known()) << m.process_rss_anon_bytes.reason();
  ASSERT_TRUE(m.process_rss_file_bytes.known()) << m.process_rss_file_bytes.reason();
  EXPECT_GE(m.process_rss_anon_bytes.value(), block.size());
  EXPECT_LE(m.process_rss_anon_bytes.value() + m.process_rss_file_bytes.value(), m.process_rss_bytes.value());
}

// A prefaulted mapping is resident as file pages at once (what the estimator
// counts for the model's weights); a plain one only as it is touched.
TEST(HostMemoryProbe, PrefaultedMappingShowsAsRssFile) {
  const std::string path = ::testing::TempDir() + "/spw_prefault.bin";
  ASSERT_TRUE(Env::default_env().write_file(path, std::string(16 << 20, 'x')).ok());
  auto file_rss = [] {
    auto r = HostMemoryProbe(Env::default_env()).read().process_rss_file_bytes;
    EXPECT_TRUE(r.known()) << r.reason();
    return r.value_or(0);
  };
  const uint64_t before = file_rss();
  auto lazy = Env::default_env().map_file(path);
  ASSERT_TRUE(lazy.ok());
  const uint64_t after_lazy = file_rss();
  auto eager = Env::default_env().map_file(path, MapOptions{true});
  ASSERT_TRUE(eager.ok());
  const uint64_t after_eager = file_rss();
  EXPECT_LT(after_lazy, before + (1u << 20)) << "an untouched mapping adds no resident pages";
  EXPECT_GE(after_eager, after_lazy + (15u << 20)) << "MAP_POPULATE maps the whole file";
  // Both mappings are of the same file: smaps sums them (16 MiB + ~0).
  auto mapped = HostMemoryProbe(Env::default_env()).mapped_rss(path);
  ASSERT_TRUE(mapped.known()) << mapped.reason();
  EXPECT_GE(mapped.value(), 16u << 20);
  EXPECT_LT(mapped.value(), 17u << 20);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace spw::device
