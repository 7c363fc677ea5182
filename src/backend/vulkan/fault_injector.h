// FaultInjector: explicit, compiled-in injection of the Vulkan faults that
// lavapipe cannot produce on demand.
//
// Contract: nothing happens until a test or an admin path arms a fault; each
// armed fault fires once and then disarms itself:
//   fail_allocation(n)        the (n+1)-th device-memory allocation from now
//                             (n = 0: the next one) fails as if vkAllocateMemory
//                             returned VK_ERROR_OUT_OF_DEVICE_MEMORY
//                             -> ResourceExhausted, context unhealthy;
//   device_lost_at_next_submit()  the next queue submission is not made and
//                             reports VK_ERROR_DEVICE_LOST -> DeviceLost,
//                             context unhealthy;
//   fence_timeout_at_next_wait()  the next fence wait waits for the real work
//                             (so no resource is left in use) and then reports
//                             VK_TIMEOUT -> DeadlineExceeded, context unhealthy.
// disarm() clears everything. The take_*() calls are the hooks the Vulkan code
// calls at those points; each returns true at most once per arming.
// Thread safety: all members are atomic; arm from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace spw {

class FaultInjector {
 public:
  void fail_allocation(int32_t n_before = 0) { alloc_countdown_.store(n_before); }
  void device_lost_at_next_submit() { device_lost_.store(true); }
  void fence_timeout_at_next_wait() { fence_timeout_.store(true); }
  void disarm();
  bool armed() const;

  bool take_allocation_failure();
  bool take_device_lost() { return device_lost_.exchange(false); }
  bool take_fence_timeout() { return fence_timeout_.exchange(false); }

 private:
  std::atomic<int32_t> alloc_countdown_{-1};  // -1: disarmed
  std::atomic<bool> device_lost_{false};
  std::atomic<bool> fence_timeout_{false};
};

}  // namespace spw
