#include "device/nvml_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace spw::device {

// The C ABI subset of NVML, declared here so no NVIDIA header is needed.
// nvmlReturn_t and nvmlTemperatureSensors_t are C enums (int-sized).
namespace {

struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;
using NvmlReturn = int;

struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlProcessInfoV1 {  // nvmlProcessInfo_v1_t, for the unsuffixed entry point
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct NvmlProcessInfoV2 {  // nvmlProcessInfo_v2_t, for the _v2 entry point
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

constexpr int kNvmlTemperatureGpu = 0;                       // NVML_TEMPERATURE_GPU
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE
constexpr unsigned int kNameBufferSize = 96;                 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kMaxProcesses = 4096;                 // bound on what a driver may ask for

using InitFn = NvmlReturn (*)();
using ShutdownFn = NvmlReturn (*)();
using GetCountFn = NvmlReturn (*)(unsigned int*);
using GetHandleFn = NvmlReturn (*)(unsigned int, NvmlDevice*);
using GetNameFn = NvmlReturn (*)(NvmlDevice, char*, unsigned int);
using GetMemoryFn = NvmlReturn (*)(NvmlDevice, NvmlMemory*);
using GetTemperatureFn = NvmlReturn (*)(NvmlDevice, int, unsigned int*);
using GetProcessesFn = NvmlReturn (*)(NvmlDevice, unsigned int*, void*);
using ErrorStringFn = const char* (*)(NvmlReturn);

bool is_lost(NvmlReturn rc) { return rc == kNvmlErrorGpuIsLost || rc == kNvmlErrorResetRequired; }

// One GPU's failures as they are met: the first (the health detail) and the
// first that says the device is lost.
struct GpuFailures {
  bool lost = false;
  std::string first_failure;
  std::string lost_detail;
  void note(const std::string& what, NvmlReturn code) {
    if (is_lost(code) && !lost) {
      lost = true;
      lost_detail = what;
    }
    if (first_failure.empty()) first_failure = what;
  }
};

}  // namespace

struct NvmlProbe::Api {
  void* handle = nullptr;
  ShutdownFn shutdown = nullptr;
  GetCountFn get_count = nullptr;
  GetHandleFn get_handle = nullptr;
  GetNameFn get_name = nullptr;
  GetMemoryFn get_memory = nullptr;
  GetTemperatureFn get_temperature = nullptr;
  GetProcessesFn get_processes = nullptr;  // may be null: processes then unknown
  bool processes_v2 = false;
  ErrorStringFn error_string = nullptr;

  std::string error(const char* call, NvmlReturn rc) const {
    const char* text = error_string != nullptr ? error_string(rc) : nullptr;
    return std::string(call) + " failed: " + (text != nullptr ? text : "unknown error") + " (NVML error " +
           std::to_string(rc) + ")";
  }

  // dlopen, the symbols and nvmlInit_v2; null with none_reason set when any fails.
  static std::unique_ptr<Api> load(const std::string& library, std::string& none_reason);
  // GPU `i`: every reading, each failure named, and the health they add up to.
  NvmlGpu read_gpu(unsigned int i, const std::string& library) const;
  // Memory readings into g; false when they are unknown.
  bool read_memory(NvmlDevice dev, NvmlGpu& g, GpuFailures& failures) const;
  Reading<std::vector<NvmlProcess>> read_processes(NvmlDevice dev, const std::string& library,
                                                   GpuFailures& failures) const;
};

namespace {

template <typename Fn>
bool bind(void* handle, const char* name, Fn& out, std::string& missing) {
  dlerror();
  out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (out == nullptr && missing.empty()) missing = name;
  return out != nullptr;
}

}  // namespace

NvmlProbe::NvmlProbe(std::string library) : library_(std::move(library)) {}

NvmlProbe::~NvmlProbe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (api_) {
    api_->shutdown();
    dlclose(api_->handle);
  }
}

std::unique_ptr<NvmlProbe::Api> NvmlProbe::Api::load(const std::string& library, std::string& none_reason) {
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    none_reason = library + " not found: " + (err != nullptr ? err : "dlopen failed");
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->handle = handle;
  InitFn init = nullptr;
  std::string missing;
  bind(handle, "nvmlInit_v2", init, missing);
  bind(handle, "nvmlShutdown", api->shutdown, missing);
  bind(handle, "nvmlDeviceGetCount_v2", api->get_count, missing);
  bind(handle, "nvmlDeviceGetHandleByIndex_v2", api->get_handle, missing);
  bind(handle, "nvmlDeviceGetName", api->get_name, missing);
  bind(handle, "nvmlDeviceGetMemoryInfo", api->get_memory, missing);
  bind(handle, "nvmlDeviceGetTemperature", api->get_temperature, missing);
  bind(handle, "nvmlErrorString", api->error_string, missing);
  if (!missing.empty()) {
    dlclose(handle);
    none_reason = library + " lacks symbol " + missing + " (not NVML, or too old)";
    return nullptr;
  }
  std::string optional_missing;
  if (bind(handle, "nvmlDeviceGetComputeRunningProcesses_v2", api->get_processes, optional_missing)) {
    api->processes_v2 = true;
  } else {
    bind(handle, "nvmlDeviceGetComputeRunningProcesses", api->get_processes, optional_missing);
  }
  NvmlReturn rc = init();
  if (rc != kNvmlSuccess) {
    none_reason = library + ": " + api->error("nvmlInit_v2", rc);
    dlclose(handle);
    return nullptr;
  }
  return api;
}

bool NvmlProbe::Api::read_memory(NvmlDevice dev, NvmlGpu& g, GpuFailures& failures) const {
  NvmlMemory mem{};
  NvmlReturn rc = get_memory(dev, &mem);
  bool memory_ok = rc == kNvmlSuccess;
  if (memory_ok && (mem.used > mem.total || mem.free > mem.total)) {
    std::string e = "nvmlDeviceGetMemoryInfo returned used " + std::to_string(mem.used) + " / free " +
                    std::to_string(mem.free) + " above total " + std::to_string(mem.total);
    g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = Reading<uint64_t>::unknown(e);
    memory_ok = false;
    if (failures.first_failure.empty()) failures.first_failure = e;
  } else if (memory_ok) {
    g.memory_total_bytes = Reading<uint64_t>::of(mem.total, "nvml");
    g.memory_free_bytes = Reading<uint64_t>::of(mem.free, "nvml");
    g.memory_used_bytes = Reading<uint64_t>::of(mem.used, "nvml");
  } else {
    std::string e = error("nvmlDeviceGetMemoryInfo", rc);
    g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = Reading<uint64_t>::unknown(e);
    failures.note(e, rc);
  }
  return memory_ok;
}

Reading<std::vector<NvmlProcess>> NvmlProbe::Api::read_processes(NvmlDevice dev, const std::string& library,
                                                                 GpuFailures& failures) const {
  if (get_processes == nullptr) {
    return Reading<std::vector<NvmlProcess>>::unknown(library + " has no nvmlDeviceGetComputeRunningProcesses");
  }
  // The process list can grow between the sizing call and the fetch, so
  // retry a few times with headroom.
  const size_t stride = processes_v2 ? sizeof(NvmlProcessInfoV2) : sizeof(NvmlProcessInfoV1);
  const char* call = processes_v2 ? "nvmlDeviceGetComputeRunningProcesses_v2" : "nvmlDeviceGetComputeRunningProcesses";
  std::vector<unsigned char> buf;
  unsigned int capacity = 0;
  unsigned int n = 0;
  NvmlReturn rc = kNvmlErrorInsufficientSize;
  for (int attempt = 0; attempt < 4 && rc == kNvmlErrorInsufficientSize; ++attempt) {
    n = capacity;
    rc = get_processes(dev, &n, capacity > 0 ? buf.data() : nullptr);
    if (rc == kNvmlErrorInsufficientSize) {
      if (n > kMaxProcesses) break;
      capacity = n + 8;
      buf.assign(static_cast<size_t>(capacity) * stride, 0);
    }
  }
  if (rc == kNvmlSuccess) {
    std::vector<NvmlProcess> procs;
    n = std::min(n, capacity);  // a driver never returns more than it was given room for
    for (unsigned int k = 0; k < n; ++k) {
      unsigned int pid = 0;
      unsigned long long used = 0;
      if (processes_v2) {
        NvmlProcessInfoV2 info;
        std::memcpy(&info, buf.data() + k * stride, sizeof info);
        pid = info.pid;
        used = info.used_gpu_memory;
      } else {
        NvmlProcessInfoV1 info;
        std::memcpy(&info, buf.data() + k * stride, sizeof info);
        pid = info.pid;
        used = info.used_gpu_memory;
      }
      NvmlProcess p;
      p.pid = pid;
      p.used_bytes = used == kNvmlValueNotAvailable
                         ? Reading<uint64_t>::unknown("NVML_VALUE_NOT_AVAILABLE for pid " + std::to_string(pid))
                         : Reading<uint64_t>::of(used, "nvml");
      procs.push_back(std::move(p));
    }
    return Reading<std::vector<NvmlProcess>>::of(std::move(procs), "nvml");
  }
  if (rc == kNvmlErrorInsufficientSize) {
    return Reading<std::vector<NvmlProcess>>::unknown(std::string(call) + " kept asking for more room (" +
                                                      std::to_string(n) + " entries)");
  }
  Reading<std::vector<NvmlProcess>> unknown = Reading<std::vector<NvmlProcess>>::unknown(error(call, rc));
  failures.note(unknown.reason(), rc);
  return unknown;
}

NvmlGpu NvmlProbe::Api::read_gpu(unsigned int i, const std::string& library) const {
  NvmlGpu g;
  g.index = i;
  GpuFailures failures;
  NvmlDevice dev = nullptr;
  NvmlReturn rc = get_handle(i, &dev);
  if (rc != kNvmlSuccess) {
    std::string e = error("nvmlDeviceGetHandleByIndex_v2", rc);
    failures.note(e, rc);
    g.name = Reading<std::string>::unknown(e);
    g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = g.temperature_c =
        Reading<uint64_t>::unknown(e);
    g.processes = Reading<std::vector<NvmlProcess>>::unknown(e);
  } else {
    char name[kNameBufferSize] = {};
    rc = get_name(dev, name, kNameBufferSize);
    if (rc == kNvmlSuccess) {
      name[kNameBufferSize - 1] = '\0';
      g.name = Reading<std::string>::of(name, "nvml");
    } else {
      g.name = Reading<std::string>::unknown(error("nvmlDeviceGetName", rc));
      failures.note(g.name.reason(), rc);
    }

    const bool memory_ok = read_memory(dev, g, failures);

    unsigned int temp = 0;
    rc = get_temperature(dev, kNvmlTemperatureGpu, &temp);
    bool temp_ok = rc == kNvmlSuccess;
    if (temp_ok) {
      g.temperature_c = Reading<uint64_t>::of(temp, "nvml");
    } else {
      g.temperature_c = Reading<uint64_t>::unknown(error("nvmlDeviceGetTemperature", rc));
      failures.note(g.temperature_c.reason(), rc);
    }
    if (temp_ok && memory_ok && !failures.lost) g.health = DeviceHealth::kHealthy;

    g.processes = read_processes(dev, library, failures);
  }
  if (failures.lost) {
    g.health = DeviceHealth::kDeviceLost;
    g.health_detail = failures.lost_detail;
  } else if (g.health != DeviceHealth::kHealthy) {
    g.health_detail = failures.first_failure;
  }
  return g;
}

NvmlReport NvmlProbe::read() {
  std::lock_guard<std::mutex> lock(mu_);
  NvmlReport report;
  report.library = library_;

  if (!api_) {
    api_ = Api::load(library_, report.none_reason);
    if (!api_) return report;
  }
  report.loaded = true;
  const Api& api = *api_;

  unsigned int count = 0;
  NvmlReturn rc = api.get_count(&count);
  if (rc != kNvmlSuccess) {
    report.none_reason = api.error("nvmlDeviceGetCount_v2", rc);
    return report;
  }
  if (count == 0) {
    report.none_reason = "NVML reports no GPUs";
    return report;
  }

  for (unsigned int i = 0; i < count; ++i) report.gpus.push_back(api.read_gpu(i, library_));
  return report;
}

}  // namespace spw::device
