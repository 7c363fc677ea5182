#include "backend/vulkan/device_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "core/size.h"

namespace spw {

// Built in both the real and the stub library, so these are defined once here.
uint64_t largest_buffer_bytes(const VulkanDeviceInfo& info) {
  uint64_t b = info.max_storage_buffer_range;
  if (info.max_allocation_bytes > 0) b = std::min<uint64_t>(b, info.max_allocation_bytes);
  return b & ~uint64_t{3};
}

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kWeights: return "weights";
    case MemoryCategory::kKv: return "kv";
    case MemoryCategory::kScratch: return "scratch";
    case MemoryCategory::kStaging: return "staging";
  }
  return "?";
}

Result<uint64_t> parse_memory_size(const std::string& text) { return parse_byte_size(text); }

std::string format_vulkan_devices(const std::vector<VulkanDeviceInfo>& devices) {
  std::string o;
  for (const auto& d : devices) {
    o += "vulkan:" + std::to_string(d.index) + "  " + d.name + "\n";
    o += "  type " + d.type + ", vendor " + d.vendor + ", driver " + d.driver + ", Vulkan " + d.api_version + "\n";
    o += "  compute queue " + std::string(d.has_compute_queue ? "yes" : "no") + ", subgroup " +
         std::to_string(d.subgroup_size) + ", max storage buffer " + format_byte_size(d.max_storage_buffer_range) +
         ", max allocation " + format_byte_size(d.max_allocation_bytes) + "\n";
    for (size_t h = 0; h < d.heaps.size(); ++h) {
      const auto& hp = d.heaps[h];
      o += "  heap " + std::to_string(h) + ": " + format_byte_size(hp.size_bytes) +
           (hp.device_local ? " device-local" : " host");
      if (hp.budget_bytes >= 0) {
        o += ", budget " + format_byte_size(static_cast<uint64_t>(hp.budget_bytes)) + ", usage " +
             format_byte_size(static_cast<uint64_t>(hp.usage_bytes)) + " (VK_EXT_memory_budget)";
      } else {
        o += ", budget unknown (no VK_EXT_memory_budget)";
      }
      o += "\n";
    }
  }
  return o;
}

}  // namespace spw
