// `spillway occupy --device vulkan[:i] --bytes SIZE [--hold-s S]`: a
// competing GPU workload for drills and demos. It allocates SIZE of
// device-local memory on Vulkan device i and writes every byte of it (so the
// driver really commits it: on lavapipe device memory is host RAM and pages
// count only once touched), prints "holding N bytes on DEVICE" on stdout,
// then holds it until SIGTERM/SIGINT or --hold-s seconds (0: until a
// signal), frees it and exits 0.
// It tells nobody: run it under `spillway reserve --bytes SIZE -- spillway
// occupy ...` to declare it to a server, or alone to be an undeclared
// co-tenant that only observed usage (VK_EXT_memory_budget) can see.
// Failure: bad flags or size exit 2; no Vulkan, no such device or an
// allocation the driver refuses exit 1, with the reason on stderr and
// nothing held.
// Memory is allocated in chunks (at most 256 MiB or the device's
// maxMemoryAllocationSize each) so sizes above one allocation's limit work.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "backend/vulkan/device_spec.h"

#if SPILLWAY_HAVE_VULKAN
#include <vulkan/vulkan.h>
#endif

namespace spw::app {
namespace {

struct OccupyOptions {
  std::string device = "vulkan";
  std::string bytes;
  double hold_s = 0;
};

std::atomic<bool> g_stop{false};
extern "C" void occupy_on_signal(int) { g_stop.store(true); }

#if SPILLWAY_HAVE_VULKAN

// Owns every Vulkan object made, destroyed in reverse order on any exit.
struct Vk {
  VkInstance instance = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  std::vector<VkDeviceMemory> memories;
  std::vector<VkBuffer> buffers;
  ~Vk() {
    if (device != VK_NULL_HANDLE) {
      vkDeviceWaitIdle(device);
      for (VkBuffer b : buffers) vkDestroyBuffer(device, b, nullptr);
      for (VkDeviceMemory m : memories) vkFreeMemory(device, m, nullptr);
      if (pool != VK_NULL_HANDLE) vkDestroyCommandPool(device, pool, nullptr);
      vkDestroyDevice(device, nullptr);
    }
    if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
  }
};

int fail(const std::string& what, VkResult r) {
  std::fprintf(stderr, "spillway occupy: %s failed (VkResult %d)\n", what.c_str(), static_cast<int>(r));
  return 1;
}

// Writes `size` bytes of `mem` without mapping it: a buffer over it filled
// by the device (memory that is device-local only).
int fill_on_device(Vk& vk, uint32_t queue_family, VkDeviceMemory mem, uint64_t size) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buf = VK_NULL_HANDLE;
  if (VkResult r = vkCreateBuffer(vk.device, &bi, nullptr, &buf); r != VK_SUCCESS) return fail("vkCreateBuffer", r);
  vk.buffers.push_back(buf);
  if (VkResult r = vkBindBufferMemory(vk.device, buf, mem, 0); r != VK_SUCCESS) return fail("vkBindBufferMemory", r);
  if (vk.pool == VK_NULL_HANDLE) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = queue_family;
    pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    if (VkResult r = vkCreateCommandPool(vk.device, &pi, nullptr, &vk.pool); r != VK_SUCCESS)
      return fail("vkCreateCommandPool", r);
  }
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = vk.pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  if (VkResult r = vkAllocateCommandBuffers(vk.device, &ai, &cmd); r != VK_SUCCESS)
    return fail("vkAllocateCommandBuffers", r);
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vkBeginCommandBuffer(cmd, &begin);
  vkCmdFillBuffer(cmd, buf, 0, VK_WHOLE_SIZE, 0xA5A5A5A5u);
  vkEndCommandBuffer(cmd);
  VkQueue queue = VK_NULL_HANDLE;
  vkGetDeviceQueue(vk.device, queue_family, 0, &queue);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  if (VkResult r = vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE); r != VK_SUCCESS) return fail("vkQueueSubmit", r);
  if (VkResult r = vkQueueWaitIdle(queue); r != VK_SUCCESS) return fail("vkQueueWaitIdle", r);
  vkFreeCommandBuffers(vk.device, vk.pool, 1, &cmd);
  return 0;
}

// Holds until a signal or `hold_s` (0: no limit); 0 when it held and let go.
int occupy(uint32_t index, uint64_t bytes, const std::string& device_text, double hold_s) {
  Vk vk;
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "spillway-occupy";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  if (VkResult r = vkCreateInstance(&ici, nullptr, &vk.instance); r != VK_SUCCESS) return fail("vkCreateInstance", r);
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(vk.instance, &n, nullptr);
  std::vector<VkPhysicalDevice> pds(n);
  vkEnumeratePhysicalDevices(vk.instance, &n, pds.data());
  if (index >= n) {
    std::fprintf(stderr, "spillway occupy: %s: no such Vulkan device (%u found)\n", device_text.c_str(), n);
    return 1;
  }
  VkPhysicalDevice pd = pds[index];
  VkPhysicalDeviceProperties props{};
  vkGetPhysicalDeviceProperties(pd, &props);
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &m3;
  vkGetPhysicalDeviceProperties2(pd, &p2);
  VkPhysicalDeviceMemoryProperties mp{};
  vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  // Device-local memory; host-visible and coherent preferred (written by
  // the CPU), else filled by the device.
  int type = -1;
  bool mappable = false;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
    if (!(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) continue;
    const bool m = (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (type < 0 || (m && !mappable)) {
      type = static_cast<int>(i);
      mappable = m;
    }
  }
  if (type < 0) {
    std::fprintf(stderr, "spillway occupy: %s (%s) has no device-local memory type\n", device_text.c_str(),
                 props.deviceName);
    return 1;
  }
  uint32_t qf_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qf_count, nullptr);
  std::vector<VkQueueFamilyProperties> qfs(qf_count);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &qf_count, qfs.data());
  uint32_t qf = 0;
  for (uint32_t i = 0; i < qf_count; ++i) {
    if (qfs[i].queueFlags & (VK_QUEUE_COMPUTE_BIT | VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_TRANSFER_BIT)) {
      qf = i;
      break;
    }
  }
  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = qf;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qi;
  if (VkResult r = vkCreateDevice(pd, &dci, nullptr, &vk.device); r != VK_SUCCESS) return fail("vkCreateDevice", r);

  uint64_t chunk_max = uint64_t{256} << 20;
  if (m3.maxMemoryAllocationSize > 0) chunk_max = std::min<uint64_t>(chunk_max, m3.maxMemoryAllocationSize);
  uint64_t left = bytes;
  while (left > 0) {
    const uint64_t size = std::min(left, chunk_max);
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    mai.allocationSize = size;
    mai.memoryTypeIndex = static_cast<uint32_t>(type);
    VkDeviceMemory mem = VK_NULL_HANDLE;
    if (VkResult r = vkAllocateMemory(vk.device, &mai, nullptr, &mem); r != VK_SUCCESS) {
      return fail("vkAllocateMemory of " + std::to_string(size) + " bytes (" + std::to_string(bytes - left) +
                      " already held)",
                  r);
    }
    vk.memories.push_back(mem);
    if (mappable) {
      void* p = nullptr;
      if (VkResult r = vkMapMemory(vk.device, mem, 0, VK_WHOLE_SIZE, 0, &p); r != VK_SUCCESS) return fail("vkMapMemory", r);
      std::memset(p, 0xA5, size);  // touch every page: committed, not just promised
      vkUnmapMemory(vk.device, mem);
    } else if (int rc = fill_on_device(vk, qf, mem, size); rc != 0) {
      return rc;
    }
    left -= size;
  }
  std::printf("holding %llu bytes on %s (%s, memory type %d%s)\n", static_cast<unsigned long long>(bytes),
              device_text.c_str(), props.deviceName, type, mappable ? ", written by the host" : ", filled by the device");
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(hold_s);
  while (!g_stop.load() && (hold_s == 0 || std::chrono::steady_clock::now() < until)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;  // `vk` frees everything on the way out
}

#endif  // SPILLWAY_HAVE_VULKAN

int run_occupy(const OccupyOptions& o) {
  auto bytes = parse_memory_size(o.bytes);
  if (!bytes.ok() || *bytes == 0) {
    std::fprintf(stderr, "spillway occupy: --bytes %s: %s\n", o.bytes.c_str(),
                 bytes.ok() ? "must be > 0" : bytes.status().message().c_str());
    return 2;
  }
  uint32_t index = 0;
  if (o.device != "vulkan") {
    const std::string prefix = "vulkan:";
    if (o.device.rfind(prefix, 0) != 0 || o.device.size() == prefix.size() ||
        o.device.find_first_not_of("0123456789", prefix.size()) != std::string::npos) {
      std::fprintf(stderr, "spillway occupy: --device %s: expected vulkan or vulkan:INDEX\n", o.device.c_str());
      return 2;
    }
    index = static_cast<uint32_t>(std::stoul(o.device.substr(prefix.size())));
  }
  if (o.hold_s < 0) {
    std::fprintf(stderr, "spillway occupy: --hold-s must be >= 0\n");
    return 2;
  }
#if SPILLWAY_HAVE_VULKAN
  struct sigaction sa {};
  sa.sa_handler = occupy_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return occupy(index, *bytes, o.device, o.hold_s);
#else
  (void)index;
  std::fprintf(stderr, "spillway occupy: this build has no Vulkan support\n");
  return 1;
#endif
}

}  // namespace

void add_occupy(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<OccupyOptions>();
  CLI::App* sub = app.add_subcommand("occupy", "Hold device memory as a competing GPU workload (drills, demos)");
  sub->add_option("--device", o->device, "vulkan or vulkan:INDEX")->capture_default_str();
  sub->add_option("--bytes", o->bytes, "How much device memory to hold, e.g. 512MiB")->required();
  sub->add_option("--hold-s", o->hold_s, "Seconds to hold it (0: until SIGTERM/SIGINT)")->capture_default_str();
  sub->callback([o, &exit_code] { exit_code = run_occupy(*o); });
}

}  // namespace spw::app
