// DeviceSpec: the CLI's `--device cpu | vulkan[:i|:name] | hybrid:N[:i]` and
// `--device-memory SIZE`, parsed, plus the text block `spillway devices`
// prints for Vulkan. No Vulkan headers; works in builds without Vulkan.
//
// Contract: parse_device_spec() accepts
//   "cpu"                 everything on the CPU backend;
//   "vulkan" / "vulkan:I" / "vulkan:NAME"  everything on one Vulkan device
//                         (I = index, NAME = case-insensitive name substring);
//   "hybrid:N" / "hybrid:N:I"  layers [0, N) on Vulkan device I (default the
//                         first), the rest on the CPU (N >= 0; N is clamped
//                         to n_layer by the caller).
// Anything else is InvalidArgument naming the accepted forms.
// parse_memory_size() accepts a byte count with an optional K/M/G/T suffix
// (powers of 1024, optional trailing "iB"/"B"): "512M", "1.5GiB", "1048576";
// InvalidArgument otherwise, or for 0.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "core/status.h"

namespace spw {

struct DeviceSpec {
  enum class Kind { kCpu, kVulkan, kHybrid };
  Kind kind = Kind::kCpu;
  std::string vulkan_device;  // VulkanBackendOptions::device ("" = first)
  int32_t gpu_layers = 0;     // hybrid: layers [0, gpu_layers) on Vulkan
};

Result<DeviceSpec> parse_device_spec(const std::string& text);
// How many layers, from layer 0, the spec puts on Vulkan for a model of
// n_layer layers: 0 for cpu, n_layer for vulkan, hybrid's N clamped to
// [0, n_layer].
int32_t gpu_layer_count(const DeviceSpec& spec, int32_t n_layer);
Result<uint64_t> parse_memory_size(const std::string& text);

// Human-readable lines for `spillway devices` (one block per device: name,
// type, vendor, driver, API, heaps with sizes and budget/usage or "budget
// unknown (no VK_EXT_memory_budget)", subgroup size, buffer limits).
std::string format_vulkan_devices(const std::vector<VulkanDeviceInfo>& devices);

}  // namespace spw
