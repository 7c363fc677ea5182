// DeviceSession: a Session placed where a `--device` placement says
// (core/placement.h).
//
// Contract: open_device_session() builds the backends and KV pools for
//   cpu          all layers on a CpuBackend, KV in host memory;
//   vulkan[:i]   all layers on one VulkanBackend, KV in its device memory,
//                every device byte through its allocator (budget =
//                device_memory_bytes, 0 = the largest device-local heap);
//   hybrid:N     layers [0, N) on Vulkan, [N, n_layer) on the CPU (N clamped
//                to n_layer; N = 0 is all-CPU, N = n_layer all-Vulkan:
//                what runs is device.resolved(n_layer), whose name() is the
//                short placement name),
// sized for n_ctx positions of one sequence, and a Session over them (the
// session group below with one session). Without
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
#include "backend/vulkan/vulkan_backend.h"
#include "core/placement.h"
#include "core/status.h"
#include "engine/session.h"
#include "model/model.h"

namespace spw {

struct SessionGroupOptions {
  Placement device;                  // cpu (default), vulkan[:i], hybrid:N[:i]
  uint64_t device_memory_bytes = 0;  // Vulkan budget; 0 = largest device-local heap
  // An open backend to place the Vulkan layers on (its device and budget
  // win over device.vulkan_device and device_memory_bytes); null: open one.
  std::shared_ptr<VulkanBackend> vulkan;
  int32_t n_sessions = 1;
  int n_threads = 1;
  int32_t n_ctx = 0;
  int32_t n_ubatch = 64;
  int32_t kv_blocks = 0;
  int32_t kv_block_tokens = 16;
  // Element type of every stage's KV pool (KvPoolOptions::type). The library
  // default is f32; `spillway serve` / run / chat default to f16. The Vulkan
  // stage refuses q8_0 (Unimplemented); q8_0 needs n_embd_kv and head_dim
  // multiples of 32 (InvalidArgument).
  KvType kv_type = KvType::kF32;
  // Slow faults for the CPU stage (CpuBackend::set_faults; not owned, must
  // outlive the group); null: none. The gateway gives each CPU path one.
  FaultInjector* cpu_faults = nullptr;
};

// One session's options are a group's with n_sessions = 1 (anything else is
// InvalidArgument); kv_blocks 0 sizes its pools for one full context.
using DeviceSessionOptions = SessionGroupOptions;

struct DeviceSession {
  std::shared_ptr<CpuBackend> cpu;        // null when no layer runs on the CPU
  std::shared_ptr<VulkanBackend> vulkan;  // null when no layer runs on Vulkan
  std::unique_ptr<Session> session;       // declared last: destroyed first
  std::string placement;
};

Result<DeviceSession> open_device_session(std::shared_ptr<const Model> model, const DeviceSessionOptions& options);

// The serving layout (`spillway serve`, the estimator's n_parallel): n_sessions
// Sessions placed as `device` says, sharing ONE backend per device (one
// CpuBackend of n_threads threads, one VulkanBackend with the device_memory
// budget) and ONE KvPool per stage (kv_blocks blocks each; 0: every session
// can hold a full context, n_sessions * ceil(n_ctx / kv_block_tokens)). The
// GPU's weights are uploaded once and its scratch buffers are the backend's,
// shared by the sessions (calls on one VulkanBackend are serialised). n_ctx 0
// = the model's context_length. InvalidArgument for n_sessions, n_threads,
// kv_block_tokens or n_ctx < 1 and kv_blocks < 0;
// the Vulkan forms fail as open_device_session does; ResourceExhausted when a
// pool cannot be allocated. Sessions may run concurrently on different threads
// (each Session on one thread at a time). Options: SessionGroupOptions above.
struct SessionGroup {
  std::shared_ptr<CpuBackend> cpu;        // null when no layer runs on the CPU
  std::shared_ptr<VulkanBackend> vulkan;  // null when no layer runs on Vulkan
  std::vector<std::shared_ptr<KvPool>> pools;  // one per stage: Vulkan first, then CPU
  std::vector<std::unique_ptr<Session>> sessions;  // declared last: destroyed first
  int32_t n_ctx = 0;          // after defaulting
  int32_t n_gpu_layers = 0;   // layers [0, n_gpu_layers) on Vulkan, after clamping
  bool full_pool = false;     // every session can hold a full context at once
  std::string placement;      // as DeviceSession::placement
};

// `host_pool`: null to create it here; else a pool made from
// session_group_host_pool() of the same options (callers that account the
// pool's allocation on their own), used as is for the CPU stage.
Result<SessionGroup> open_session_group(std::shared_ptr<const Model> model, const SessionGroupOptions& options,
                                        std::shared_ptr<KvPool> host_pool = nullptr);
// The CPU stage's KvPool options of that layout (after the same checks);
// InvalidArgument when every layer is on Vulkan (there is no CPU stage).
Result<KvPoolOptions> session_group_host_pool(const Model& model, const SessionGroupOptions& options);

}  // namespace spw
