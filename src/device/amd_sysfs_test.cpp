#include "device/amd_sysfs.h"

#include <gtest/gtest.h>

#include <string>

#include "device/device_test_util.h"

namespace spw::device {
namespace {

using testing::fixture;
using testing::ScratchRoot;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(AmdSysfsProbe, ReadsAmdCardAndSkipsOthers) {
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env(), fixture("v2")).read();
  ASSERT_EQ(r.gpus.size(), 1u) << r.none_reason;
  EXPECT_TRUE(r.none_reason.empty());
  const AmdGpu& g = r.gpus[0];
  EXPECT_EQ(g.card, "card0");
  EXPECT_EQ(g.device_dir, "/sys/class/drm/card0/device");
  EXPECT_EQ(g.pci_device_id.value(), 0x744cu);
  ASSERT_TRUE(g.vram_total_bytes.known()) << g.vram_total_bytes.reason();
  EXPECT_EQ(g.vram_total_bytes.value(), 25753026560u);
  EXPECT_EQ(g.vram_total_bytes.source(), "sysfs:/sys/class/drm/card0/device/mem_info_vram_total");
  EXPECT_EQ(g.vram_used_bytes.value(), 1073741824u);
  EXPECT_EQ(g.vram_used_bytes.source(), "sysfs:/sys/class/drm/card0/device/mem_info_vram_used");
  EXPECT_EQ(g.gtt_total_bytes.value(), 33554432000u);
  EXPECT_EQ(g.gtt_used_bytes.value(), 104857600u);
  EXPECT_EQ(g.busy_percent.value(), 7u);
  // card1 is Intel; card0-DP-1 and renderD128 are not cards.
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], "card1: vendor 0x8086, not AMD");
}

TEST(AmdSysfsProbe, MalformedFilesAreUnknown) {
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env(), fixture("malformed")).read();
  ASSERT_EQ(r.gpus.size(), 1u) << r.none_reason;
  const AmdGpu& g = r.gpus[0];
  ASSERT_FALSE(g.pci_device_id.known());
  EXPECT_TRUE(contains(g.pci_device_id.reason(), "0x-prefixed")) << g.pci_device_id.reason();
  ASSERT_FALSE(g.vram_total_bytes.known());
  EXPECT_TRUE(contains(g.vram_total_bytes.reason(), "mem_info_vram_total")) << g.vram_total_bytes.reason();
  ASSERT_FALSE(g.vram_used_bytes.known());
  EXPECT_TRUE(contains(g.vram_used_bytes.reason(), "'-1'")) << g.vram_used_bytes.reason();
  ASSERT_FALSE(g.gtt_total_bytes.known());
  EXPECT_TRUE(contains(g.gtt_total_bytes.reason(), "mem_info_gtt_total")) << g.gtt_total_bytes.reason();
  ASSERT_FALSE(g.busy_percent.known());
  EXPECT_TRUE(contains(g.busy_percent.reason(), "above 100")) << g.busy_percent.reason();
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_TRUE(contains(r.skipped[0], "card2:")) << r.skipped[0];
  EXPECT_TRUE(contains(r.skipped[0], "not a 0x-prefixed hex")) << r.skipped[0];
  EXPECT_TRUE(contains(r.skipped[1], "card3:")) << r.skipped[1];
  EXPECT_TRUE(contains(r.skipped[1], "vendor")) << r.skipped[1];
}

TEST(AmdSysfsProbe, UsedAboveTotalIsUnknown) {
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env(), fixture("inconsistent")).read();
  ASSERT_EQ(r.gpus.size(), 1u);
  EXPECT_TRUE(r.gpus[0].vram_total_bytes.known());
  ASSERT_FALSE(r.gpus[0].vram_used_bytes.known());
  EXPECT_TRUE(contains(r.gpus[0].vram_used_bytes.reason(), "exceeds total")) << r.gpus[0].vram_used_bytes.reason();
  EXPECT_TRUE(r.gpus[0].gtt_used_bytes.known());  // equal to total is fine
  EXPECT_FALSE(r.gpus[0].busy_percent.known());    // absent
}

TEST(AmdSysfsProbe, NoDrmDirectory) {
  ScratchRoot root;
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env(), root.path()).read();
  EXPECT_TRUE(r.gpus.empty());
  EXPECT_TRUE(contains(r.none_reason, "cannot list " + root.path() + "/sys/class/drm")) << r.none_reason;
}

TEST(AmdSysfsProbe, CardsOrderedNumerically) {
  ScratchRoot root;
  for (const char* card : {"card10", "card2"}) {
    root.write(std::string("sys/class/drm/") + card + "/device/vendor", "0x1002\n");
    root.write(std::string("sys/class/drm/") + card + "/device/mem_info_vram_total", "100\n");
  }
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env(), root.path()).read();
  ASSERT_EQ(r.gpus.size(), 2u);
  EXPECT_EQ(r.gpus[0].card, "card2");
  EXPECT_EQ(r.gpus[1].card, "card10");
  EXPECT_FALSE(r.gpus[0].vram_used_bytes.known());
}

TEST(AmdSysfsProbe, RealMachineNeverCrashesAndExplainsAbsence) {
  AmdSysfsReport r = AmdSysfsProbe(Env::default_env()).read();
  if (r.gpus.empty()) {
    EXPECT_FALSE(r.none_reason.empty());
  }
  for (const AmdGpu& g : r.gpus) {
    if (g.vram_total_bytes.known() && g.vram_used_bytes.known()) {
      EXPECT_LE(g.vram_used_bytes.value(), g.vram_total_bytes.value());
    }
  }
}

}  // namespace
}  // namespace spw::device
