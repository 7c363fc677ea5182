// The CLI's `--device-memory SIZE`, parsed, and the text block `spillway
// devices` prints for Vulkan; plus, transitionally, the old spelling of the
// `--device` placement (core/placement.h is the one type now). No Vulkan
// headers; works in builds without Vulkan.
//
// Contract: parse_memory_size() accepts a byte count with an optional K/M/G/T
// suffix (powers of 1024, optional trailing "iB"/"B"): "512M", "1.5GiB",
// "1048576"; InvalidArgument otherwise, or for 0.
// DeviceSpec, parse_device_spec() and gpu_layer_count() are Placement,
// Placement::parse() and Placement::gpu_layer_count() under their old names.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "core/placement.h"
#include "core/status.h"

namespace spw {

// TRANSITIONAL: src/app/cmd_serve.cpp and src/serve/ (owned elsewhere) still
// say DeviceSpec / parse_device_spec / gpu_layer_count. New code uses
// Placement directly; delete these three once those files have moved over.
using DeviceSpec = Placement;
inline Result<Placement> parse_device_spec(const std::string& text) { return Placement::parse(text); }
inline int32_t gpu_layer_count(const Placement& placement, int32_t n_layer) {
  return placement.gpu_layer_count(n_layer);
}

Result<uint64_t> parse_memory_size(const std::string& text);

// Human-readable lines for `spillway devices` (one block per device: name,
// type, vendor, driver, API, heaps with sizes and budget/usage or "budget
// unknown (no VK_EXT_memory_budget)", subgroup size, buffer limits).
std::string format_vulkan_devices(const std::vector<VulkanDeviceInfo>& devices);

}  // namespace spw
