#include "device/cgroup.h"

#include <gtest/gtest.h>

#include <string>

#include "device/device_test_util.h"

namespace spw::device {
namespace {

using testing::fixture;
using testing::ScratchRoot;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(CgroupProbe, V2FixtureReadsEveryFile) {
  CgroupMemory m = CgroupProbe(Env::default_env(), fixture("v2")).read();
  ASSERT_EQ(m.version, 2) << m.none_reason;
  EXPECT_EQ(m.path, "/spillway.slice/app.service");
  EXPECT_EQ(m.directory, "/sys/fs/cgroup/spillway.slice/app.service");
  const std::string dir = "cgroup:/sys/fs/cgroup/spillway.slice/app.service/";
  ASSERT_TRUE(m.max.known()) << m.max.reason();
  EXPECT_TRUE(m.max.value().unlimited);
  EXPECT_EQ(m.max.source(), dir + "memory.max");
  // The parent's 8 GiB binds the child whose own limit is "max".
  ASSERT_TRUE(m.effective_max.known()) << m.effective_max.reason();
  EXPECT_EQ(m.effective_max.value(), ByteLimit::of(8 * kGiB));
  EXPECT_EQ(m.effective_max.source(), "cgroup:/sys/fs/cgroup/spillway.slice/memory.max");
  EXPECT_EQ(m.high.value(), ByteLimit::of(6 * kGiB));
  EXPECT_EQ(m.current_bytes.value(), 1 * kGiB);
  EXPECT_EQ(m.current_bytes.source(), dir + "memory.current");
  EXPECT_EQ(m.peak_bytes.value(), 2 * kGiB);
  EXPECT_EQ(m.swap_max.value(), ByteLimit::of(0));
  ASSERT_TRUE(m.oom_events.known()) << m.oom_events.reason();
  EXPECT_EQ(m.oom_events.value(), 1u);
  EXPECT_EQ(m.oom_events.source(), dir + "memory.events oom");
  EXPECT_EQ(m.oom_kill_events.value(), 1u);
}

TEST(CgroupProbe, V1HybridFixtureFallsBackToV1) {
  CgroupMemory m = CgroupProbe(Env::default_env(), fixture("v1")).read();
  ASSERT_EQ(m.version, 1) << m.none_reason;
  EXPECT_EQ(m.path, "/process_api/abc");
  EXPECT_EQ(m.directory, "/sys/fs/cgroup/memory/process_api/abc");
  ASSERT_TRUE(m.max.known()) << m.max.reason();
  EXPECT_TRUE(m.max.value().unlimited);  // 9223372036854771712 is v1's "unlimited"
  EXPECT_EQ(m.max.source(), "cgroup-v1:/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes");
  ASSERT_TRUE(m.effective_max.known()) << m.effective_max.reason();
  EXPECT_EQ(m.effective_max.value(), ByteLimit::of(4 * kGiB));
  EXPECT_EQ(m.current_bytes.value(), 3923968u);
  EXPECT_EQ(m.peak_bytes.value(), 4214784u);
  EXPECT_EQ(m.oom_kill_events.value(), 3u);
  EXPECT_FALSE(m.high.known());
  EXPECT_FALSE(m.swap_max.known());
  EXPECT_FALSE(m.oom_events.known());
  EXPECT_TRUE(contains(m.high.reason(), "cgroup v1")) << m.high.reason();
}

TEST(CgroupProbe, MalformedFilesAreUnknownEachWithItsReason) {
  CgroupMemory m = CgroupProbe(Env::default_env(), fixture("malformed")).read();
  ASSERT_EQ(m.version, 2) << m.none_reason;
  ASSERT_FALSE(m.max.known());
  EXPECT_TRUE(contains(m.max.reason(), "memory.max")) << m.max.reason();
  EXPECT_TRUE(contains(m.max.reason(), "expected 'max' or bytes")) << m.max.reason();
  ASSERT_FALSE(m.effective_max.known());
  EXPECT_TRUE(contains(m.effective_max.reason(), "unreadable")) << m.effective_max.reason();
  ASSERT_FALSE(m.current_bytes.known());
  EXPECT_TRUE(contains(m.current_bytes.reason(), "empty number")) << m.current_bytes.reason();
  EXPECT_FALSE(m.peak_bytes.known());
  ASSERT_FALSE(m.swap_max.known());
  EXPECT_TRUE(contains(m.swap_max.reason(), "'-1'")) << m.swap_max.reason();
  ASSERT_FALSE(m.high.known());
  EXPECT_TRUE(contains(m.high.reason(), "memory.high")) << m.high.reason();
  ASSERT_FALSE(m.oom_events.known());
  EXPECT_TRUE(contains(m.oom_events.reason(), "'oom'")) << m.oom_events.reason();
  ASSERT_FALSE(m.oom_kill_events.known());
  EXPECT_TRUE(contains(m.oom_kill_events.reason(), "'oom_kill' not found")) << m.oom_kill_events.reason();
}

TEST(CgroupProbe, RootCgroupHasNoLimitFiles) {
  CgroupMemory m = CgroupProbe(Env::default_env(), fixture("inconsistent")).read();
  EXPECT_EQ(m.version, 0);
  EXPECT_TRUE(contains(m.none_reason, "root cgroup")) << m.none_reason;
  EXPECT_FALSE(m.max.known());
  EXPECT_EQ(m.max.reason(), m.none_reason);
  EXPECT_EQ(m.oom_kill_events.reason(), m.none_reason);
}

TEST(CgroupProbe, NoProcSelfCgroup) {
  ScratchRoot root;
  CgroupMemory m = CgroupProbe(Env::default_env(), root.path()).read();
  EXPECT_EQ(m.version, 0);
  EXPECT_TRUE(contains(m.none_reason, root.path() + "/proc/self/cgroup")) << m.none_reason;
  EXPECT_FALSE(m.current_bytes.known());
}

TEST(CgroupProbe, GarbageProcSelfCgroup) {
  ScratchRoot root;
  root.write("proc/self/cgroup", "\x01\x02 not a cgroup file\n::::\n");
  CgroupMemory m = CgroupProbe(Env::default_env(), root.path()).read();
  EXPECT_EQ(m.version, 0);
  EXPECT_FALSE(m.none_reason.empty());
}

TEST(CgroupProbe, PathOutsideMountedRootIsRefused) {
  ScratchRoot root;
  root.write("proc/self/cgroup", "0::/a/b\n");
  root.write("proc/self/mountinfo", "26 23 0:25 /c /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  root.write("sys/fs/cgroup/memory.max", "100\n");
  CgroupMemory m = CgroupProbe(Env::default_env(), root.path()).read();
  EXPECT_EQ(m.version, 0);
  EXPECT_TRUE(contains(m.none_reason, "outside the mounted hierarchy root '/c'")) << m.none_reason;
}

TEST(CgroupProbe, MountRootIsStrippedAndEscapesDecoded) {
  ScratchRoot root;
  root.write("proc/self/cgroup", "0::/pod/app\n");
  root.write("proc/self/mountinfo", "26 23 0:25 /pod /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n");
  root.write("mnt/cg two/app/memory.max", "1048576\n");
  root.write("mnt/cg two/memory.max", "524288\n");  // the visible hierarchy root is limited too
  CgroupMemory m = CgroupProbe(Env::default_env(), root.path()).read();
  ASSERT_EQ(m.version, 2) << m.none_reason;
  EXPECT_EQ(m.directory, "/mnt/cg two/app");
  EXPECT_EQ(m.max.value(), ByteLimit::of(1048576));
  EXPECT_EQ(m.effective_max.value(), ByteLimit::of(524288));
  EXPECT_FALSE(m.current_bytes.known());  // file absent: only that reading is unknown
}

TEST(CgroupProbe, WithoutMountinfoUsesConventionalMount) {
  ScratchRoot root;
  root.write("proc/self/cgroup", "0::/svc\n");
  root.write("sys/fs/cgroup/svc/memory.max", "max\n");
  root.write("sys/fs/cgroup/svc/memory.current", "4096\n");
  CgroupMemory m = CgroupProbe(Env::default_env(), root.path()).read();
  ASSERT_EQ(m.version, 2) << m.none_reason;
  EXPECT_EQ(m.current_bytes.value(), 4096u);
  EXPECT_TRUE(m.effective_max.value().unlimited);
}

TEST(CgroupProbe, RealMachineReadingsAreConsistent) {
  CgroupMemory m = CgroupProbe(Env::default_env()).read();
  if (m.version == 0) {
    EXPECT_FALSE(m.none_reason.empty());
    EXPECT_FALSE(m.max.known());
    GTEST_SKIP() << "no memory cgroup: " << m.none_reason;
  }
  EXPECT_TRUE(m.version == 1 || m.version == 2);
  EXPECT_FALSE(m.directory.empty());
  ASSERT_TRUE(m.max.known()) << m.max.reason();
  ASSERT_TRUE(m.current_bytes.known()) << m.current_bytes.reason();
  EXPECT_GT(m.current_bytes.value(), 0u);
  ASSERT_TRUE(m.effective_max.known()) << m.effective_max.reason();
  if (!m.max.value().unlimited) {
    EXPECT_FALSE(m.effective_max.value().unlimited);
    EXPECT_LE(m.effective_max.value().bytes, m.max.value().bytes);
  }
  if (!m.effective_max.value().unlimited) {
    EXPECT_LE(m.current_bytes.value(), m.effective_max.value().bytes);
  }
  if (m.peak_bytes.known()) {
    EXPECT_GE(m.peak_bytes.value(), m.current_bytes.value());
  }
}

}  // namespace
}  // namespace spw::device
