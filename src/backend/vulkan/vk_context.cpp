#include "backend/vulkan/vk_context.h"

#include <chrono>
#include <thread>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "backend/vulkan/device_allocator.h"

namespace spw {

std::string vk_result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    default: return "VkResult(" + std::to_string(static_cast<int>(r)) + ")";
  }
}

namespace {

std::string vendor_name(uint32_t id) {
  switch (id) {
    case 0x10DE: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x8086: return "Intel";
    case 0x13B5: return "ARM";
    case 0x5143: return "Qualcomm";
    case 0x10005: return "Mesa";
    default: {
      char b[16];
      std::snprintf(b, sizeof b, "0x%04x", id);
      return b;
    }
  }
}

std::string type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

bool has_device_extension(VkPhysicalDevice pd, const char* name) {
  uint32_t n = 0;
  if (vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> ext(n);
  if (vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, ext.data()) != VK_SUCCESS) return false;
  for (const auto& e : ext)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

bool has_layer(const char* name) {
  uint32_t n = 0;
  if (vkEnumerateInstanceLayerProperties(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(n);
  if (vkEnumerateInstanceLayerProperties(&n, layers.data()) != VK_SUCCESS) return false;
  for (const auto& l : layers)
    if (std::strcmp(l.layerName, name) == 0) return true;
  return false;
}

int32_t compute_queue_family(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> q(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q.data());
  // Prefer a compute-only family (async compute on discrete GPUs).
  for (uint32_t i = 0; i < n; ++i)
    if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) return static_cast<int32_t>(i);
  for (uint32_t i = 0; i < n; ++i)
    if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return static_cast<int32_t>(i);
  return -1;
}

Status instance_status(VkResult r) {
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
    return Status::unavailable("vkCreateInstance: " + vk_result_name(r) + " (no Vulkan driver installed?)");
  return Status::unavailable("vkCreateInstance: " + vk_result_name(r));
}

Result<VkInstance> make_instance_raw(bool validation) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "spillway";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  const char* layer = "VK_LAYER_KHRONOS_validation";
  if (validation && has_layer(layer)) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = &layer;
  }
  VkInstance inst = VK_NULL_HANDLE;
  VkResult r = vkCreateInstance(&ci, nullptr, &inst);
  if (r != VK_SUCCESS) return instance_status(r);
  return inst;
}

// One instance is kept for the life of the process so the loader loads each
// driver once: Mesa's llvmpipe (through LLVM) leaks a small allocation every
// time it is loaded and unloaded, which would also trip LeakSanitizer; and a
// re-created backend starts faster. The anchor is reachable and never freed.
Result<VkInstance> make_instance(bool validation) {
  static const VkInstance anchor = [] {
    auto r = make_instance_raw(false);
    return r.ok() ? *r : VK_NULL_HANDLE;
  }();
  (void)anchor;
  return make_instance_raw(validation);
}

Result<std::vector<VkPhysicalDevice>> physical_devices(VkInstance inst) {
  uint32_t n = 0;
  VkResult r = vkEnumeratePhysicalDevices(inst, &n, nullptr);
  if (r != VK_SUCCESS) return Status::unavailable("vkEnumeratePhysicalDevices: " + vk_result_name(r));
  std::vector<VkPhysicalDevice> pds(n);
  r = vkEnumeratePhysicalDevices(inst, &n, pds.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE)
    return Status::unavailable("vkEnumeratePhysicalDevices: " + vk_result_name(r));
  pds.resize(n);
  if (pds.empty()) return Status::unavailable("no Vulkan devices");
  return pds;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

VulkanDeviceInfo describe_physical_device(VkInstance, VkPhysicalDevice pd, uint32_t index) {
  VulkanDeviceInfo d;
  d.index = index;
  VkPhysicalDeviceProperties p{};
  vkGetPhysicalDeviceProperties(pd, &p);
  d.name = p.deviceName;
  d.type = type_name(p.deviceType);
  d.vendor_id = p.vendorID;
  d.device_id = p.deviceID;
  d.vendor = vendor_name(p.vendorID);
  d.api_version = std::to_string(VK_API_VERSION_MAJOR(p.apiVersion)) + "." +
                  std::to_string(VK_API_VERSION_MINOR(p.apiVersion)) + "." +
                  std::to_string(VK_API_VERSION_PATCH(p.apiVersion));
  d.max_storage_buffer_range = p.limits.maxStorageBufferRange;
  d.has_compute_queue = compute_queue_family(pd) >= 0;
  d.memory_budget_ext = has_device_extension(pd, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  VkPhysicalDeviceFeatures features{};
  vkGetPhysicalDeviceFeatures(pd, &features);
  d.shader_float64 = features.shaderFloat64 == VK_TRUE;

  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceDriverProperties drv{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  sub.pNext = &m3;
  const bool v12 = p.apiVersion >= VK_API_VERSION_1_2;
  if (v12) m3.pNext = &drv;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &sub;
  vkGetPhysicalDeviceProperties2(pd, &p2);
  d.subgroup_size = sub.subgroupSize;
  d.max_allocation_bytes = m3.maxMemoryAllocationSize;
  if (v12) {
    d.driver = std::string(drv.driverName);
    if (drv.driverInfo[0] != '\0') d.driver += " (" + std::string(drv.driverInfo) + ")";
  } else {
    d.driver = "driver version " + std::to_string(p.driverVersion);
  }

  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mp2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (d.memory_budget_ext) mp2.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(pd, &mp2);
  for (uint32_t h = 0; h < mp2.memoryProperties.memoryHeapCount; ++h) {
    VulkanHeapInfo hi;
    hi.size_bytes = mp2.memoryProperties.memoryHeaps[h].size;
    hi.device_local = (mp2.memoryProperties.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    if (d.memory_budget_ext) {
      hi.budget_bytes = static_cast<int64_t>(budget.heapBudget[h]);
      hi.usage_bytes = static_cast<int64_t>(budget.heapUsage[h]);
    }
    d.heaps.push_back(hi);
  }
  return d;
}

Result<std::vector<VulkanDeviceInfo>> list_vulkan_devices() {
  SPW_ASSIGN_OR_RETURN(VkInstance inst, make_instance(false));
  auto pds = physical_devices(inst);
  if (!pds.ok()) {
    vkDestroyInstance(inst, nullptr);
    return pds.status();
  }
  std::vector<VulkanDeviceInfo> out;
  for (uint32_t i = 0; i < pds->size(); ++i) out.push_back(describe_physical_device(inst, (*pds)[i], i));
  vkDestroyInstance(inst, nullptr);
  return out;
}

Result<std::shared_ptr<VulkanContext>> VulkanContext::create(const VulkanBackendOptions& o, FaultInjector* faults) {
  std::shared_ptr<VulkanContext> c(new VulkanContext());
  c->faults_ = faults;
  c->fence_timeout_ms_ = o.fence_timeout_ms == 0 ? 1 : o.fence_timeout_ms;
#ifndef NDEBUG
  const bool validation = true;
#else
  const bool validation = o.validation;
#endif
  SPW_ASSIGN_OR_RETURN(c->instance_, make_instance(validation));
  SPW_ASSIGN_OR_RETURN(auto pds, physical_devices(c->instance_));

  int32_t pick = -1;
  if (o.device.empty()) {
    for (size_t i = 0; i < pds.size() && pick < 0; ++i)
      if (compute_queue_family(pds[i]) >= 0) pick = static_cast<int32_t>(i);
  } else if (std::all_of(o.device.begin(), o.device.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
    const long idx = std::strtol(o.device.c_str(), nullptr, 10);
    if (idx < 0 || idx >= static_cast<long>(pds.size()))
      return Status::not_found("Vulkan device index " + o.device + " out of range: " + std::to_string(pds.size()) +
                               " device(s)");
    pick = static_cast<int32_t>(idx);
  } else {
    for (size_t i = 0; i < pds.size() && pick < 0; ++i) {
      VkPhysicalDeviceProperties p{};
      vkGetPhysicalDeviceProperties(pds[i], &p);
      if (lower(p.deviceName).find(lower(o.device)) != std::string::npos) pick = static_cast<int32_t>(i);
    }
    if (pick < 0) return Status::not_found("no Vulkan device name contains '" + o.device + "'");
  }
  if (pick < 0) return Status::unavailable("no Vulkan device with a compute queue");
  c->physical_ = pds[static_cast<size_t>(pick)];
  c->info_ = describe_physical_device(c->instance_, c->physical_, static_cast<uint32_t>(pick));
  const int32_t qf = compute_queue_family(c->physical_);
  if (qf < 0) return Status::unavailable("Vulkan device " + c->info_.name + " has no compute queue");
  c->queue_family_ = static_cast<uint32_t>(qf);
  vkGetPhysicalDeviceProperties(c->physical_, &c->props_);
  vkGetPhysicalDeviceMemoryProperties(c->physical_, &c->mem_props_);

  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = c->queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  std::vector<const char*> exts;
  c->budget_ext_ = c->info_.memory_budget_ext;
  if (c->budget_ext_) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  dci.ppEnabledExtensionNames = exts.data();
  // Float64 only where the device has it: the Q8_0 quantiser uses it to divide
  // exactly (shader float division is not correctly rounded on every driver).
  VkPhysicalDeviceFeatures features{};
  features.shaderFloat64 = c->info_.shader_float64 ? VK_TRUE : VK_FALSE;
  dci.pEnabledFeatures = &features;
  SPW_RETURN_IF_ERROR(c->check(vkCreateDevice(c->physical_, &dci, nullptr, &c->device_), "vkCreateDevice"));
  vkGetDeviceQueue(c->device_, c->queue_family_, 0, &c->queue_);

  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = c->queue_family_;
  SPW_RETURN_IF_ERROR(c->check(vkCreateCommandPool(c->device_, &pci, nullptr, &c->cmd_pool_), "vkCreateCommandPool"));
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = c->cmd_pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  SPW_RETURN_IF_ERROR(c->check(vkAllocateCommandBuffers(c->device_, &cai, &c->cmd_), "vkAllocateCommandBuffers"));
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  SPW_RETURN_IF_ERROR(c->check(vkCreateFence(c->device_, &fci, nullptr, &c->fence_), "vkCreateFence"));

  const uint64_t maxbuf = largest_buffer_bytes(c->info_);
  c->max_buffer_bytes_ = maxbuf;
  c->weight_chunk_bytes_ = o.max_buffer_bytes > 0 ? std::min<uint64_t>(maxbuf, o.max_buffer_bytes & ~uint64_t{3}) : maxbuf;
  uint64_t budget = o.memory_budget_bytes;
  if (budget == 0) {
    for (const auto& h : c->info_.heaps)
      if (h.device_local) budget = std::max(budget, h.size_bytes);
    if (budget == 0 && !c->info_.heaps.empty()) budget = c->info_.heaps[0].size_bytes;
  }
  c->allocator_ = std::make_unique<DeviceAllocator>(c.get(), budget, maxbuf);
  return c;
}

namespace {
struct Graveyard {
  std::mutex mu;
  std::vector<std::shared_ptr<void>> objects;
  std::vector<const void*> handles;
};
Graveyard& graveyard() {
  static Graveyard* g = new Graveyard();  // never destroyed: it outlives every exit path
  return *g;
}
}  // namespace

void keep_forever(std::shared_ptr<void> object) {
  Graveyard& g = graveyard();
  std::lock_guard<std::mutex> lk(g.mu);
  g.objects.push_back(std::move(object));
}

void keep_forever_handle(const void* driver_object) {
  Graveyard& g = graveyard();
  std::lock_guard<std::mutex> lk(g.mu);
  g.handles.push_back(driver_object);
}

VulkanContext::~VulkanContext() {
  if (device_ != VK_NULL_HANDLE) {
    wait_idle();
    if (abandoned_) {
      // The GPU may still use these objects: leaking them is the only safe choice.
      keep_forever(std::shared_ptr<DeviceAllocator>(allocator_.release()));
      keep_forever_vk(fence_);
      keep_forever_vk(cmd_);
      keep_forever_vk(cmd_pool_);
      keep_forever_vk(queue_);
      keep_forever_vk(device_);
      keep_forever_vk(instance_);
      return;
    }
    allocator_.reset();
    if (fence_ != VK_NULL_HANDLE) vkDestroyFence(device_, fence_, nullptr);
    if (cmd_pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_, cmd_pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

std::vector<VulkanHeapInfo> VulkanContext::heap_budgets() const {
  std::vector<VulkanHeapInfo> out;
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 mp2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
  if (budget_ext_) mp2.pNext = &budget;
  vkGetPhysicalDeviceMemoryProperties2(physical_, &mp2);
  for (uint32_t h = 0; h < mp2.memoryProperties.memoryHeapCount; ++h) {
    VulkanHeapInfo hi;
    hi.size_bytes = mp2.memoryProperties.memoryHeaps[h].size;
    hi.device_local = (mp2.memoryProperties.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    if (budget_ext_) {
      hi.budget_bytes = static_cast<int64_t>(budget.heapBudget[h]);
      hi.usage_bytes = static_cast<int64_t>(budget.heapUsage[h]);
    }
    out.push_back(hi);
  }
  return out;
}

void VulkanContext::mark_unhealthy(const std::string& reason, FailureReason failure) {
  std::lock_guard<std::mutex> lk(health_mu_);
  if (healthy_.exchange(false)) {
    health_reason_ = reason;
    health_failure_ = failure;
  }
}

std::string VulkanContext::health_reason() const {
  std::lock_guard<std::mutex> lk(health_mu_);
  return health_reason_;
}

Status VulkanContext::require_healthy() const {
  if (healthy()) return Status();
  // The fault that made it unhealthy is still the device's state (a lost
  // device stays lost until re-initialised), so the typed reason is that
  // fault's: the breaker and HTTP classify every later refusal like it.
  FailureReason why;
  {
    std::lock_guard<std::mutex> lk(health_mu_);
    why = health_failure_;
  }
  return Status(StatusCode::kUnavailable,
                "Vulkan device " + info_.name + " is unhealthy (" + health_reason() + "); reinitialize it", why);
}

Status VulkanContext::check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return Status();
  const std::string msg = std::string(what) + ": " + vk_result_name(r);
  // Typed at the source: the breaker counts these as device faults
  // (core/failure.h), never by their text.
  Status st;
  switch (r) {
    case VK_TIMEOUT: st = Status(StatusCode::kDeadlineExceeded, msg, FailureReason::kTimeout); break;
    case VK_ERROR_DEVICE_LOST: st = Status(StatusCode::kDeviceLost, msg, FailureReason::kDeviceLost); break;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      st = Status(StatusCode::kResourceExhausted, msg, FailureReason::kDeviceOutOfMemory);
      break;
    default: st = Status(StatusCode::kInternal, msg, FailureReason::kUnhealthy); break;
  }
  mark_unhealthy(msg, st.reason());
  return st;
}

Status VulkanContext::submit_and_wait() {
  SPW_RETURN_IF_ERROR(require_healthy());
  if (faults_ && faults_->take_device_lost())
    return check(VK_ERROR_DEVICE_LOST, "vkQueueSubmit (injected)");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  const uint64_t disarms = faults_ ? faults_->disarms() : 0;
  const double slow = faults_ ? faults_->take_slow_factor() : 1.0;
  // Real time on purpose: the slowness stands in for a device's own work,
  // which runs on the wall clock whatever Env the server was given.
  const auto t_submit = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> fence_lock(fence_mu_);
  SPW_RETURN_IF_ERROR(check(vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit"));
  pending_ = true;
  const bool inject_timeout = faults_ && faults_->take_fence_timeout();
  const uint64_t timeout_ns = static_cast<uint64_t>(fence_timeout_ms_) * 1000000ull;
  VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, timeout_ns);
  if (r == VK_SUCCESS) {
    pending_ = false;
    r = vkResetFences(device_, 1, &fence_);
  }
  fence_lock.unlock();
  bool stretched_past_timeout = false;
  if (r == VK_SUCCESS && slow > 1.0) {
    // The submission takes `slow` times its real time (FaultKind::kSlow);
    // the queue stays busy meanwhile, as a slow device's would. A real wait
    // gives up at the fence timeout, so a stretch that would outlast it ends
    // there as a timeout (the device is then unhealthy, and the breaker
    // hears of it): a slow device is a fault after a bounded time, never a
    // queue held for minutes. Slept in slices so that disarming ends it.
    const auto now = std::chrono::steady_clock::now();
    const auto want = t_submit + std::chrono::duration_cast<std::chrono::steady_clock::duration>((now - t_submit) * slow);
    const auto limit = t_submit + std::chrono::milliseconds(fence_timeout_ms_);
    stretched_past_timeout = want > limit;
    const auto until = std::min(want, limit);
    while (faults_->disarms() == disarms) {
      const auto t = std::chrono::steady_clock::now();
      if (t >= until) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - t, std::chrono::milliseconds(10)));
    }
    if (faults_->disarms() != disarms) stretched_past_timeout = false;  // disarmed meanwhile: the device answered
  }
  if (r == VK_SUCCESS && (inject_timeout || stretched_past_timeout)) r = VK_TIMEOUT;  // the real work finished: nothing left in flight
  if (r == VK_TIMEOUT)
    return check(r, ("vkWaitForFences (" + std::to_string(fence_timeout_ms_) + " ms" +
                     (inject_timeout ? ", injected)" : stretched_past_timeout ? ", slowed past it by a slow fault)" : ")"))
                        .c_str());
  return check(r, "vkWaitForFences");
}

void VulkanContext::wait_idle() {
  // All work goes through fence_, so waiting on it (with the timeout) is
  // waiting for idle; vkDeviceWaitIdle has no timeout.
  if (device_ == VK_NULL_HANDLE || !pending_) return;
  std::lock_guard<std::mutex> lk(fence_mu_);
  if (!pending_) return;
  const uint64_t timeout_ns = static_cast<uint64_t>(fence_timeout_ms_) * 1000000ull;
  const VkResult r = vkWaitForFences(device_, 1, &fence_, VK_TRUE, timeout_ns);
  if (r == VK_SUCCESS) {
    pending_ = false;
    vkResetFences(device_, 1, &fence_);
  } else if (r == VK_TIMEOUT) {
    abandoned_ = true;
  }  // DEVICE_LOST: nothing will run any more; destroying is allowed
}

}  // namespace spw
