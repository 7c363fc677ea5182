#include "backend/vulkan/fault_injector.h"

namespace spw {

void FaultInjector::disarm() {
  alloc_countdown_.store(-1);
  device_lost_.store(false);
  fence_timeout_.store(false);
}

bool FaultInjector::armed() const {
  return alloc_countdown_.load() >= 0 || device_lost_.load() || fence_timeout_.load();
}

bool FaultInjector::take_allocation_failure() {
  int32_t c = alloc_countdown_.load();
  while (c >= 0) {
    // Count down; the call that sees 0 fires and disarms (-1).
    if (alloc_countdown_.compare_exchange_weak(c, c - 1)) return c == 0;
  }
  return false;
}

}  // namespace spw
