#include "gateway/breaker.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/failure.h"

namespace spw::gateway {
namespace {

int64_t to_ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

std::string_view breaker_state_name(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed: return "closed";
    case BreakerState::kOpen: return "open";
    case BreakerState::kHalfOpen: return "half_open";
  }
  return "closed";
}

Status validate_breaker_options(const BreakerOptions& o) {
  if (o.consecutive_failures < 1) return invalid_field("consecutive_failures", "breaker consecutive_failures must be >= 1");
  if (!(o.failure_share > 0 && o.failure_share <= 1)) {
    return invalid_field("failure_share", "breaker failure_share must be in (0, 1]");
  }
  if (o.min_requests < 1) return invalid_field("min_requests", "breaker min_requests must be >= 1");
  if (!(o.window_s > 0)) return invalid_field("window_s", "breaker window_s must be > 0");
  if (!(o.base_cooldown_s > 0)) return invalid_field("base_cooldown_s", "breaker cooldown_s must be > 0");
  if (!(o.max_cooldown_s >= o.base_cooldown_s)) {
    return invalid_field("max_cooldown_s", "breaker max_cooldown_s must be >= its cooldown_s");
  }
  if (o.probes < 1) return invalid_field("probes", "breaker probes must be >= 1");
  if (!(o.streak_reset_s >= 0)) return invalid_field("streak_reset_s", "breaker streak_reset_s must be >= 0");
  if (o.history < 1) return invalid_field("history", "breaker history must be >= 1");
  if (o.window_capacity < o.min_requests) {
    return invalid_field("window_capacity", "breaker window_capacity must be >= min_requests");
  }
  return Status::ok_status();
}

double BreakerSnapshot::next_probe_in_s() const {
  if (state != BreakerState::kOpen) return 0;
  return std::max(0.0, static_cast<double>(next_probe_ns - now_ns) / 1e9);
}

std::string breaker_unavailable_reason(const BreakerSnapshot& s) {
  if (s.state == BreakerState::kClosed) return "";
  std::string why = "gpu_unavailable: circuit breaker ";
  if (s.state == BreakerState::kOpen) {
    why += "open since " + fmt_s(s.since_s()) + " ago";
  } else {
    why += "half-open (probing) since " + fmt_s(s.since_s()) + " ago";
  }
  if (!s.recent_trips.empty()) {
    const BreakerTrip& t = s.recent_trips.back();
    why += " after " + t.reason + " (" + t.failure + ": " + t.detail + ")";
  }
  if (s.state == BreakerState::kOpen) {
    why += "; next probe in " + fmt_s(s.next_probe_in_s());
  } else {
    why += "; " + std::to_string(s.probes_passed) + " of " + std::to_string(s.probes_needed) + " probes passed";
  }
  return why;
}

Result<std::shared_ptr<CircuitBreaker>> CircuitBreaker::create(Env& env, std::string name, BreakerOptions options) {
  SPW_RETURN_IF_ERROR(validate_breaker_options(options));
  return std::shared_ptr<CircuitBreaker>(new CircuitBreaker(env, std::move(name), options));
}

CircuitBreaker::CircuitBreaker(Env& env, std::string name, BreakerOptions options)
    : env_(env), name_(std::move(name)), options_(options), since_ns_(env.now_ns()) {}

double CircuitBreaker::streak_reset_s() const {
  return options_.streak_reset_s > 0 ? options_.streak_reset_s : options_.max_cooldown_s;
}

double CircuitBreaker::cooldown_for_locked(int32_t streak) const {
  // base * 2^(streak - 1), capped; computed by doubling so a long streak
  // never overflows.
  double c = options_.base_cooldown_s;
  for (int32_t i = 1; i < streak && c < options_.max_cooldown_s; ++i) c *= 2;
  return std::min(c, options_.max_cooldown_s);
}

void CircuitBreaker::advance_locked(int64_t now) {
  if (state_ == BreakerState::kOpen && now >= next_probe_ns_) {
    state_ = BreakerState::kHalfOpen;
    since_ns_ = next_probe_ns_;  // when it became due, whoever noticed
    ++episode_;
    probes_passed_ = 0;
  }
}

void CircuitBreaker::prune_locked(int64_t now) {
  const int64_t horizon = now - to_ns(options_.window_s);
  while (!window_.empty() && (window_.front().at_ns <= horizon ||
                              static_cast<int32_t>(window_.size()) > options_.window_capacity)) {
    if (window_.front().fault) --window_faults_;
    window_.pop_front();
  }
}

void CircuitBreaker::trip_locked(int64_t now, std::string reason, const Status& failure) {
  // A device that stayed closed for the reset time starts a new streak.
  if (state_ == BreakerState::kClosed && now - since_ns_ >= to_ns(streak_reset_s())) streak_ = 0;
  ++streak_;
  ++trips_;
  cooldown_s_ = cooldown_for_locked(streak_);
  state_ = BreakerState::kOpen;
  since_ns_ = now;
  next_probe_ns_ = now + to_ns(cooldown_s_);
  probes_passed_ = 0;
  consecutive_ = 0;
  window_.clear();
  window_faults_ = 0;
  BreakerTrip t;
  t.at_ns = now;
  t.cooldown_s = cooldown_s_;
  t.reason = std::move(reason);
  t.failure = std::string(classify(failure).code);
  t.detail = failure.message();
  trips_kept_.push_back(std::move(t));
  while (static_cast<int32_t>(trips_kept_.size()) > options_.history) trips_kept_.pop_front();
}

void CircuitBreaker::close_locked(int64_t now) {
  state_ = BreakerState::kClosed;
  since_ns_ = now;
  next_probe_ns_ = 0;
  consecutive_ = 0;
  window_.clear();
  window_faults_ = 0;
}

bool CircuitBreaker::fault_locked(int64_t now, const Status& failure) {
  ++faults_;
  switch (state_) {
    case BreakerState::kOpen:
      return false;  // already out of service: counted only
    case BreakerState::kHalfOpen:
      trip_locked(now, "a device fault while half-open", failure);
      return true;
    case BreakerState::kClosed:
      break;
  }
  ++consecutive_;
  window_.push_back({now, true});
  ++window_faults_;
  prune_locked(now);
  // A lost device stays lost until it is re-initialised: counting to
  // consecutive_failures would only send the next requests to it to fail
  // over one by one. Trip at once; the probes bring it back.
  if (classify(failure).code == "device_lost") {
    trip_locked(now, "device lost", failure);
    return true;
  }
  if (consecutive_ >= options_.consecutive_failures) {
    trip_locked(now, std::to_string(consecutive_) + " consecutive device faults", failure);
    return true;
  }
  const auto n = static_cast<int32_t>(window_.size());
  if (n >= options_.min_requests &&
      static_cast<double>(window_faults_) >= options_.failure_share * static_cast<double>(n)) {
    trip_locked(now,
                std::to_string(window_faults_) + " device faults in " + std::to_string(n) + " outcomes within " +
                    fmt_s(options_.window_s),
                failure);
    return true;
  }
  return false;
}

void CircuitBreaker::record(const Status& outcome) {
  const int64_t now = env_.now_ns();
  bool changed = false;
  BreakerState now_state;
  {
    std::lock_guard<std::mutex> lk(mu_);
    advance_locked(now);
    if (outcome.ok()) {
      ++successes_;
      if (state_ == BreakerState::kClosed) {
        consecutive_ = 0;
        window_.push_back({now, false});
        prune_locked(now);
      }
    } else if (classify(outcome).device_fault) {
      changed = fault_locked(now, outcome);
    } else {
      ++ignored_;
    }
    now_state = state_;
  }
  if (changed) notify(now_state);
}

void CircuitBreaker::record_health_failure(const Status& failure) {
  Status st = failure;
  if (st.ok() || !classify(st).device_fault) {
    st = Status(StatusCode::kUnavailable, failure.ok() ? "health check failed" : failure.message(),
                FailureReason::kUnhealthy);
  }
  const int64_t now = env_.now_ns();
  bool changed = false;
  BreakerState now_state;
  {
    std::lock_guard<std::mutex> lk(mu_);
    advance_locked(now);
    changed = fault_locked(now, st);
    now_state = state_;
  }
  if (changed) notify(now_state);
}

uint64_t CircuitBreaker::probe_episode() {
  std::lock_guard<std::mutex> lk(mu_);
  advance_locked(env_.now_ns());
  return state_ == BreakerState::kHalfOpen ? episode_ : 0;
}

void CircuitBreaker::record_probe(uint64_t episode, const Status& result) {
  const int64_t now = env_.now_ns();
  bool changed = false;
  BreakerState now_state;
  {
    std::lock_guard<std::mutex> lk(mu_);
    advance_locked(now);
    if (state_ != BreakerState::kHalfOpen || episode != episode_) return;  // stale: that episode ended
    ++probes_run_;
    if (result.ok()) {
      if (++probes_passed_ >= options_.probes) {
        close_locked(now);
        changed = true;
      }
    } else {
      ++faults_;
      trip_locked(now, "probe " + std::to_string(probes_passed_ + 1) + " of " + std::to_string(options_.probes) +
                           " failed",
                  result);
      changed = true;
    }
    now_state = state_;
  }
  if (changed) notify(now_state);
}

BreakerState CircuitBreaker::state() {
  std::lock_guard<std::mutex> lk(mu_);
  advance_locked(env_.now_ns());
  return state_;
}

BreakerSnapshot CircuitBreaker::snapshot() {
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  advance_locked(now);
  if (state_ == BreakerState::kClosed) prune_locked(now);
  BreakerSnapshot s;
  s.name = name_;
  s.state = state_;
  s.now_ns = now;
  s.since_ns = since_ns_;
  s.trips = trips_;
  s.streak = streak_;
  if (state_ == BreakerState::kClosed) {
    const bool reset = now - since_ns_ >= to_ns(streak_reset_s());
    s.cooldown_s = cooldown_for_locked(reset ? 1 : streak_ + 1);
  } else {
    s.cooldown_s = cooldown_s_;
  }
  s.next_probe_ns = state_ == BreakerState::kOpen ? next_probe_ns_ : 0;
  s.probes_needed = options_.probes;
  s.probes_passed = state_ == BreakerState::kHalfOpen ? probes_passed_ : 0;
  s.probes_run = probes_run_;
  s.consecutive_faults = consecutive_;
  s.window_outcomes = static_cast<int32_t>(window_.size());
  s.window_faults = window_faults_;
  s.faults = faults_;
  s.successes = successes_;
  s.ignored = ignored_;
  s.recent_trips.assign(trips_kept_.begin(), trips_kept_.end());
  return s;
}

void CircuitBreaker::set_listener(std::function<void(BreakerState)> listener) {
  std::lock_guard<std::mutex> lk(mu_);
  listener_ = std::move(listener);
}

void CircuitBreaker::notify(BreakerState s) {
  std::function<void(BreakerState)> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f = listener_;
  }
  if (f) f(s);
}

void BreakerObserver::on_finish(const serve::Ticket& ticket, const serve::RequestEvent& final_event,
                                const std::string& /*text*/) {
  if (ticket.internal()) return;
  switch (final_event.state) {
    case serve::RequestState::kDone: breaker_->record(Status::ok_status()); break;
    case serve::RequestState::kFailed:
      // A resumable error is what the client sees; the device fault behind
      // it is what the breaker counts.
      breaker_->record(final_event.cause.ok() ? final_event.status : final_event.cause);
      break;
    default: break;  // cancelled (or not terminal): says nothing about the device
  }
}

void BreakerObserver::on_failover(const serve::Ticket& ticket, const Status& failure) {
  if (!ticket.internal()) breaker_->record(failure);
}

}  // namespace spw::gateway
