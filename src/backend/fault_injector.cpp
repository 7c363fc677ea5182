#include "backend/fault_injector.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace spw {

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::kAllocFail: return "alloc_fail";
    case FaultKind::kDeviceLost: return "device_lost";
    case FaultKind::kFenceTimeout: return "fence_timeout";
    case FaultKind::kSlow: return "slow";
    case FaultKind::kHealthFail: return "health_fail";
  }
  return "unknown";
}

std::optional<FaultKind> fault_kind_from_name(std::string_view name) {
  for (int i = 0; i < kNumFaultKinds; ++i) {
    const auto k = static_cast<FaultKind>(i);
    if (fault_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

Result<ArmedFault> FaultInjector::arm(const FaultSpec& spec) {
  if (spec.after < 0) return invalid_field("after", "'after' must be >= 0, got " + std::to_string(spec.after));
  if (spec.count < 0) return invalid_field("count", "'count' must be >= 0 (0: until disarmed), got " + std::to_string(spec.count));
  if (spec.kind == FaultKind::kSlow) {
    if (!std::isfinite(spec.factor) || spec.factor <= 1 || spec.factor > 1000) {
      return invalid_field("factor", "'factor' of a slow fault must be in (1, 1000], got " + std::to_string(spec.factor));
    }
  } else if (spec.factor != 1.0) {
    return invalid_field("factor", "'factor' applies to slow faults only");
  }
  std::lock_guard<std::mutex> lk(mu_);
  ArmedFault f;
  f.id = next_id_++;
  f.spec = spec;
  faults_.push_back(f);
  live_.fetch_add(1);
  // Bound the list: drop the oldest spent faults beyond kMaxKept.
  size_t spent = 0;
  for (const ArmedFault& a : faults_) spent += a.spent() ? 1 : 0;
  for (auto it = faults_.begin(); spent > kMaxKept && it != faults_.end();) {
    if (it->spent()) {
      it = faults_.erase(it);
      --spent;
    } else {
      ++it;
    }
  }
  return f;
}

std::vector<ArmedFault> FaultInjector::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  return faults_;
}

void FaultInjector::disarm() {
  std::lock_guard<std::mutex> lk(mu_);
  faults_.clear();
  live_.store(0);
  disarms_.fetch_add(1, std::memory_order_acq_rel);
}

bool FaultInjector::armed() const { return live_.load() > 0; }

double FaultInjector::take(FaultKind kind) {
  if (live_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard<std::mutex> lk(mu_);
  double fire = 0;
  for (ArmedFault& f : faults_) {
    if (f.spec.kind != kind || f.spent()) continue;
    ++f.seen;
    if (f.seen <= f.spec.after) continue;
    ++f.fired;
    fire = std::max(fire, f.spec.factor);
    if (f.spent()) live_.fetch_sub(1);
  }
  return fire;
}

}  // namespace spw
