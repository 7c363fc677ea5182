#include "gateway/device_control.h"

namespace spw::gateway {

Status DeviceControl::health_check() {
  if (!hooks_.health_check) return Status();
  const int64_t t0 = env_.now_ns();
  Status st = hooks_.health_check();
  const double ms = static_cast<double>(env_.now_ns() - t0) / 1e6;
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.health_checks;
  stats_.last_health_check_ms = ms;
  if (!st.ok()) {
    ++stats_.health_failures;
    stats_.last_health_failure = st.to_string();
  }
  return st;
}

void DeviceControl::record_health_timeout(const Status& failure) {
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.health_checks;
  ++stats_.health_failures;
  stats_.last_health_failure = failure.to_string();
}

Status DeviceControl::recover() {
  if (!hooks_.healthy || hooks_.healthy()) return Status();
  if (!hooks_.reinitialize) {
    return Status(StatusCode::kUnavailable, hooks_.name + " is unhealthy and cannot be re-initialised",
                  FailureReason::kUnhealthy);
  }
  const int64_t t0 = env_.now_ns();
  Status st = hooks_.reinitialize();
  const double ms = static_cast<double>(env_.now_ns() - t0) / 1e6;
  if (st.ok() && !hooks_.healthy()) {
    st = Status(StatusCode::kUnavailable, hooks_.name + " is still unhealthy after re-initialisation",
                FailureReason::kUnhealthy);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.last_recovery_ms = ms;
  if (st.ok()) {
    ++stats_.reinitializations;
    stats_.last_recovery_error.clear();
  } else {
    ++stats_.failed_reinitializations;
    stats_.last_recovery_error = st.to_string();
  }
  return st;
}

void DeviceControl::record_reopen(const std::string& path, const Status& outcome, double ms) {
  std::lock_guard<std::mutex> lk(mu_);
  ReopenStats& r = stats_.reopens[path];
  r.last_ms = ms;
  if (outcome.ok()) {
    ++r.reopens;
  } else {
    ++r.failed;
    r.last_error = outcome.to_string();
  }
}

DeviceStatus DeviceControl::status() const {
  DeviceStatus s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s = stats_;
  }
  s.name = hooks_.name;
  s.healthy = !hooks_.healthy || hooks_.healthy();
  return s;
}

}  // namespace spw::gateway
