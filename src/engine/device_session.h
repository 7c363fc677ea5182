// DeviceSession: a Session placed on the device a `--device` spec names.
//
// Contract: open_device_session() builds the backends and KV pools for
//   cpu          all layers on a CpuBackend, KV in host memory;
//   vulkan[:i]   all layers on one VulkanBackend, KV in its device memory,
//                every device byte through its allocator (budget =
//                device_memory_bytes, 0 = the largest device-local heap);
//   hybrid:N     layers [0, N) on Vulkan, [N, n_layer) on the CPU (N clamped
//                to n_layer; N = 0 is all-CPU, N = n_layer all-Vulkan),
// sized for n_ctx positions of one sequence, and a Session over them. Without
// a Vulkan build or device the Vulkan forms fail with the backend's Unavailable
// or NotFound status (the caller may fall back to cpu); a budget too small for
// the weights or the KV is ResourceExhausted naming the numbers.
// `placement` describes what was built, e.g. "hybrid: layers 0-2 vulkan
// (llvmpipe), 3-4 cpu". The DeviceSession owns its backends; destroy the Session
// (member order does that) before the backends.
// Thread safety: as Session (one thread at a time).
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/vulkan/device_spec.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/status.h"
#include "engine/session.h"
#include "model/model.h"

namespace spw {

struct DeviceSessionOptions {
  DeviceSpec device;
  uint64_t device_memory_bytes = 0;  // Vulkan budget; 0 = largest device-local heap
  int n_threads = 1;                 // CPU backend threads
  int32_t n_ctx = 0;                 // 0 = the model's context_length
  int32_t n_ubatch = 64;
  int32_t kv_block_tokens = 16;
};

struct DeviceSession {
  std::shared_ptr<CpuBackend> cpu;        // null when no layer runs on the CPU
  std::shared_ptr<VulkanBackend> vulkan;  // null when no layer runs on Vulkan
  std::unique_ptr<Session> session;       // declared last: destroyed first
  std::string placement;
};

Result<DeviceSession> open_device_session(std::shared_ptr<const Model> model, const DeviceSessionOptions& options);

}  // namespace spw
