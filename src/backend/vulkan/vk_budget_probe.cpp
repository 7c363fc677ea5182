#include "backend/vulkan/vk_budget_probe.h"

namespace spw {

std::vector<device::VkDeviceBudget> VulkanBudgetProbe::read() {
  std::vector<device::VkDeviceBudget> out;
  for (const auto& b : backends_) {
    device::VkDeviceBudget d;
    const VulkanDeviceInfo& info = b->device_info();
    d.device_name = info.name;
    d.driver = info.driver;
    const DeviceMemoryStats st = b->memory_stats();
    for (size_t i = 0; i < st.heaps.size(); ++i) {
      const VulkanHeapInfo& h = st.heaps[i];
      device::VkHeapBudget hb;
      hb.heap_index = static_cast<uint32_t>(i);
      hb.device_local = h.device_local;
      hb.heap_size_bytes =
          device::Reading<uint64_t>::of(h.size_bytes, "vulkan:vkGetPhysicalDeviceMemoryProperties");
      if (h.budget_bytes >= 0) {
        hb.budget_bytes = device::Reading<uint64_t>::of(static_cast<uint64_t>(h.budget_bytes), device::kVkBudgetSource);
        hb.usage_bytes = device::Reading<uint64_t>::of(static_cast<uint64_t>(h.usage_bytes), device::kVkBudgetSource);
      } else {
        const std::string why = "VK_EXT_memory_budget not supported by " + info.driver;
        hb.budget_bytes = device::Reading<uint64_t>::unknown(why);
        hb.usage_bytes = device::Reading<uint64_t>::unknown(why);
      }
      d.heaps.push_back(std::move(hb));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace spw
