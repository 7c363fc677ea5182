// DeviceControl: what the gateway may do to a GPU device besides running work
// on it: check its health, bring it back after a fault, and arm faults on it
// for drills. One per device, shared by the paths on it (gpu and hybrid), as
// the breaker is.
//
// Contract: built from hooks (the builder binds them to a VulkanBackend; tests
// to fakes); a null hook means the device cannot do that:
//   health_check()  runs hooks.health_check (a tiny real device operation;
//                   VulkanBackend::health_check) and counts it; its Status is
//                   the hook's. Without the hook: OK, not counted.
//   recover()       when hooks.healthy() says the device is unhealthy, calls
//                   hooks.reinitialize() and measures it on the Env's clock
//                   (reinitializations, last_recovery_ms, the last error).
//                   OK when the device is healthy afterwards (or was); else
//                   the re-initialisation's error, or Unavailable
//                   (kUnhealthy) when the device cannot be re-initialised.
//                   Re-initialising drops what the paths uploaded: their
//                   session groups re-open themselves on their next run
//                   (serve/engine_executor.h), which record_reopen() counts.
//   faults()        the device's FaultInjector (null: none).
//   status()        the counts and times above.
// Thread safety: every method may be called from any thread; recover() and
// health_check() are serialised with each other by the hooks' device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/fault_injector.h"
#include "core/env.h"
#include "core/status.h"

namespace spw::gateway {

struct DeviceHooks {
  std::string name;                        // "vulkan:0"
  std::function<Status()> health_check;    // null: no health probe
  std::function<bool()> healthy;           // null: always healthy
  std::function<Status()> reinitialize;    // null: cannot be re-initialised
  FaultInjector* faults = nullptr;         // null: no fault injection
};

struct ReopenStats {
  uint64_t reopens = 0;       // session-group re-opens that succeeded
  uint64_t failed = 0;
  double last_ms = -1;        // -1: none yet
  std::string last_error;     // of the last failed one
};

struct DeviceStatus {
  std::string name;
  bool healthy = true;
  uint64_t reinitializations = 0;         // that succeeded
  uint64_t failed_reinitializations = 0;
  double last_recovery_ms = -1;           // the last re-initialisation's time; -1: none
  std::string last_recovery_error;
  uint64_t health_checks = 0, health_failures = 0;
  double last_health_check_ms = -1;       // how long the last check took; -1: none
  std::string last_health_failure;
  std::map<std::string, ReopenStats> reopens;  // by path name
};

class DeviceControl {
 public:
  DeviceControl(Env& env, DeviceHooks hooks) : env_(env), hooks_(std::move(hooks)) {}

  const std::string& name() const { return hooks_.name; }
  bool has_health_check() const { return static_cast<bool>(hooks_.health_check); }
  FaultInjector* faults() const { return hooks_.faults; }

  Status health_check();
  // Counts a health check that did not answer in time (the prober's timeout).
  void record_health_timeout(const Status& failure);
  Status recover();
  void record_reopen(const std::string& path, const Status& outcome, double ms);
  DeviceStatus status() const;

 private:
  Env& env_;
  const DeviceHooks hooks_;
  mutable std::mutex mu_;
  DeviceStatus stats_;
};

}  // namespace spw::gateway
