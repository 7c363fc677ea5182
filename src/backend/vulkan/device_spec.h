// The CLI's `--device-memory SIZE`, parsed, and the text block `spillway
// devices` prints for Vulkan (`--device` itself is core/placement.h). No
// Vulkan headers; works in builds without Vulkan.
//
// Contract: parse_memory_size() is core/size.h's parse_byte_size() without
// zero: a byte count with an optional K/M/G/T suffix (powers of 1024,
// optional trailing "iB"/"B"): "512M", "1.5GiB", "1048576"; InvalidArgument
// otherwise, or for 0.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "core/status.h"

namespace spw {

Result<uint64_t> parse_memory_size(const std::string& text);

// Human-readable lines for `spillway devices` (one block per device: name,
// type, vendor, driver, API, heaps with sizes and budget/usage or "budget
// unknown (no VK_EXT_memory_budget)", subgroup size, buffer limits).
std::string format_vulkan_devices(const std::vector<VulkanDeviceInfo>& devices);

}  // namespace spw
