// VkMemoryBudgetProbe: the interface slot through which the Vulkan backend will
// report per-heap memory budgets (VK_EXT_memory_budget). Nothing here links
// Vulkan; the backend (a later task) implements this class and hands an
// instance to collect_all() and to admission.
//
// Contract for implementations: read() returns one VkDeviceBudget per physical
// device the backend uses. heap_size_bytes comes from
// vkGetPhysicalDeviceMemoryProperties (source
// "vulkan:vkGetPhysicalDeviceMemoryProperties"). budget_bytes and usage_bytes
// come from VkPhysicalDeviceMemoryBudgetPropertiesEXT::heapBudget / heapUsage
// (source "vulkan:VK_EXT_memory_budget") and are unknown, with a reason naming
// the driver, when the extension is not supported (lavapipe does not support
// it): the heap size is never passed off as a budget. read() must not block on
// device work and must not throw.
// Thread safety: implementations must allow read() from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/reading.h"

namespace spw::device {

inline constexpr const char* kVkBudgetSource = "vulkan:VK_EXT_memory_budget";

struct VkHeapBudget {
  uint32_t heap_index = 0;
  bool device_local = false;            // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
  Reading<uint64_t> heap_size_bytes;    // VkMemoryHeap::size
  Reading<uint64_t> budget_bytes;       // heapBudget: what this process may use now
  Reading<uint64_t> usage_bytes;        // heapUsage: what this process uses now
};

struct VkDeviceBudget {
  std::string device_name;  // VkPhysicalDeviceProperties::deviceName
  std::string driver;       // e.g. "llvmpipe (Mesa 22.3)"
  std::vector<VkHeapBudget> heaps;
};

class VkMemoryBudgetProbe {
 public:
  virtual ~VkMemoryBudgetProbe() = default;
  virtual std::vector<VkDeviceBudget> read() = 0;
};

}  // namespace spw::device
