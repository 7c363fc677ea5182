// VulkanContext: instance, one physical + logical device, a compute queue, a
// command pool, a fence, and the health state of all of it. Internal to the
// Vulkan backend (includes vulkan.h).
//
// Contract: create() opens the device chosen by options.device (see
// VulkanBackendOptions). check(r, what) turns a VkResult into a Status:
// VK_TIMEOUT -> DeadlineExceeded (kTimeout), VK_ERROR_DEVICE_LOST ->
// DeviceLost (kDeviceLost), VK_ERROR_OUT_OF_{DEVICE,HOST}_MEMORY ->
// ResourceExhausted (kDeviceOutOfMemory), others -> Internal (kUnhealthy);
// any of these marks the context unhealthy (sticky until a new context is
// made). submit_and_wait() submits one command buffer and waits on the fence
// with the configured timeout; it consults the FaultInjector at the submit
// (device_lost, slow) and at the fence wait (fence_timeout).
// Thread safety: submit_and_wait and the command pool are used under the
// backend's mutex; healthy()/health_reason() may be read from any thread.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/fault_injector.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/status.h"

namespace spw {

// The graveyard: what a device that never finished its work may still use
// (after a fence timeout) is kept here for the rest of the process. Never
// freed, since freeing would hand the driver a use-after-free, and reachable,
// so that LeakSanitizer does not report the deliberate leak. Thread-safe.
void keep_forever(std::shared_ptr<void> object);
void keep_forever_handle(const void* driver_object);
template <typename Handle>
void keep_forever_vk(Handle h) {
  if (h != VK_NULL_HANDLE) keep_forever_handle((const void*)(uintptr_t)h);  // pointer or 64-bit handle
}

class DeviceAllocator;

std::string vk_result_name(VkResult r);

// Fills a VulkanDeviceInfo for one physical device (no logical device needed).
VulkanDeviceInfo describe_physical_device(VkInstance instance, VkPhysicalDevice pd, uint32_t index);

class VulkanContext {
 public:
  static Result<std::shared_ptr<VulkanContext>> create(const VulkanBackendOptions& options, FaultInjector* faults);
  ~VulkanContext();
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical_device() const { return physical_; }
  const VkPhysicalDeviceProperties& properties() const { return props_; }
  const VkPhysicalDeviceMemoryProperties& memory_properties() const { return mem_props_; }
  const VulkanDeviceInfo& info() const { return info_; }
  uint64_t max_buffer_bytes() const { return max_buffer_bytes_; }  // device limit for one buffer
  uint64_t weight_chunk_bytes() const { return weight_chunk_bytes_; }  // largest buffer of one weight tensor
  uint32_t fence_timeout_ms() const { return fence_timeout_ms_; }
  FaultInjector* faults() const { return faults_; }
  DeviceAllocator& allocator() { return *allocator_; }
  // Per-heap budget/usage (VK_EXT_memory_budget) or -1 when unsupported.
  std::vector<VulkanHeapInfo> heap_budgets() const;

  Status check(VkResult r, const char* what);
  // `failure`: the typed reason later refusals carry (require_healthy).
  void mark_unhealthy(const std::string& reason, FailureReason failure = FailureReason::kUnhealthy);
  bool healthy() const { return healthy_.load(); }
  std::string health_reason() const;
  // Unavailable naming the reason when unhealthy, typed with the fault that
  // made it so (kDeviceLost, kTimeout, kDeviceOutOfMemory; else kUnhealthy).
  Status require_healthy() const;

  VkCommandBuffer command_buffer() const { return cmd_; }
  // Ends nothing: the caller has ended recording. Submits cmd_, waits.
  Status submit_and_wait();
  // Waits (with the timeout) for the last submission; if it never finishes the
  // context is abandoned: its destructor leaks the device instead of
  // destroying objects the GPU may still use.
  void wait_idle();
  // A submission not yet seen complete (after a fence timeout).
  bool in_flight() const { return pending_.load(); }
  // wait_idle(), then whether nothing is in flight: memory may be freed only
  // then. Called by the allocator before every free, from any thread.
  bool settle() {
    wait_idle();
    return !pending_.load();
  }

 private:
  VulkanContext() = default;

  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties mem_props_{};
  VulkanDeviceInfo info_;
  bool budget_ext_ = false;
  uint64_t max_buffer_bytes_ = 0;
  uint64_t weight_chunk_bytes_ = 0;
  uint32_t fence_timeout_ms_ = 30000;
  FaultInjector* faults_ = nullptr;
  // The fence's state. Submissions come from the backend (under its mutex);
  // frees from any thread (a KV pool dies where its last owner lets go):
  // fence_mu_ orders the fence operations of both.
  std::mutex fence_mu_;
  std::atomic<bool> pending_{false};  // a submission not yet seen complete
  std::atomic<bool> abandoned_{false};
  std::unique_ptr<DeviceAllocator> allocator_;
  std::atomic<bool> healthy_{true};
  mutable std::mutex health_mu_;
  std::string health_reason_;
  FailureReason health_failure_ = FailureReason::kUnhealthy;
};

}  // namespace spw
