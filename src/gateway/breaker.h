// CircuitBreaker: takes a failing device out of service and lets it back in
// only after real generations on it pass again. One per device (the GPU path
// and the hybrid path on the same device share one).
//
// Contract (states and transitions):
//   closed     the device takes work. record(outcome) counts real request
//              outcomes: a success (OK) resets the run of consecutive faults;
//              a device fault (core/failure.h: classify(status).device_fault
//              -- device lost, device out of memory against the plan, a
//              timeout, a failed health check) extends it; every other
//              failure (a client's error, a full queue, the KV pool) and every
//              cancellation is ignored: neither a failure nor a success.
//              record_health_failure() is a device fault too. It trips (->
//              open) on whichever comes first:
//                - a device loss (classify(status).code "device_lost"): at
//                  once, whatever the counts (a lost device stays lost until
//                  re-initialised; waiting for more would send the next
//                  requests to it only to fail over one by one),
//                - `consecutive_failures` device faults in a row, or
//                - device faults >= `failure_share` of the outcomes (faults
//                  and successes) recorded in the last `window_s` seconds,
//                  once there are at least `min_requests` of them.
//   open       the device takes no client work (the gateway marks its paths
//              unusable, so admission redirects). Outcomes still arriving
//              (requests that were already running) are counted but change
//              nothing. After the trip's cooldown it is half-open; that
//              change is made by the clock, observed by the next call.
//   half-open  still no client work; the breaker wants `probes` probe runs
//              (the gateway's prober runs them one at a time on the device:
//              gateway.h). A probe that passes counts; when `probes` have
//              passed -> closed (window and consecutive count start empty).
//              A probe that fails, or any device fault recorded meanwhile
//              (a request that was already queued, a health failure) -> open
//              again, as a new trip with the grown cooldown. Successes of
//              real requests do not close it: only probes do.
// Cooldown: the n-th trip of a streak waits base_cooldown_s * 2^(n-1),
// capped at max_cooldown_s (defaults 5, 10, 20, ... 300 s). The streak goes
// back to zero once the breaker has stayed closed for streak_reset_s (default
// = max_cooldown_s): a device that served for as long as the longest cooldown
// is no longer flapping, and its next trip starts short again.
//
// Defaults, and why they differ from the usual ones. A home server sees a few
// requests a minute, not thousands, and a GPU fault is rarely a blip (a lost
// device stays lost until re-initialised), so the counts are small and the
// first cooldown short:
//   - resilience4j's CircuitBreaker defaults to failureRateThreshold 50% over
//     minimumNumberOfCalls 100 in a count-based slidingWindowSize of 100,
//     waitDurationInOpenState 60 s and permittedNumberOfCallsInHalfOpenState
//     10. We keep its 50% share but over >= 10 outcomes in a 30 s time window
//     (100 calls can take an hour here, so it would never trip), add a
//     consecutive rule (3) for the common case of a device that fails
//     every request, wait 5 s rather than 60 s (the CPU path is serving, and
//     a probe costs one short generation), and ask for 2 probes rather than
//     10 (each is a real generation on a device that is maybe still sick;
//     their text is also checked against the CPU path, which a call count
//     cannot do).
//   - Envoy's outlier detection ejects after consecutive_5xx 5, for
//     base_ejection_time 30 s multiplied by the number of ejections, capped
//     by max_ejection_time 300 s. We trip after 3 (with one device there is
//     no healthy sibling to compare with, and every fault costs a user a
//     failed request), grow the cooldown by doubling from 5 s rather than
//     linearly from 30 s (a quick first retry, then backing off fast from a
//     device that keeps failing) and keep Envoy's 300 s cap.
//   - LiteLLM's router cools a deployment down after allowed_fails (3)
//     failures within a minute, or when 50% of its requests in the minute
//     failed, for cooldown_time (5 s), flat, and then simply routes to it
//     again. We take its 3 and its 5 s, but the cooldown grows on repeated
//     trips and the device comes back through probes, not through a client's
//     request.
//
// History: the last `history` trips (time, reason text, failure name) are
// kept for status; snapshot() reports state, since when, trip count, those
// trips, the next probe time and the counts.
// Listener: set_listener(f) calls f(new_state) after a transition made by
// record*, never under the breaker's lock, on the thread that recorded
// (the time-driven open -> half-open has no such thread: whoever waits for it
// waits for next_probe_ns).
// All times come from the injected Env (a SimEnv drives it deterministically).
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "serve/scheduler.h"

namespace spw::gateway {

enum class BreakerState { kClosed, kOpen, kHalfOpen };
std::string_view breaker_state_name(BreakerState s);  // "closed", "open", "half_open"

struct BreakerOptions {
  int32_t consecutive_failures = 3;  // device faults in a row that trip it (>= 1)
  double failure_share = 0.5;        // share of device faults in the window that trips it, (0, 1]
  int32_t min_requests = 10;         // outcomes in the window before the share counts (>= 1)
  double window_s = 30;              // the share's time window (> 0)
  double base_cooldown_s = 5;        // first trip's cooldown (> 0)
  double max_cooldown_s = 300;       // cap of the doubling (>= base_cooldown_s)
  int32_t probes = 2;                // probe runs that must pass in half-open (>= 1)
  double streak_reset_s = 0;         // closed this long resets the growth; 0: max_cooldown_s
  int32_t history = 16;              // trips kept for status (>= 1)
  // Outcomes kept in the window at most (the oldest are dropped first), so
  // memory stays bounded whatever the request rate.
  int32_t window_capacity = 4096;
};

// InvalidArgument (kInvalidField naming the option) for an option out of range.
Status validate_breaker_options(const BreakerOptions& options);

struct BreakerTrip {
  int64_t at_ns = 0;       // Env clock
  double cooldown_s = 0;   // this trip's cooldown
  std::string reason;      // "3 consecutive device faults", "probe failed", ...
  std::string failure;     // the failure's name (classify(status).code): "device_lost", "timeout", ...
  std::string detail;      // the failure's message
};

struct BreakerSnapshot {
  std::string name;                 // the device ("vulkan:0")
  BreakerState state = BreakerState::kClosed;
  int64_t now_ns = 0;               // when the snapshot was taken
  int64_t since_ns = 0;             // when it entered `state`
  uint64_t trips = 0;               // since start
  int32_t streak = 0;               // trips of the current streak (the cooldown's exponent + 1)
  double cooldown_s = 0;            // open / half-open: the current trip's; closed: the next trip's
  int64_t next_probe_ns = 0;        // open: when it becomes half-open; else 0
  int32_t probes_needed = 0;
  int32_t probes_passed = 0;        // half-open: passed so far
  uint64_t probes_run = 0;          // since start
  int32_t consecutive_faults = 0;   // closed: the current run
  int32_t window_outcomes = 0;      // closed: outcomes in the window
  int32_t window_faults = 0;
  uint64_t faults = 0, successes = 0, ignored = 0;  // everything recorded, since start
  std::vector<BreakerTrip> recent_trips;             // oldest first, at most options.history

  double since_s() const { return static_cast<double>(now_ns - since_ns) / 1e9; }
  double next_probe_in_s() const;   // open: seconds until half-open (>= 0); else 0
};

// The sentence that tells a client why the device's paths are out of service
// ("gpu_unavailable: circuit breaker open since 2.0 s ago after 3 consecutive
// device faults (device_lost: ...); next probe in 3.0 s"); "" when closed.
std::string breaker_unavailable_reason(const BreakerSnapshot& s);

class CircuitBreaker {
 public:
  // InvalidArgument when the options are out of range (see validate_breaker_options).
  static Result<std::shared_ptr<CircuitBreaker>> create(Env& env, std::string name, BreakerOptions options);
  CircuitBreaker(const CircuitBreaker&) = delete;
  CircuitBreaker& operator=(const CircuitBreaker&) = delete;

  const std::string& name() const { return name_; }
  const BreakerOptions& options() const { return options_; }

  // A real request's outcome: OK = success; a device fault counts; anything
  // else (client errors, cancellations, queue or KV refusals) is ignored.
  void record(const Status& outcome);
  // A failed health check: a device fault (reason kUnhealthy unless the
  // status carries a device-fault reason of its own).
  void record_health_failure(const Status& failure);

  // Half-open probing. probe_episode() is the current half-open episode (0
  // when not half-open, or when every probe has passed); record_probe(e, r)
  // counts a probe run of episode e: OK passes, anything else fails (-> open).
  // A result for an episode that has ended (the breaker tripped again
  // meanwhile) is ignored.
  uint64_t probe_episode();
  void record_probe(uint64_t episode, const Status& result);

  BreakerState state();
  bool closed() { return state() == BreakerState::kClosed; }
  BreakerSnapshot snapshot();

  void set_listener(std::function<void(BreakerState)> listener);

 private:
  CircuitBreaker(Env& env, std::string name, BreakerOptions options);
  struct Outcome {
    int64_t at_ns;
    bool fault;
  };
  // Open -> half-open once the cooldown is over. mu_ held.
  void advance_locked(int64_t now);
  void prune_locked(int64_t now);
  // Closed/half-open -> open, as a new trip of the streak. mu_ held.
  void trip_locked(int64_t now, std::string reason, const Status& failure);
  void close_locked(int64_t now);
  // A device fault at `now`; returns whether the state changed.
  bool fault_locked(int64_t now, const Status& failure);
  double cooldown_for_locked(int32_t streak) const;
  double streak_reset_s() const;
  void notify(BreakerState s);

  Env& env_;
  const std::string name_;
  const BreakerOptions options_;

  mutable std::mutex mu_;
  BreakerState state_ = BreakerState::kClosed;
  int64_t since_ns_ = 0;
  uint64_t trips_ = 0;
  int32_t streak_ = 0;
  double cooldown_s_ = 0;
  int64_t next_probe_ns_ = 0;
  uint64_t episode_ = 0;       // half-open episodes so far
  int32_t probes_passed_ = 0;
  uint64_t probes_run_ = 0;
  int32_t consecutive_ = 0;
  std::deque<Outcome> window_;
  int32_t window_faults_ = 0;
  uint64_t faults_ = 0, successes_ = 0, ignored_ = 0;
  std::deque<BreakerTrip> trips_kept_;
  std::function<void(BreakerState)> listener_;
};

// Forwards a path's real request outcomes to its device's breaker: kDone is a
// success, kFailed its status (classified by the breaker), kCancelled is
// ignored; internal requests (the gateway's own probes) are skipped, since
// the prober reports those itself.
class BreakerObserver final : public serve::RequestObserver {
 public:
  explicit BreakerObserver(std::shared_ptr<CircuitBreaker> breaker) : breaker_(std::move(breaker)) {}
  void on_start(const serve::Ticket&, const std::string&) override {}
  void on_finish(const serve::Ticket& ticket, const serve::RequestEvent& final_event, const std::string& text) override;
  // A request that failed here before its first token and moved on: the
  // device fault counts like any other.
  void on_failover(const serve::Ticket& ticket, const Status& failure) override;

 private:
  std::shared_ptr<CircuitBreaker> breaker_;
};

}  // namespace spw::gateway
