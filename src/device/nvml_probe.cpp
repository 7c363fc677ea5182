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

NvmlReport NvmlProbe::read() {
  std::lock_guard<std::mutex> lock(mu_);
  NvmlReport report;
  report.library = library_;

  if (!api_) {
    dlerror();
    void* handle = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      report.none_reason = library_ + " not found: " + (err != nullptr ? err : "dlopen failed");
      return report;
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
      report.none_reason = library_ + " lacks symbol " + missing + " (not NVML, or too old)";
      return report;
    }
    std::string optional_missing;
    if (bind(handle, "nvmlDeviceGetComputeRunningProcesses_v2", api->get_processes, optional_missing)) {
      api->processes_v2 = true;
    } else {
      bind(handle, "nvmlDeviceGetComputeRunningProcesses", api->get_processes, optional_missing);
    }
    NvmlReturn rc = init();
    if (rc != kNvmlSuccess) {
      report.none_reason = library_ + ": " + api->error("nvmlInit_v2", rc);
      dlclose(handle);
      return report;
    }
    api_ = std::move(api);
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

  for (unsigned int i = 0; i < count; ++i) {
    NvmlGpu g;
    g.index = i;
    bool lost = false;
    std::string first_failure;
    std::string lost_detail;
    auto note = [&](const std::string& what, NvmlReturn code) {
      if (is_lost(code) && !lost) {
        lost = true;
        lost_detail = what;
      }
      if (first_failure.empty()) first_failure = what;
    };

    NvmlDevice dev = nullptr;
    rc = api.get_handle(i, &dev);
    if (rc != kNvmlSuccess) {
      std::string e = api.error("nvmlDeviceGetHandleByIndex_v2", rc);
      note(e, rc);
      g.name = Reading<std::string>::unknown(e);
      g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = g.temperature_c =
          Reading<uint64_t>::unknown(e);
      g.processes = Reading<std::vector<NvmlProcess>>::unknown(e);
    } else {
      char name[kNameBufferSize] = {};
      rc = api.get_name(dev, name, kNameBufferSize);
      if (rc == kNvmlSuccess) {
        name[kNameBufferSize - 1] = '\0';
        g.name = Reading<std::string>::of(name, "nvml");
      } else {
        g.name = Reading<std::string>::unknown(api.error("nvmlDeviceGetName", rc));
        note(g.name.reason(), rc);
      }

      NvmlMemory mem{};
      rc = api.get_memory(dev, &mem);
      bool memory_ok = rc == kNvmlSuccess;
      if (memory_ok && (mem.used > mem.total || mem.free > mem.total)) {
        std::string e = "nvmlDeviceGetMemoryInfo returned used " + std::to_string(mem.used) + " / free " +
                        std::to_string(mem.free) + " above total " + std::to_string(mem.total);
        g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = Reading<uint64_t>::unknown(e);
        memory_ok = false;
        if (first_failure.empty()) first_failure = e;
      } else if (memory_ok) {
        g.memory_total_bytes = Reading<uint64_t>::of(mem.total, "nvml");
        g.memory_free_bytes = Reading<uint64_t>::of(mem.free, "nvml");
        g.memory_used_bytes = Reading<uint64_t>::of(mem.used, "nvml");
      } else {
        std::string e = api.error("nvmlDeviceGetMemoryInfo", rc);
        g.memory_total_bytes = g.memory_free_bytes = g.memory_used_bytes = Reading<uint64_t>::unknown(e);
        note(e, rc);
      }

      unsigned int temp = 0;
      rc = api.get_temperature(dev, kNvmlTemperatureGpu, &temp);
      bool temp_ok = rc == kNvmlSuccess;
      if (temp_ok) {
        g.temperature_c = Reading<uint64_t>::of(temp, "nvml");
      } else {
        g.temperature_c = Reading<uint64_t>::unknown(api.error("nvmlDeviceGetTemperature", rc));
        note(g.temperature_c.reason(), rc);
      }
      if (temp_ok && memory_ok && !lost) g.health = DeviceHealth::kHealthy;

      if (api.get_processes == nullptr) {
        g.processes = Reading<std::vector<NvmlProcess>>::unknown(
            library_ + " has no nvmlDeviceGetComputeRunningProcesses");
      } else {
        // The process list can grow between the sizing call and the fetch, so
        // retry a few times with headroom.
        const size_t stride = api.processes_v2 ? sizeof(NvmlProcessInfoV2) : sizeof(NvmlProcessInfoV1);
        const char* call = api.processes_v2 ? "nvmlDeviceGetComputeRunningProcesses_v2"
                                            : "nvmlDeviceGetComputeRunningProcesses";
        std::vector<unsigned char> buf;
        unsigned int capacity = 0;
        unsigned int n = 0;
        rc = kNvmlErrorInsufficientSize;
        for (int attempt = 0; attempt < 4 && rc == kNvmlErrorInsufficientSize; ++attempt) {
          n = capacity;
          rc = api.get_processes(dev, &n, capacity > 0 ? buf.data() : nullptr);
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
            if (api.processes_v2) {
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
          g.processes = Reading<std::vector<NvmlProcess>>::of(std::move(procs), "nvml");
        } else if (rc == kNvmlErrorInsufficientSize) {
          g.processes = Reading<std::vector<NvmlProcess>>::unknown(
              std::string(call) + " kept asking for more room (" + std::to_string(n) + " entries)");
        } else {
          g.processes = Reading<std::vector<NvmlProcess>>::unknown(api.error(call, rc));
          note(g.processes.reason(), rc);
        }
      }
    }
    if (lost) {
      g.health = DeviceHealth::kDeviceLost;
      g.health_detail = lost_detail;
    } else if (g.health != DeviceHealth::kHealthy) {
      g.health_detail = first_failure;
    }
    report.gpus.push_back(std::move(g));
  }
  return report;
}

}  // namespace spw::device
