// A fake libnvidia-ml for tests: the NVML entry points NvmlProbe uses, with
// fixed values, plus fake_nvml_* controls a test reaches through dlsym on the
// same library (dlopen of the same path returns the same instance).
// Built as a shared library by src/device/CMakeLists.txt; with FAKE_NVML_NO_V2
// it exports only the unsuffixed (v1 layout) process query.
#include <cstring>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct FakeDevice {
  const char* name;
  unsigned long long total, free, used;
  unsigned int temperature;
  unsigned int n_procs;
  unsigned int pids[3];
  unsigned long long proc_used[3];
  bool lost;
};

constexpr unsigned long long kGiB = 1ULL << 30;
constexpr unsigned long long kNotAvailable = ~0ULL;

FakeDevice g_devices[2] = {
    {"Fake GPU 0 (spillway test)", 16 * kGiB, 13 * kGiB, 3 * kGiB, 45, 3, {1001, 1002, 1003},
     {1 * kGiB, 2 * kGiB, kNotAvailable}, false},
    {"Fake GPU 1", 8 * kGiB, 7 * kGiB + kGiB / 2, kGiB / 2, 60, 0, {}, {}, false},
};
bool g_initialized = false;
int g_init_result = 0;
int g_init_calls = 0;
int g_shutdown_calls = 0;
int g_insufficient_returns = 0;

FakeDevice* dev(void* handle) { return static_cast<FakeDevice*>(handle); }

struct ProcV1 {
  unsigned int pid;
  unsigned long long used;
};
struct ProcV2 {
  unsigned int pid;
  unsigned long long used;
  unsigned int gi, ci;
};

template <typename Proc>
int running_processes(void* handle, unsigned int* count, Proc* infos) {
  if (!g_initialized) return 1;
  if (handle == nullptr || count == nullptr) return 2;
  FakeDevice* d = dev(handle);
  if (d->lost) return 15;
  if (*count < d->n_procs || (d->n_procs > 0 && infos == nullptr)) {
    *count = d->n_procs;
    ++g_insufficient_returns;
    return 7;
  }
  for (unsigned int i = 0; i < d->n_procs; ++i) {
    std::memset(&infos[i], 0, sizeof(Proc));
    infos[i].pid = d->pids[i];
    infos[i].used = d->proc_used[i];
  }
  *count = d->n_procs;
  return 0;
}

}  // namespace

FAKE_EXPORT int nvmlInit_v2() {
  ++g_init_calls;
  if (g_init_result != 0) return g_init_result;
  g_initialized = true;
  return 0;
}
FAKE_EXPORT int nvmlShutdown() {
  ++g_shutdown_calls;
  g_initialized = false;
  return 0;
}
FAKE_EXPORT int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!g_initialized) return 1;
  *count = 2;
  return 0;
}
FAKE_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (!g_initialized) return 1;
  if (index >= 2) return 2;
  *device = &g_devices[index];
  return 0;
}
FAKE_EXPORT int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  if (!g_initialized) return 1;
  const char* n = dev(device)->name;
  if (std::strlen(n) + 1 > length) return 7;
  std::strcpy(name, n);
  return 0;
}
FAKE_EXPORT int nvmlDeviceGetMemoryInfo(void* device, unsigned long long* mem /* total, free, used */) {
  if (!g_initialized) return 1;
  FakeDevice* d = dev(device);
  if (d->lost) return 15;
  mem[0] = d->total;
  mem[1] = d->free;
  mem[2] = d->used;
  return 0;
}
FAKE_EXPORT int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* temp) {
  if (!g_initialized) return 1;
  if (sensor != 0) return 3;
  FakeDevice* d = dev(device);
  if (d->lost) return 15;
  *temp = d->temperature;
  return 0;
}
#ifndef FAKE_NVML_NO_V2
FAKE_EXPORT int nvmlDeviceGetComputeRunningProcesses_v2(void* device, unsigned int* count, ProcV2* infos) {
  return running_processes(device, count, infos);
}
#endif
FAKE_EXPORT int nvmlDeviceGetComputeRunningProcesses(void* device, unsigned int* count, ProcV1* infos) {
  return running_processes(device, count, infos);
}
FAKE_EXPORT const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
  }
}

// Test controls.
FAKE_EXPORT void fake_nvml_set_lost(unsigned int index, int lost) { g_devices[index].lost = lost != 0; }
FAKE_EXPORT void fake_nvml_set_init_result(int rc) { g_init_result = rc; }
FAKE_EXPORT void fake_nvml_counters(int* init_calls, int* shutdown_calls, int* insufficient_returns) {
  *init_calls = g_init_calls;
  *shutdown_calls = g_shutdown_calls;
  *insufficient_returns = g_insufficient_returns;
}
FAKE_EXPORT int fake_nvml_initialized() { return g_initialized ? 1 : 0; }
