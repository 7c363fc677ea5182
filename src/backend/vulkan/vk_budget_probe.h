// VulkanBudgetProbe: device::VkMemoryBudgetProbe (src/device/vk_memory_budget.h)
// over Vulkan backends, for `spillway devices` and admission control.
//
// Contract: read() returns one VkDeviceBudget per backend given at
// construction, re-querying the heaps each time (no device work, no blocking):
// heap sizes from vkGetPhysicalDeviceMemoryProperties; budget/usage from
// VK_EXT_memory_budget, or unknown with a reason naming the driver when the
// extension is missing (lavapipe) -- never the heap size passed off as a
// budget. An unhealthy or stub backend yields a device with no heaps.
// Thread safety: read() may be called from any thread.
#pragma once

#include <memory>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "device/vk_memory_budget.h"

namespace spw {

class VulkanBudgetProbe final : public device::VkMemoryBudgetProbe {
 public:
  explicit VulkanBudgetProbe(std::vector<std::shared_ptr<VulkanBackend>> backends) : backends_(std::move(backends)) {}
  std::vector<device::VkDeviceBudget> read() override;

 private:
  std::vector<std::shared_ptr<VulkanBackend>> backends_;
};

}  // namespace spw
