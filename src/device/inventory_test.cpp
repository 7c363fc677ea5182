#include "device/inventory.h"

#include <gtest/gtest.h>

#include <string>

#include "device/device_test_util.h"

namespace spw::device {
namespace {

using testing::fixture;

const Finding* find(const DeviceInventory& inv, const std::string& probe, const std::string& subject,
                    const std::string& figure) {
  for (const Finding& f : inv.findings) {
    if (f.probe == probe && f.subject == subject && f.figure == figure) return &f;
  }
  return nullptr;
}

class FakeVulkan final : public VkMemoryBudgetProbe {
 public:
  std::vector<VkDeviceBudget> read() override {
    VkDeviceBudget d;
    d.device_name = "llvmpipe";
    VkHeapBudget h;
    h.heap_index = 0;
    h.device_local = true;
    h.heap_size_bytes = Reading<uint64_t>::of(2048, "vulkan:vkGetPhysicalDeviceMemoryProperties");
    h.budget_bytes = Reading<uint64_t>::unknown("VK_EXT_memory_budget not supported by llvmpipe");
    h.usage_bytes = Reading<uint64_t>::unknown("VK_EXT_memory_budget not supported by llvmpipe");
    d.heaps.push_back(h);
    return {d};
  }
};

TEST(Inventory, CollectsEveryProbeFromFixtureRoot) {
  CollectOptions o;
  o.root = fixture("v2");
  o.nvml_library = SPW_FAKE_NVML;
  DeviceInventory inv = collect_all(o);

  const Finding* total = find(inv, "host", "host", "mem_total");
  ASSERT_NE(total, nullptr);
  EXPECT_TRUE(total->known);
  EXPECT_EQ(total->number, 32768000ull * 1024);
  EXPECT_EQ(total->source, "/proc/meminfo");
  EXPECT_EQ(total->kind, Finding::Kind::kBytes);

  const Finding* max = find(inv, "cgroup", "/spillway.slice/app.service", "memory_max");
  ASSERT_NE(max, nullptr);
  EXPECT_TRUE(max->known && max->unlimited);
  EXPECT_EQ(format_finding_value(*max), "max (unlimited)");
  const Finding* eff = find(inv, "cgroup", "/spillway.slice/app.service", "memory_max_effective");
  ASSERT_NE(eff, nullptr);
  EXPECT_EQ(format_finding_value(*eff), "8.00 GiB");

  const Finding* vram = find(inv, "amd_sysfs", "card0", "vram_used");
  ASSERT_NE(vram, nullptr);
  EXPECT_EQ(vram->number, 1073741824u);
  EXPECT_EQ(vram->source, "sysfs:/sys/class/drm/card0/device/mem_info_vram_used");
  const Finding* skipped = find(inv, "amd_sysfs", "-", "skipped");
  ASSERT_NE(skipped, nullptr);
  EXPECT_EQ(skipped->text, "card1: vendor 0x8086, not AMD");
  const Finding* pci = find(inv, "amd_sysfs", "card0", "pci_device_id");
  ASSERT_NE(pci, nullptr);
  EXPECT_EQ(pci->text, "0x744c");

  const Finding* name = find(inv, "nvml", "gpu0", "name");
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(name->text, "Fake GPU 0 (spillway test)");
  const Finding* health = find(inv, "nvml", "gpu0", "health");
  ASSERT_NE(health, nullptr);
  EXPECT_EQ(health->text, "healthy");
  const Finding* proc = find(inv, "nvml", "gpu0 pid 1002", "process_memory_used");
  ASSERT_NE(proc, nullptr);
  EXPECT_EQ(proc->number, 2ull << 30);
  const Finding* na = find(inv, "nvml", "gpu0 pid 1003", "process_memory_used");
  ASSERT_NE(na, nullptr);
  EXPECT_FALSE(na->known);

  const Finding* vk = find(inv, "vulkan", "-", "heaps");
  ASSERT_NE(vk, nullptr);
  EXPECT_FALSE(vk->known);
  EXPECT_NE(vk->reason.find("VkMemoryBudgetProbe not provided"), std::string::npos);

  // Every finding states a source or a reason: nothing is silently unknown.
  for (const Finding& f : inv.findings) {
    if (f.known) {
      EXPECT_FALSE(f.source.empty()) << f.probe << " " << f.subject << " " << f.figure;
    } else {
      EXPECT_FALSE(f.reason.empty()) << f.probe << " " << f.subject << " " << f.figure;
    }
  }
}

TEST(Inventory, MissingNvmlAndVulkanSlot) {
  CollectOptions o;
  o.root = fixture("v1");
  o.nvml_library = "libspillway-no-such-nvml.so.1";
  FakeVulkan vk;
  o.vulkan = &vk;
  DeviceInventory inv = collect_all(o);
  const Finding* gpus = find(inv, "nvml", "-", "gpus");
  ASSERT_NE(gpus, nullptr);
  EXPECT_FALSE(gpus->known);
  EXPECT_EQ(gpus->reason.rfind("libspillway-no-such-nvml.so.1 not found: ", 0), 0u) << gpus->reason;
  const Finding* amd = find(inv, "amd_sysfs", "-", "gpus");
  ASSERT_NE(amd, nullptr);
  EXPECT_FALSE(amd->known);
  const Finding* budget = find(inv, "vulkan", "vk0 heap 0 (device-local)", "budget");
  ASSERT_NE(budget, nullptr);
  EXPECT_FALSE(budget->known);
  const Finding* size = find(inv, "vulkan", "vk0 heap 0 (device-local)", "heap_size");
  ASSERT_NE(size, nullptr);
  EXPECT_EQ(size->number, 2048u);
  const Finding* version = find(inv, "cgroup", "/process_api/abc", "version");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version->text, "v1");
}

TEST(Inventory, RealMachine) {
  CollectOptions o;
  o.nvml_library = "libspillway-no-such-nvml.so.1";  // the real one is covered in nvml_probe_test
  DeviceInventory inv = collect_all(o);
  const Finding* avail = find(inv, "host", "host", "mem_available");
  ASSERT_NE(avail, nullptr);
  EXPECT_TRUE(avail->known) << avail->reason;
  EXPECT_GT(avail->number, 0u);
  EXPECT_FALSE(inv.findings.empty());
}

}  // namespace
}  // namespace spw::device
