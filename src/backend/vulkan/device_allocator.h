// DeviceAllocator: the only path to device memory in the Vulkan backend.
//
// Contract: allocate(size, category, owner, host_visible) creates a storage
// buffer with its own VkDeviceMemory. Before calling vkAllocateMemory it checks
// the budget: used + the allocation's real size (from vkGetBufferMemory-
// Requirements) > budget -> ResourceExhausted with the request, what is in use
// by category and the budget in the message; the device stays healthy. A size
// above max_buffer_bytes is InvalidArgument (callers split tensors first). A
// driver failure (or an injected one, FaultInjector::fail_allocation) is
// ResourceExhausted and marks the context unhealthy. Bytes are accounted by
// category and owner with peaks; a DeviceBuffer frees itself on destruction,
// after the device finished its last submission; when that never comes (a
// fence timeout) the memory is leaked instead, still counted, under owner
// kAbandonedOwner.
// Budget covers every category, staging included (staging is bounded and freed
// after each upload).
// Host-visible buffers are HOST_VISIBLE|HOST_COHERENT and mapped for their
// lifetime; others prefer DEVICE_LOCAL.
// Thread safety: all members may be called from any thread (internal mutex).
// DeviceBuffers must be destroyed before the allocator (the context).
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "backend/vulkan/vulkan_backend.h"
#include "core/status.h"

namespace spw {

class VulkanContext;
class DeviceAllocator;

inline constexpr const char* kAbandonedOwner = "abandoned";

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset();
  bool valid() const { return buffer_ != VK_NULL_HANDLE; }
  VkBuffer buffer() const { return buffer_; }
  uint64_t size() const { return size_; }
  void* mapped() const { return mapped_; }

 private:
  friend class DeviceAllocator;
  DeviceAllocator* owner_ = nullptr;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t size_ = 0;        // requested bytes
  uint64_t alloc_size_ = 0;  // accounted bytes
  void* mapped_ = nullptr;
  MemoryCategory category_ = MemoryCategory::kScratch;
  std::string owner_name_;
};

class DeviceAllocator {
 public:
  DeviceAllocator(VulkanContext* ctx, uint64_t budget_bytes, uint64_t max_buffer_bytes);

  Result<DeviceBuffer> allocate(uint64_t size, MemoryCategory category, const std::string& owner,
                                bool host_visible = false);
  DeviceMemoryStats stats() const;
  uint64_t budget() const { return budget_; }
  uint64_t max_buffer_bytes() const { return max_buffer_; }

 private:
  friend class DeviceBuffer;
  void release(DeviceBuffer& b);
  void account(uint64_t bytes, MemoryCategory category, const std::string& owner, int sign);  // mu_ held
  int32_t find_memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const;

  VulkanContext* ctx_;
  const uint64_t budget_;
  const uint64_t max_buffer_;
  mutable std::mutex mu_;
  DeviceMemoryStats stats_;
};

}  // namespace spw
