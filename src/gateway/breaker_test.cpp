// CircuitBreaker under a simulated clock: every transition of the contract in
// breaker.h, at its exact instant.
#include "gateway/breaker.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/sim_env.h"

namespace spw::gateway {
namespace {

int64_t ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

Status device_lost() { return Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost); }
Status device_oom() {
  return Status(StatusCode::kResourceExhausted, "vkAllocateMemory refused", FailureReason::kDeviceOutOfMemory);
}
Status fence_timeout() { return Status(StatusCode::kDeadlineExceeded, "fence wait", FailureReason::kTimeout); }
Status ok() { return Status::ok_status(); }

std::shared_ptr<CircuitBreaker> make(SimEnv& env, BreakerOptions o = {}) {
  auto b = CircuitBreaker::create(env, "vulkan:0", o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? *b : nullptr;
}

// Half-open now: passes every probe it asks for.
void pass_probes(CircuitBreaker& b) {
  const uint64_t e = b.probe_episode();
  ASSERT_NE(e, 0u);
  for (int i = 0; i < b.options().probes; ++i) b.record_probe(e, ok());
}

TEST(BreakerTest, DefaultsAreTheDocumentedOnes) {
  const BreakerOptions o;
  EXPECT_EQ(o.consecutive_failures, 3);
  EXPECT_DOUBLE_EQ(o.failure_share, 0.5);
  EXPECT_EQ(o.min_requests, 10);
  EXPECT_DOUBLE_EQ(o.window_s, 30);
  EXPECT_DOUBLE_EQ(o.base_cooldown_s, 5);
  EXPECT_DOUBLE_EQ(o.max_cooldown_s, 300);
  EXPECT_EQ(o.probes, 2);
  EXPECT_TRUE(validate_breaker_options(o).ok());
}

TEST(BreakerTest, OptionsOutOfRangeAreRefusedNamingTheField) {
  SimEnv env;
  auto bad = [&](auto edit, const char* field) {
    BreakerOptions o;
    edit(o);
    auto b = CircuitBreaker::create(env, "vulkan:0", o);
    ASSERT_FALSE(b.ok()) << field;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(b.status().field(), field);
  };
  bad([](BreakerOptions& o) { o.consecutive_failures = 0; }, "consecutive_failures");
  bad([](BreakerOptions& o) { o.failure_share = 0; }, "failure_share");
  bad([](BreakerOptions& o) { o.failure_share = 1.5; }, "failure_share");
  bad([](BreakerOptions& o) { o.min_requests = 0; }, "min_requests");
  bad([](BreakerOptions& o) { o.window_s = 0; }, "window_s");
  bad([](BreakerOptions& o) { o.base_cooldown_s = 0; }, "base_cooldown_s");
  bad([](BreakerOptions& o) { o.max_cooldown_s = 4; }, "max_cooldown_s");
  bad([](BreakerOptions& o) { o.probes = 0; }, "probes");
}

TEST(BreakerTest, ThreeConsecutiveDeviceFaultsTripItAndASuccessResetsTheRun) {
  SimEnv env;
  auto b = make(env);
  b->record(fence_timeout());
  b->record(fence_timeout());
  b->record(ok());  // the run starts again
  b->record(device_oom());
  b->record(fence_timeout());
  EXPECT_EQ(b->state(), BreakerState::kClosed);
  EXPECT_EQ(b->snapshot().consecutive_faults, 2);
  const int64_t t_trip = env.now_ns() + ns(1);
  env.advance(ns(1));
  b->record(fence_timeout());
  const BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_EQ(s.since_ns, t_trip);
  EXPECT_EQ(s.trips, 1u);
  EXPECT_EQ(s.streak, 1);
  EXPECT_DOUBLE_EQ(s.cooldown_s, 5);
  EXPECT_EQ(s.next_probe_ns, t_trip + ns(5));
  EXPECT_DOUBLE_EQ(s.next_probe_in_s(), 5);
  EXPECT_EQ(s.faults, 5u);
  EXPECT_EQ(s.successes, 1u);
  ASSERT_EQ(s.recent_trips.size(), 1u);
  EXPECT_EQ(s.recent_trips[0].reason, "3 consecutive device faults");
  EXPECT_EQ(s.recent_trips[0].failure, "timeout");
  EXPECT_EQ(s.recent_trips[0].detail, "fence wait");
  EXPECT_EQ(s.recent_trips[0].at_ns, t_trip);
  const std::string why = breaker_unavailable_reason(s);
  EXPECT_EQ(why,
            "gpu_unavailable: circuit breaker open since 0.0 s ago after 3 consecutive device faults "
            "(timeout: fence wait); next probe in 5.0 s");
  env.advance(ns(2));
  EXPECT_NE(breaker_unavailable_reason(b->snapshot()).find("open since 2.0 s ago"), std::string::npos);
  EXPECT_NE(breaker_unavailable_reason(b->snapshot()).find("next probe in 3.0 s"), std::string::npos);
}

// Alternating faults never make 3 in a row; half of 10 outcomes in the
// window does. Outcomes older than the window no longer count.
TEST(BreakerTest, AShareOfDeviceFaultsWithinTheWindowTripsIt) {
  SimEnv env;
  auto b = make(env);
  // 4 faults in 8 outcomes, then 31 s pass: they leave the window.
  for (int i = 0; i < 4; ++i) {
    b->record(fence_timeout());
    b->record(ok());
  }
  env.advance(ns(31));
  EXPECT_EQ(b->snapshot().window_outcomes, 0);
  // Now F S F S F S F S S: 4 of 9, below the minimum of 10 outcomes.
  for (int i = 0; i < 4; ++i) {
    b->record(fence_timeout());
    env.advance(ns(1));
    b->record(ok());
    env.advance(ns(1));
  }
  b->record(ok());
  BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kClosed);
  EXPECT_EQ(s.window_outcomes, 9);
  EXPECT_EQ(s.window_faults, 4);
  // The 10th outcome, a fault: 5 of 10 = 0.5 >= failure_share.
  b->record(fence_timeout());
  s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  ASSERT_EQ(s.recent_trips.size(), 1u);
  EXPECT_EQ(s.recent_trips[0].reason, "5 device faults in 10 outcomes within 30.0 s");
}

TEST(BreakerTest, ClientErrorsAndCancellationsAreIgnoredNeitherFailureNorSuccess) {
  SimEnv env;
  auto b = make(env);
  b->record(fence_timeout());
  b->record(fence_timeout());
  const std::vector<Status> not_device = {
      invalid_field("max_tokens", "max_tokens: must be >= 1"),
      Status(StatusCode::kInvalidArgument, "prompt too long", FailureReason::kContextFull, "prompt"),
      Status(StatusCode::kResourceExhausted, "queue full", FailureReason::kQueueFull),
      Status(StatusCode::kResourceExhausted, "no KV blocks", FailureReason::kKvExhausted),
      Status(StatusCode::kCancelled, "client went away", FailureReason::kCancelled),
      Status(StatusCode::kUnavailable, "shutting down", FailureReason::kShuttingDown),
      Status::invalid_argument("bad sampler"),
  };
  for (int round = 0; round < 3; ++round)
    for (const Status& st : not_device) b->record(st);
  BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kClosed);
  EXPECT_EQ(s.ignored, 3 * not_device.size());
  EXPECT_EQ(s.consecutive_faults, 2);  // not reset either
  EXPECT_EQ(s.window_outcomes, 2);
  b->record(fence_timeout());
  EXPECT_EQ(b->state(), BreakerState::kOpen);
}

// A lost device stays lost until re-initialised: one loss trips it, whatever
// the counts say, where the same number of other device faults does not.
TEST(BreakerTest, ADeviceLossTripsItAtOnce) {
  SimEnv env;
  auto b = make(env);
  b->record(ok());
  b->record(ok());
  b->record(device_lost());
  BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_EQ(s.faults, 1u);
  ASSERT_EQ(s.recent_trips.size(), 1u);
  EXPECT_EQ(s.recent_trips[0].reason, "device lost");
  EXPECT_EQ(s.recent_trips[0].failure, "device_lost");
  EXPECT_EQ(breaker_unavailable_reason(s),
            "gpu_unavailable: circuit breaker open since 0.0 s ago after device lost "
            "(device_lost: injected device loss); next probe in 5.0 s");
  // The same from the health prober.
  auto h = make(env);
  h->record_health_failure(Status(StatusCode::kDeviceLost, "gone", FailureReason::kDeviceLost));
  EXPECT_EQ(h->state(), BreakerState::kOpen);
  // Any other single device fault is counted, not tripped on.
  auto c = make(env);
  c->record(device_oom());
  c->record(fence_timeout());
  EXPECT_EQ(c->state(), BreakerState::kClosed);
}

TEST(BreakerTest, AFailedHealthCheckIsADeviceFault) {
  SimEnv env;
  auto b = make(env);
  b->record_health_failure(Status::unavailable("vkQueueSubmit answered VK_ERROR_DEVICE_LOST"));
  b->record_health_failure(Status::ok_status());
  EXPECT_EQ(b->state(), BreakerState::kClosed);
  b->record_health_failure(Status(StatusCode::kDeviceLost, "gone", FailureReason::kDeviceLost));
  const BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_EQ(s.recent_trips.back().failure, "device_lost");
  // A health failure with no device reason of its own is "unhealthy".
  auto c = make(env);
  for (int i = 0; i < 3; ++i) c->record_health_failure(Status::unavailable("probe answered wrongly"));
  EXPECT_EQ(c->snapshot().recent_trips.back().failure, "unhealthy");
}

TEST(BreakerTest, OpenBecomesHalfOpenExactlyAfterTheCooldownAndIgnoresOutcomesMeanwhile) {
  SimEnv env;
  auto b = make(env);
  for (int i = 0; i < 3; ++i) b->record(device_lost());
  const int64_t t_trip = env.now_ns();
  // Requests that were already running still report: counted, no change.
  b->record(ok());
  b->record(device_lost());
  EXPECT_EQ(b->state(), BreakerState::kOpen);
  EXPECT_EQ(b->probe_episode(), 0u);
  env.advance(ns(5) - 1);
  EXPECT_EQ(b->state(), BreakerState::kOpen);
  env.advance(1);
  const BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kHalfOpen);
  EXPECT_EQ(s.since_ns, t_trip + ns(5));
  EXPECT_EQ(s.probes_needed, 2);
  EXPECT_EQ(s.probes_passed, 0);
  EXPECT_NE(breaker_unavailable_reason(s).find("half-open (probing)"), std::string::npos);
  EXPECT_NE(breaker_unavailable_reason(s).find("0 of 2 probes passed"), std::string::npos);
  // Real successes do not close it: only probes do.
  for (int i = 0; i < 5; ++i) b->record(ok());
  EXPECT_EQ(b->state(), BreakerState::kHalfOpen);
}

TEST(BreakerTest, HalfOpenClosesWhenEveryProbePasses) {
  SimEnv env;
  auto b = make(env);
  for (int i = 0; i < 3; ++i) b->record(device_lost());
  env.advance(ns(5));
  const uint64_t e = b->probe_episode();
  ASSERT_NE(e, 0u);
  b->record_probe(e, ok());
  EXPECT_EQ(b->state(), BreakerState::kHalfOpen);
  EXPECT_EQ(b->snapshot().probes_passed, 1);
  env.advance(ns(0.1));
  b->record_probe(e, ok());
  const BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kClosed);
  EXPECT_EQ(s.since_ns, env.now_ns());
  EXPECT_EQ(s.probes_run, 2u);
  EXPECT_EQ(s.consecutive_faults, 0);
  EXPECT_EQ(s.window_outcomes, 0);
  EXPECT_EQ(b->probe_episode(), 0u);
  EXPECT_EQ(breaker_unavailable_reason(s), "");
  // A late result of that episode changes nothing.
  b->record_probe(e, device_lost());
  EXPECT_EQ(b->state(), BreakerState::kClosed);
}

TEST(BreakerTest, AFailedProbeOrAFaultInHalfOpenReopensWithTheGrownCooldown) {
  SimEnv env;
  auto b = make(env);
  for (int i = 0; i < 3; ++i) b->record(device_lost());
  env.advance(ns(5));
  uint64_t e = b->probe_episode();
  b->record_probe(e, ok());
  b->record_probe(e, Status(StatusCode::kInternal, "probe text differs", FailureReason::kUnhealthy));
  BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_EQ(s.trips, 2u);
  EXPECT_EQ(s.streak, 2);
  EXPECT_DOUBLE_EQ(s.cooldown_s, 10);
  EXPECT_EQ(s.next_probe_ns, env.now_ns() + ns(10));
  EXPECT_EQ(s.recent_trips.back().reason, "probe 2 of 2 failed");
  EXPECT_EQ(s.recent_trips.back().failure, "unhealthy");
  // The stale episode's results are ignored.
  b->record_probe(e, ok());
  EXPECT_EQ(b->state(), BreakerState::kOpen);
  // A real device fault while half-open also reopens it, for 20 s.
  env.advance(ns(10));
  ASSERT_EQ(b->state(), BreakerState::kHalfOpen);
  EXPECT_NE(b->probe_episode(), e);
  b->record(fence_timeout());
  s = b->snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_DOUBLE_EQ(s.cooldown_s, 20);
  EXPECT_EQ(s.recent_trips.back().reason, "a device fault while half-open");
  EXPECT_EQ(s.recent_trips.back().failure, "timeout");
}

TEST(BreakerTest, CooldownDoublesOnEachConsecutiveTripUpToTheCap) {
  SimEnv env;
  auto b = make(env);
  for (int i = 0; i < 3; ++i) b->record(device_lost());
  std::vector<double> cooldowns;
  for (int trip = 0; trip < 9; ++trip) {
    const BreakerSnapshot s = b->snapshot();
    ASSERT_EQ(s.state, BreakerState::kOpen);
    cooldowns.push_back(s.cooldown_s);
    env.advance(ns(s.cooldown_s));
    const uint64_t e = b->probe_episode();
    ASSERT_NE(e, 0u);
    b->record_probe(e, device_lost());
  }
  EXPECT_EQ(cooldowns, (std::vector<double>{5, 10, 20, 40, 80, 160, 300, 300, 300}));
  EXPECT_EQ(b->snapshot().trips, 10u);
}

// The growth survives a short closed spell and resets after streak_reset_s
// (default max_cooldown_s = 300 s) closed.
TEST(BreakerTest, GrowthResetsAfterStayingClosedLongEnough) {
  SimEnv env;
  auto b = make(env);
  auto trip = [&] {
    for (int i = 0; i < 3; ++i) b->record(device_lost());
    return b->snapshot().cooldown_s;
  };
  EXPECT_DOUBLE_EQ(trip(), 5);
  env.advance(ns(5));
  pass_probes(*b);
  EXPECT_DOUBLE_EQ(b->snapshot().cooldown_s, 10);  // what a trip now would get
  env.advance(ns(299));
  EXPECT_DOUBLE_EQ(trip(), 10);  // closed 299 s: still the same streak
  env.advance(ns(10));
  pass_probes(*b);
  env.advance(ns(300));
  EXPECT_DOUBLE_EQ(b->snapshot().cooldown_s, 5);
  EXPECT_DOUBLE_EQ(trip(), 5);  // closed 300 s: a new streak
  EXPECT_EQ(b->snapshot().streak, 1);
  EXPECT_EQ(b->snapshot().trips, 3u);
}

TEST(BreakerTest, ListenerHearsEveryTransitionAndHistoryIsBounded) {
  SimEnv env;
  BreakerOptions o;
  o.history = 2;
  o.probes = 1;
  auto b = make(env, o);
  std::vector<BreakerState> heard;
  b->set_listener([&](BreakerState s) { heard.push_back(s); });
  for (int i = 0; i < 3; ++i) b->record(device_lost());  // trip 1
  env.advance(ns(5));
  b->record_probe(b->probe_episode(), device_lost());     // trip 2
  env.advance(ns(10));
  b->record_probe(b->probe_episode(), fence_timeout());   // trip 3
  env.advance(ns(20));
  b->record_probe(b->probe_episode(), ok());              // closed
  EXPECT_EQ(heard, (std::vector<BreakerState>{BreakerState::kOpen, BreakerState::kOpen, BreakerState::kOpen,
                                              BreakerState::kClosed}));
  const BreakerSnapshot s = b->snapshot();
  EXPECT_EQ(s.trips, 3u);
  ASSERT_EQ(s.recent_trips.size(), 2u);
  EXPECT_EQ(s.recent_trips[0].failure, "device_lost");
  EXPECT_DOUBLE_EQ(s.recent_trips[0].cooldown_s, 10);
  EXPECT_EQ(s.recent_trips[1].failure, "timeout");
  EXPECT_DOUBLE_EQ(s.recent_trips[1].cooldown_s, 20);
}

}  // namespace
}  // namespace spw::gateway
