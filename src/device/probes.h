// Umbrella header for the device and memory probes (src/device).
//
// Every probe returns typed Readings (device/reading.h): a value with the
// source it came from, or unknown with a reason; never a guess. File-based
// probes take an Env and a root prefix so tests can point them at fixture
// trees (src/device/testdata). See each header for its contract and thread
// safety:
//   host_memory.h      HostMemoryProbe   /proc/meminfo, /proc/self/status
//   cgroup.h           CgroupProbe       cgroup v2 (and v1) memory limits and usage
//   amd_sysfs.h        AmdSysfsProbe     amdgpu mem_info_* and gpu_busy_percent
//   nvml_probe.h       NvmlProbe         NVIDIA via dlopen("libnvidia-ml.so.1")
//   vk_memory_budget.h VkMemoryBudgetProbe  interface for the Vulkan backend
//   inventory.h        collect_all()     everything at once, as findings
#pragma once

#include "device/amd_sysfs.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "device/inventory.h"
#include "device/nvml_probe.h"
#include "device/reading.h"
#include "device/text_parse.h"
#include "device/vk_memory_budget.h"
