// Test helper shared by the tests that run on a Vulkan device when one exists.
#pragma once

#include <string>

#include "backend/vulkan/vulkan_backend.h"

namespace spw {

// Vulkan forms need a device (lavapipe in CI): false with the reason (for
// GTEST_SKIP) otherwise.
inline bool vulkan_available(std::string* why) {
  auto devices = list_vulkan_devices();
  if (!devices.ok()) {
    *why = devices.status().to_string();
    return false;
  }
  if (devices->empty()) {
    *why = "no Vulkan device";
    return false;
  }
  return true;
}

}  // namespace spw
