#include "backend/vulkan/device_allocator.h"

#include <algorithm>

#include "backend/vulkan/vk_context.h"

namespace spw {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    buffer_ = o.buffer_;
    memory_ = o.memory_;
    size_ = o.size_;
    alloc_size_ = o.alloc_size_;
    mapped_ = o.mapped_;
    category_ = o.category_;
    owner_name_ = std::move(o.owner_name_);
    o.owner_ = nullptr;
    o.buffer_ = VK_NULL_HANDLE;
    o.memory_ = VK_NULL_HANDLE;
    o.mapped_ = nullptr;
    o.size_ = o.alloc_size_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (owner_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
  size_ = alloc_size_ = 0;
}

DeviceAllocator::DeviceAllocator(VulkanContext* ctx, uint64_t budget_bytes, uint64_t max_buffer_bytes)
    : ctx_(ctx), budget_(budget_bytes), max_buffer_(max_buffer_bytes) {
  stats_.budget_bytes = budget_bytes;
}

int32_t DeviceAllocator::find_memory_type(uint32_t bits, VkMemoryPropertyFlags want) const {
  const auto& mp = ctx_->memory_properties();
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
    if ((bits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) return static_cast<int32_t>(i);
  return -1;
}

namespace {
std::string mib(uint64_t b) {
  return std::to_string(b) + " B (" + std::to_string(b / (1024 * 1024)) + " MiB)";
}
}  // namespace

Result<DeviceBuffer> DeviceAllocator::allocate(uint64_t size, MemoryCategory category, const std::string& owner,
                                               bool host_visible) {
  SPW_RETURN_IF_ERROR(ctx_->require_healthy());
  if (size == 0) size = 4;
  size = (size + 3) & ~uint64_t{3};
  if (size > max_buffer_)
    return Status::invalid_argument("device buffer of " + mib(size) + " for " + owner + " exceeds the largest buffer (" +
                                    mib(max_buffer_) + ")");
  VkDevice dev = ctx_->device();
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  DeviceBuffer b;
  SPW_RETURN_IF_ERROR(ctx_->check(vkCreateBuffer(dev, &bci, nullptr, &b.buffer_), "vkCreateBuffer"));
  VkMemoryRequirements req{};
  vkGetBufferMemoryRequirements(dev, b.buffer_, &req);
  auto fail = [&](Status st) {
    vkDestroyBuffer(dev, b.buffer_, nullptr);
    b.buffer_ = VK_NULL_HANDLE;
    return st;
  };
  {
    // Check and account in one step so concurrent allocations cannot both fit.
    std::lock_guard<std::mutex> lk(mu_);
    if (stats_.used_bytes + req.size > budget_) {
      ++stats_.n_budget_rejections;
      std::string m = "device memory budget exceeded: " + std::string(memory_category_name(category)) + " for " +
                      owner + " needs " + mib(req.size) + ", " + mib(stats_.used_bytes) + " of " + mib(budget_) +
                      " in use (";
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        if (c) m += ", ";
        m += std::string(memory_category_name(static_cast<MemoryCategory>(c))) + " " +
             std::to_string(stats_.used_by_category[static_cast<size_t>(c)]);
      }
      m += ")";
      return fail(Status::resource_exhausted(m));
    }
    account(req.size, category, owner, +1);
  }
  VkMemoryPropertyFlags want = host_visible ? (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
                                            : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  int32_t mt = find_memory_type(req.memoryTypeBits, want);
  if (mt < 0 && !host_visible) mt = find_memory_type(req.memoryTypeBits, 0);
  auto fail_accounted = [&](Status st) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      account(req.size, category, owner, -1);
    }
    return fail(std::move(st));
  };
  if (mt < 0) return fail_accounted(Status::internal("no Vulkan memory type for " + owner));
  if (ctx_->faults() && ctx_->faults()->take_allocation_failure())
    return fail_accounted(
        ctx_->check(VK_ERROR_OUT_OF_DEVICE_MEMORY, ("vkAllocateMemory (injected) for " + owner).c_str()));
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = static_cast<uint32_t>(mt);
  VkResult r = vkAllocateMemory(dev, &mai, nullptr, &b.memory_);
  if (r != VK_SUCCESS) {
    b.memory_ = VK_NULL_HANDLE;
    return fail_accounted(ctx_->check(r, ("vkAllocateMemory " + mib(req.size) + " for " + owner).c_str()));
  }
  r = vkBindBufferMemory(dev, b.buffer_, b.memory_, 0);
  if (r == VK_SUCCESS && host_visible) r = vkMapMemory(dev, b.memory_, 0, VK_WHOLE_SIZE, 0, &b.mapped_);
  if (r != VK_SUCCESS) {
    vkFreeMemory(dev, b.memory_, nullptr);
    b.memory_ = VK_NULL_HANDLE;
    return fail_accounted(ctx_->check(r, "vkBindBufferMemory/vkMapMemory"));
  }
  b.size_ = size;
  b.alloc_size_ = req.size;
  b.category_ = category;
  b.owner_name_ = owner;
  b.owner_ = this;
  return b;
}

void DeviceAllocator::release(DeviceBuffer& b) {
  if (!ctx_->settle()) {
    // The device never finished its last submission (fence timeout) and may
    // still read or write this memory: freeing it would hand the driver's
    // heap a use-after-free. Leak it, accounted to "abandoned".
    keep_forever_vk(b.buffer_);
    keep_forever_vk(b.memory_);
    std::lock_guard<std::mutex> lk(mu_);
    account(b.alloc_size_, b.category_, b.owner_name_, -1);
    account(b.alloc_size_, b.category_, kAbandonedOwner, +1);
    return;
  }
  VkDevice dev = ctx_->device();
  if (b.mapped_) vkUnmapMemory(dev, b.memory_);
  vkDestroyBuffer(dev, b.buffer_, nullptr);
  vkFreeMemory(dev, b.memory_, nullptr);
  std::lock_guard<std::mutex> lk(mu_);
  account(b.alloc_size_, b.category_, b.owner_name_, -1);
}

void DeviceAllocator::account(uint64_t bytes, MemoryCategory category, const std::string& owner, int sign) {
  auto& s = stats_;
  const auto ci = static_cast<size_t>(category);
  if (sign > 0) {
    s.used_bytes += bytes;
    s.peak_bytes = std::max(s.peak_bytes, s.used_bytes);
    s.used_by_category[ci] += bytes;
    s.peak_by_category[ci] = std::max(s.peak_by_category[ci], s.used_by_category[ci]);
    s.used_by_owner[owner] += bytes;
    ++s.n_allocations;
    return;
  }
  s.used_bytes -= bytes;
  s.used_by_category[ci] -= bytes;
  auto it = s.used_by_owner.find(owner);
  if (it != s.used_by_owner.end()) {
    it->second -= bytes;
    if (it->second == 0) s.used_by_owner.erase(it);
  }
  --s.n_allocations;
}

DeviceMemoryStats DeviceAllocator::stats() const {
  DeviceMemoryStats s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s = stats_;
  }
  s.heaps = ctx_->heap_budgets();
  return s;
}

}  // namespace spw
