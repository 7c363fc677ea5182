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
#include <vector>

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

// The CPU serving layout (`spillway serve`, the estimator's n_parallel): n_sessions
// Sessions over ONE CpuBackend of n_threads threads and ONE KvPool of
// kv_blocks blocks (0: every session can hold a full context, n_sessions *
// ceil(n_ctx / kv_block_tokens)). n_ctx 0 = the model's context_length.
// InvalidArgument for n_sessions, n_threads or kv_block_tokens < 1, kv_blocks
// < 0, or n_ctx outside [2, context_length]; ResourceExhausted when the pool
// cannot be allocated. The backend's threads are shared: sessions may run
// concurrently on different threads (each Session on one thread at a time).
struct CpuSessionGroupOptions {
  int32_t n_sessions = 1;
  int n_threads = 1;
  int32_t n_ctx = 0;
  int32_t n_ubatch = 64;
  int32_t kv_blocks = 0;
  int32_t kv_block_tokens = 16;
};

struct CpuSessionGroup {
  std::shared_ptr<CpuBackend> backend;
  std::shared_ptr<KvPool> pool;
  std::vector<std::unique_ptr<Session>> sessions;
  int32_t n_ctx = 0;          // after defaulting
  bool full_pool = false;     // every session can hold a full context at once
};

// `pool`: null to create it here; else a pool made from
// cpu_session_group_pool() of the same options (callers that account the
// pool's allocation on its own), used as is.
Result<CpuSessionGroup> open_cpu_session_group(std::shared_ptr<const Model> model,
                                               const CpuSessionGroupOptions& options,
                                               std::shared_ptr<KvPool> pool = nullptr);
// The KvPool options of that layout (after the same checks).
Result<KvPoolOptions> cpu_session_group_pool(const Model& model, const CpuSessionGroupOptions& options);

}  // namespace spw
