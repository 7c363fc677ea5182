// FaultInjector: explicit, compiled-in injection of the Vulkan faults that
// lavapipe cannot produce on demand, at the points where real ones happen,
// and of a slowed CPU (CpuBackend counts a kSlow event per forward pass: the
// cores taken by another workload; the other kinds never fire there).
//
// Contract: nothing happens until a test or an operator (the admin API,
// `spillway serve --admin-token`) arms a fault. arm(spec) adds one armed
// fault of a kind, with its own counter of the events of that kind:
//   kAllocFail    event = a device-memory allocation (DeviceAllocator); a
//                 firing one fails as if vkAllocateMemory returned
//                 VK_ERROR_OUT_OF_DEVICE_MEMORY -> ResourceExhausted
//                 (kDeviceOutOfMemory), context unhealthy;
//   kDeviceLost   event = a queue submission; a firing one is not made and
//                 reports VK_ERROR_DEVICE_LOST -> DeviceLost, context unhealthy;
//   kFenceTimeout event = a fence wait (after a real submission); it waits for
//                 the real work (so no resource is left in use) and then
//                 reports VK_TIMEOUT -> DeadlineExceeded (kTimeout), context
//                 unhealthy;
//   kSlow         event = a queue submission; a firing one runs for real and
//                 then sleeps (factor - 1) x its measured submit-to-fence time,
//                 so the submission's wall time is `factor` times the real one;
//   kHealthFail   event = a health check (VulkanBackend::health_check); a
//                 firing one fails the check (kUnhealthy) without touching the
//                 device, which stays healthy.
// Counting: the first `after` events of its kind (from arming) pass; the next
// `count` fire; then the fault is spent (still listed, with what fired, until
// disarm()). count 0 fires on every event after `after` until disarmed (a
// device that stays dead, a GPU that stays slow). Events are counted only
// where they really happen: an unhealthy context makes no submission, so a
// device_lost with count 3 fires once per re-initialisation of the device.
// Several armed faults of one kind each count every event; the event fires
// when any of them does (kSlow: the largest factor among the firing ones).
// arm() checks the spec (after >= 0, count >= 0, factor > 1 for kSlow and
// 1 otherwise) and returns InvalidArgument (kInvalidField naming "after",
// "count" or "factor") otherwise. disarm() drops every fault, spent or not.
// The shorthands fail_allocation / device_lost_at_next_submit /
// fence_timeout_at_next_wait arm one fault that fires once. The take_*()
// calls are the hooks the Vulkan code calls at those points.
// Thread safety: every member may be called from any thread (internal mutex;
// the hooks take no lock while nothing is armed).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw {

enum class FaultKind : uint8_t { kAllocFail, kDeviceLost, kFenceTimeout, kSlow, kHealthFail };
inline constexpr int kNumFaultKinds = 5;
std::string_view fault_kind_name(FaultKind k);  // "alloc_fail", "device_lost", "fence_timeout", "slow", "health_fail"
std::optional<FaultKind> fault_kind_from_name(std::string_view name);

struct FaultSpec {
  FaultKind kind = FaultKind::kDeviceLost;
  int64_t after = 0;    // events of its kind that pass first
  int64_t count = 1;    // events that then fire; 0: every one until disarmed
  double factor = 1.0;  // kSlow: wall-time multiplier of a submission (> 1)
};

struct ArmedFault {
  uint64_t id = 0;  // unique per injector, from 1
  FaultSpec spec;
  int64_t seen = 0;   // events of its kind since it was armed
  int64_t fired = 0;  // of which fired
  bool spent() const { return spec.count > 0 && fired >= spec.count; }
};

class FaultInjector {
 public:
  Result<ArmedFault> arm(const FaultSpec& spec);
  // Every fault armed since the last disarm(), in arming order (at most the
  // last kMaxKept spent ones are kept).
  std::vector<ArmedFault> list() const;
  void disarm();
  bool armed() const;  // some fault not spent
  // How many times disarm() has run. A stretch a slow fault started goes on
  // while this is unchanged (its own fault may be spent by then: one with a
  // count), and ends as soon as an operator disarms.
  uint64_t disarms() const { return disarms_.load(std::memory_order_acquire); }

  void fail_allocation(int32_t n_before = 0) { (void)arm({FaultKind::kAllocFail, n_before, 1, 1.0}); }
  void device_lost_at_next_submit() { (void)arm({FaultKind::kDeviceLost, 0, 1, 1.0}); }
  void fence_timeout_at_next_wait() { (void)arm({FaultKind::kFenceTimeout, 0, 1, 1.0}); }

  // Hooks: each counts one event of its kind and says whether it fails.
  bool take_allocation_failure() { return take(FaultKind::kAllocFail) > 0; }
  bool take_device_lost() { return take(FaultKind::kDeviceLost) > 0; }
  bool take_fence_timeout() { return take(FaultKind::kFenceTimeout) > 0; }
  bool take_health_failure() { return take(FaultKind::kHealthFail) > 0; }
  // A submission: the wall-time factor to apply (1: none).
  double take_slow_factor() {
    const double f = take(FaultKind::kSlow);
    return f > 1 ? f : 1.0;
  }

  static constexpr size_t kMaxKept = 64;

 private:
  // 0 when no fault fires on this event; else the largest firing factor (1
  // for kinds without one).
  double take(FaultKind kind);

  mutable std::mutex mu_;
  std::vector<ArmedFault> faults_;
  uint64_t next_id_ = 1;
  std::atomic<int32_t> live_{0};  // faults not spent: the hooks' lock-free fast path
  std::atomic<uint64_t> disarms_{0};
};

}  // namespace spw
