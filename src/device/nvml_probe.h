// NvmlProbe: NVIDIA GPU memory, temperature, per-process memory and health
// through NVML, loaded with dlopen at run time.
//
// Contract: Spillway neither links against NVML nor includes NVIDIA headers; the
// few entry points used are declared in nvml_probe.cpp from the documented C
// ABI. The first read() dlopens the library (default "libnvidia-ml.so.1"; a
// path or name can be injected, which is how tests load a fake NVML built by the
// test suite) and calls nvmlInit_v2; the library stays loaded and initialised
// until the probe is destroyed (nvmlShutdown, dlclose), because init is slow and
// telemetry is polled. When dlopen fails, a required symbol is missing or init
// fails, read() returns no GPUs and a none_reason such as
// "libnvidia-ml.so.1 not found: <dlerror text>", and the next read() tries
// again. Per GPU, each figure is its own Reading (source "nvml"); a failed call
// makes only that figure unknown with NVML's error string and code.
// Health: kHealthy when both nvmlDeviceGetTemperature and
// nvmlDeviceGetMemoryInfo succeed; kDeviceLost when any call on the device
// returns NVML_ERROR_GPU_IS_LOST (15) or NVML_ERROR_RESET_REQUIRED (16);
// otherwise kUnknown, with the failing call in health_detail.
// Thread safety: read() may be called from several threads; calls are
// serialised by an internal mutex (NVML itself is thread-safe, the probe's
// lazily-opened state is not).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/reading.h"

namespace spw::device {

inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// NVML return codes this probe interprets (values from the public NVML ABI).
inline constexpr int kNvmlSuccess = 0;
inline constexpr int kNvmlErrorInsufficientSize = 7;
inline constexpr int kNvmlErrorGpuIsLost = 15;
inline constexpr int kNvmlErrorResetRequired = 16;

struct NvmlProcess {
  uint32_t pid = 0;
  Reading<uint64_t> used_bytes;  // unknown when NVML reports NVML_VALUE_NOT_AVAILABLE
};

struct NvmlGpu {
  uint32_t index = 0;
  Reading<std::string> name;
  Reading<uint64_t> memory_total_bytes;
  Reading<uint64_t> memory_free_bytes;
  Reading<uint64_t> memory_used_bytes;
  Reading<uint64_t> temperature_c;                 // GPU core sensor
  Reading<std::vector<NvmlProcess>> processes;     // compute processes and their memory
  DeviceHealth health = DeviceHealth::kUnknown;
  std::string health_detail;                       // why not healthy
};

struct NvmlReport {
  bool loaded = false;       // library opened and initialised
  std::string library;       // what was passed to dlopen
  std::vector<NvmlGpu> gpus;
  std::string none_reason;   // set when gpus is empty
};

class NvmlProbe {
 public:
  explicit NvmlProbe(std::string library = kNvmlLibrary);
  ~NvmlProbe();
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  NvmlReport read();

 private:
  struct Api;
  std::string library_;
  std::mutex mu_;
  std::unique_ptr<Api> api_;  // null until loaded and initialised
};

}  // namespace spw::device
