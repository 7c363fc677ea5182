// NvmlProbe against a real dlopen of a fake NVML built by the test suite, and
// against a library that does not exist.
#include "device/nvml_probe.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace spw::device {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Opens the same fake library the probe will load, to drive its controls.
class FakeNvml {
 public:
  explicit FakeNvml(const char* path) : handle_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) return;
    set_lost_ = reinterpret_cast<void (*)(unsigned, int)>(dlsym(handle_, "fake_nvml_set_lost"));
    set_init_ = reinterpret_cast<void (*)(int)>(dlsym(handle_, "fake_nvml_set_init_result"));
    counters_ = reinterpret_cast<void (*)(int*, int*, int*)>(dlsym(handle_, "fake_nvml_counters"));
    initialized_ = reinterpret_cast<int (*)()>(dlsym(handle_, "fake_nvml_initialized"));
  }
  ~FakeNvml() {
    if (handle_ == nullptr) return;
    set_lost_(0, 0);
    set_lost_(1, 0);
    set_init_(0);
    dlclose(handle_);
  }
  bool ok() const { return handle_ && set_lost_ && set_init_ && counters_ && initialized_; }
  void set_lost(unsigned i, bool lost) { set_lost_(i, lost ? 1 : 0); }
  void set_init_result(int rc) { set_init_(rc); }
  int init_calls() { int a, b, c; counters_(&a, &b, &c); return a; }
  int shutdown_calls() { int a, b, c; counters_(&a, &b, &c); return b; }
  int insufficient_returns() { int a, b, c; counters_(&a, &b, &c); return c; }
  bool initialized() { return initialized_() != 0; }

 private:
  void* handle_;
  void (*set_lost_)(unsigned, int) = nullptr;
  void (*set_init_)(int) = nullptr;
  void (*counters_)(int*, int*, int*) = nullptr;
  int (*initialized_)() = nullptr;
};

void expect_fake_values(const NvmlReport& r) {
  ASSERT_TRUE(r.loaded) << r.none_reason;
  ASSERT_EQ(r.gpus.size(), 2u);
  const NvmlGpu& g0 = r.gpus[0];
  EXPECT_EQ(g0.index, 0u);
  ASSERT_TRUE(g0.name.known()) << g0.name.reason();
  EXPECT_EQ(g0.name.value(), "Fake GPU 0 (spillway test)");
  EXPECT_EQ(g0.name.source(), "nvml");
  EXPECT_EQ(g0.memory_total_bytes.value(), 16 * kGiB);
  EXPECT_EQ(g0.memory_free_bytes.value(), 13 * kGiB);
  EXPECT_EQ(g0.memory_used_bytes.value(), 3 * kGiB);
  EXPECT_EQ(g0.temperature_c.value(), 45u);
  EXPECT_EQ(g0.health, DeviceHealth::kHealthy);
  ASSERT_TRUE(g0.processes.known()) << g0.processes.reason();
  const auto& procs = g0.processes.value();
  ASSERT_EQ(procs.size(), 3u);
  EXPECT_EQ(procs[0].pid, 1001u);
  EXPECT_EQ(procs[0].used_bytes.value(), 1 * kGiB);
  EXPECT_EQ(procs[1].pid, 1002u);
  EXPECT_EQ(procs[1].used_bytes.value(), 2 * kGiB);
  EXPECT_EQ(procs[2].pid, 1003u);
  ASSERT_FALSE(procs[2].used_bytes.known());
  EXPECT_TRUE(contains(procs[2].used_bytes.reason(), "NVML_VALUE_NOT_AVAILABLE"));

  const NvmlGpu& g1 = r.gpus[1];
  EXPECT_EQ(g1.name.value(), "Fake GPU 1");
  EXPECT_EQ(g1.memory_total_bytes.value(), 8 * kGiB);
  EXPECT_EQ(g1.memory_used_bytes.value(), kGiB / 2);
  EXPECT_EQ(g1.temperature_c.value(), 60u);
  ASSERT_TRUE(g1.processes.known());
  EXPECT_TRUE(g1.processes.value().empty());
}

TEST(NvmlProbe, MissingLibraryIsUnknownWithDlerror) {
  NvmlProbe probe("libspillway-no-such-nvml.so.1");
  NvmlReport r = probe.read();
  EXPECT_FALSE(r.loaded);
  EXPECT_TRUE(r.gpus.empty());
  EXPECT_EQ(r.none_reason.rfind("libspillway-no-such-nvml.so.1 not found: ", 0), 0u) << r.none_reason;
  EXPECT_TRUE(contains(r.none_reason, "cannot open shared object file")) << r.none_reason;
  // Reading again retries and stays unknown.
  EXPECT_FALSE(probe.read().loaded);
}

TEST(NvmlProbe, NotNvmlLibraryIsRefused) {
  // libdl/libc is a real library without NVML symbols.
  NvmlProbe probe("libc.so.6");
  NvmlReport r = probe.read();
  EXPECT_FALSE(r.loaded);
  EXPECT_TRUE(contains(r.none_reason, "lacks symbol nvmlInit_v2")) << r.none_reason;
}

TEST(NvmlProbe, SystemLibraryIfPresent) {
  NvmlProbe probe;
  NvmlReport r = probe.read();
  EXPECT_EQ(r.library, "libnvidia-ml.so.1");
  if (!r.loaded) {
    // On machines without the NVIDIA driver (CI, this build host) the reason
    // must say exactly that.
    EXPECT_TRUE(r.none_reason.rfind("libnvidia-ml.so.1 not found: ", 0) == 0 ||
                contains(r.none_reason, "nvmlInit_v2 failed"))
        << r.none_reason;
    return;
  }
  for (const NvmlGpu& g : r.gpus) {
    if (g.memory_total_bytes.known()) {
      EXPECT_GT(g.memory_total_bytes.value(), 0u);
      EXPECT_LE(g.memory_used_bytes.value(), g.memory_total_bytes.value());
    }
  }
}

TEST(NvmlProbe, FakeLibraryValuesReadBack) {
  FakeNvml fake(SPW_FAKE_NVML);
  ASSERT_TRUE(fake.ok()) << dlerror();
  int inits = fake.init_calls();
  int insufficient = fake.insufficient_returns();
  {
    NvmlProbe probe(SPW_FAKE_NVML);
    NvmlReport r = probe.read();
    expect_fake_values(r);
    EXPECT_EQ(r.library, SPW_FAKE_NVML);
    // The sizing call for GPU 0's three processes hit NVML_ERROR_INSUFFICIENT_SIZE.
    EXPECT_GT(fake.insufficient_returns(), insufficient);
    // A second read reuses the initialised library.
    expect_fake_values(probe.read());
    EXPECT_EQ(fake.init_calls(), inits + 1);
    EXPECT_TRUE(fake.initialized());
  }
  EXPECT_FALSE(fake.initialized()) << "destructor must call nvmlShutdown";
}

TEST(NvmlProbe, V1ProcessLayoutFallback) {
  FakeNvml fake(SPW_FAKE_NVML_V1);
  ASSERT_TRUE(fake.ok()) << dlerror();
  NvmlProbe probe(SPW_FAKE_NVML_V1);
  expect_fake_values(probe.read());
}

TEST(NvmlProbe, LostGpuIsDeviceLost) {
  FakeNvml fake(SPW_FAKE_NVML);
  ASSERT_TRUE(fake.ok());
  NvmlProbe probe(SPW_FAKE_NVML);
  ASSERT_EQ(probe.read().gpus[1].health, DeviceHealth::kHealthy);
  fake.set_lost(1, true);
  NvmlReport r = probe.read();
  ASSERT_EQ(r.gpus.size(), 2u);
  EXPECT_EQ(r.gpus[0].health, DeviceHealth::kHealthy);
  const NvmlGpu& g1 = r.gpus[1];
  EXPECT_EQ(g1.health, DeviceHealth::kDeviceLost);
  EXPECT_TRUE(contains(g1.health_detail, "GPU is lost (NVML error 15)")) << g1.health_detail;
  EXPECT_FALSE(g1.memory_total_bytes.known());
  EXPECT_FALSE(g1.temperature_c.known());
  EXPECT_FALSE(g1.processes.known());
  EXPECT_TRUE(g1.name.known());  // the name is still cached by the driver
  fake.set_lost(1, false);
  EXPECT_EQ(probe.read().gpus[1].health, DeviceHealth::kHealthy);
}

TEST(NvmlProbe, InitFailureIsUnknownAndRetried) {
  FakeNvml fake(SPW_FAKE_NVML);
  ASSERT_TRUE(fake.ok());
  NvmlProbe probe(SPW_FAKE_NVML);
  fake.set_init_result(9);
  NvmlReport r = probe.read();
  EXPECT_FALSE(r.loaded);
  EXPECT_TRUE(contains(r.none_reason, "nvmlInit_v2 failed: Driver Not Loaded (NVML error 9)")) << r.none_reason;
  fake.set_init_result(0);
  expect_fake_values(probe.read());
}

TEST(NvmlProbe, ConcurrentReadsAreSerialised) {
  FakeNvml fake(SPW_FAKE_NVML);
  ASSERT_TRUE(fake.ok());
  NvmlProbe probe(SPW_FAKE_NVML);
  std::vector<std::thread> threads;
  std::vector<int> healthy(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        NvmlReport r = probe.read();
        if (r.loaded && r.gpus.size() == 2 && r.gpus[0].health == DeviceHealth::kHealthy) ++healthy[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int h : healthy) EXPECT_EQ(h, 50);
}

}  // namespace
}  // namespace spw::device
