// Reading<T>: one figure obtained from the system, or the reason it could not be.
//
// Contract: a Reading is either known (a value plus the source it came from,
// e.g. "/proc/meminfo", "nvml", "cgroup:/sys/fs/cgroup/memory.max") or unknown
// (a reason naming the file or call that failed and why). A probe never fills a
// Reading with an estimate or a default: admission control must be able to tell
// "0 bytes free" from "could not read". Accessing value() of an unknown Reading
// is a programming error (asserts in debug builds); use value_or() when a
// fallback is acceptable to the caller.
// Thread safety: immutable values; safe to copy across threads.
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <utility>

namespace spw::device {

template <typename T>
class Reading {
 public:
  // An unknown reading with an empty reason means "never probed"; probes always
  // give a reason.
  Reading() = default;

  static Reading of(T value, std::string source) {
    Reading r;
    r.known_ = true;
    r.value_ = std::move(value);
    r.text_ = std::move(source);
    return r;
  }
  static Reading unknown(std::string reason) {
    Reading r;
    r.text_ = std::move(reason);
    return r;
  }

  bool known() const { return known_; }
  const T& value() const {
    assert(known_ && "value() of an unknown Reading");
    return value_;
  }
  T value_or(T fallback) const { return known_ ? value_ : std::move(fallback); }
  // Where a known value came from; empty when unknown.
  const std::string& source() const {
    static const std::string kEmpty;
    return known_ ? text_ : kEmpty;
  }
  // Why the value is unknown; empty when known.
  const std::string& reason() const {
    static const std::string kEmpty;
    return known_ ? kEmpty : text_;
  }

 private:
  bool known_ = false;
  T value_{};
  std::string text_;  // source when known, reason when not
};

// A memory limit: a byte count or "no limit" (cgroup "max").
struct ByteLimit {
  bool unlimited = false;
  uint64_t bytes = 0;  // meaningful only when !unlimited

  static ByteLimit none() { return {true, 0}; }
  static ByteLimit of(uint64_t b) { return {false, b}; }
  bool operator==(const ByteLimit&) const = default;
};

// Health of one accelerator as far as its probe can tell.
enum class DeviceHealth {
  kUnknown,     // the health read itself failed or is not supported
  kHealthy,     // the health read succeeded (temperature and memory readable)
  kDeviceLost,  // the driver reports the device as lost or needing a reset
};

inline const char* device_health_name(DeviceHealth h) {
  switch (h) {
    case DeviceHealth::kHealthy: return "healthy";
    case DeviceHealth::kDeviceLost: return "device_lost";
    case DeviceHealth::kUnknown: break;
  }
  return "unknown";
}

}  // namespace spw::device
