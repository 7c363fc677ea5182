// collect_all: runs every device and memory probe once and returns the typed
// readings plus a flat list of findings, each saying how its figure was
// obtained (source) or why it could not be (reason). This is what
// `spillway devices` prints and what admission logs at start-up.
//
// Contract: collect_all never fails as a whole: a probe that cannot run
// contributes findings marked unknown with its reason. The Vulkan budget is
// reported unknown unless a VkMemoryBudgetProbe is supplied. Findings come in a
// stable order: host, process, cgroup, amd_sysfs, nvml, vulkan.
// Thread safety: collect_all may run concurrently with itself when each call
// has its own NvmlProbe, or shares one (NvmlProbe serialises its reads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "device/amd_sysfs.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "device/nvml_probe.h"
#include "device/vk_memory_budget.h"

namespace spw::device {

struct Finding {
  enum class Kind { kBytes, kCount, kPercent, kCelsius, kText, kLimit };

  std::string probe;    // "host", "process", "cgroup", "amd_sysfs", "nvml", "vulkan"
  std::string subject;  // "host", "self", "/user.slice/app", "card0", "gpu0", "gpu0 pid 42"
  std::string figure;   // "mem_available", "vram_used", "health", ...
  Kind kind = Kind::kText;
  bool known = false;
  uint64_t number = 0;     // numeric kinds; kLimit when !unlimited
  bool unlimited = false;  // kLimit only
  std::string text;        // kText only
  std::string source;      // when known
  std::string reason;      // when unknown
};

const char* finding_kind_name(Finding::Kind kind);
// "23.54 GiB", "max", "45 C", "12 %", "3", or the text.
std::string format_finding_value(const Finding& f);

struct DeviceInventory {
  HostMemory host;
  CgroupMemory cgroup;
  AmdSysfsReport amd;
  NvmlReport nvml;
  std::vector<VkDeviceBudget> vulkan;
  std::string vulkan_none_reason;  // set when `vulkan` is empty
  std::vector<Finding> findings;
};

struct CollectOptions {
  Env* env = nullptr;                     // null: Env::default_env()
  std::string root = "/";                 // prefix for /proc and /sys paths
  NvmlProbe* nvml = nullptr;              // reuse a long-lived probe; null: a temporary one
  std::string nvml_library = kNvmlLibrary;  // used when nvml is null
  VkMemoryBudgetProbe* vulkan = nullptr;  // filled by the Vulkan backend once it exists
};

DeviceInventory collect_all(const CollectOptions& options = {});

// The flat findings of already-collected readings (collect_all calls this).
std::vector<Finding> make_findings(const DeviceInventory& inv);

}  // namespace spw::device
