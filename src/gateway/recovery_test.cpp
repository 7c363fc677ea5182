// The gateway's health prober and device recovery under a simulated clock:
// health checks run every health_interval_s on the Env's clock and their
// failures trip the breaker; when the breaker goes half-open the device is
// re-initialised (timed on the Env's clock) before the first probe, and a
// failed re-initialisation fails the episode. Fake executors and fake device
// hooks; no GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/sim_env.h"
#include "engine/engine_test_util.h"
#include "gateway/device_control.h"
#include "gateway/gateway.h"
#include "gguf/gguf.h"
#include "serve/testing/collect.h"
#include "serve/testing/fake_executor.h"
#include "tokenizer/tokenizer.h"

namespace spw::gateway {
namespace {

using namespace std::chrono_literals;
using serve::testing::FakeFaults;

constexpr auto kRealTimeout = 10s;
int64_t ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

std::shared_ptr<const Tokenizer> tiny_tokenizer() { return spw::testing::stories_tokenizer(); }

// A fake device: scripted health results, a healthy flag, and a
// re-initialisation that takes `reinit_s` of simulated time.
struct FakeDevice {
  std::mutex mu;
  std::deque<Status> health;  // next results; empty: OK
  std::atomic<bool> healthy{true};
  std::deque<Status> reinit;  // next results; empty: OK
  std::atomic<int> reinit_calls{0};
  double reinit_s = 0.25;

  DeviceHooks hooks(SimEnv& env) {
    DeviceHooks h;
    h.name = "vulkan:0";
    h.health_check = [this] {
      std::lock_guard<std::mutex> lk(mu);
      if (health.empty()) return Status();
      Status st = health.front();
      health.pop_front();
      return st;
    };
    h.healthy = [this] { return healthy.load(); };
    h.reinitialize = [this, &env] {
      ++reinit_calls;
      // The re-initialisation's own time passes on the simulated clock (the
      // prober holds no lock here, so it may move it itself).
      env.advance(ns(reinit_s));
      Status st;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (!reinit.empty()) {
          st = reinit.front();
          reinit.pop_front();
        }
      }
      if (st.ok()) healthy = true;
      return st;
    };
    return h;
  }
};

// One GPU path (fake executors) with a breaker and a fake device; no CPU
// path, so probes count success alone.
struct Rig {
  SimEnv env;
  FakeDevice dev;
  std::shared_ptr<FakeFaults> faults = std::make_shared<FakeFaults>();
  std::shared_ptr<CircuitBreaker> breaker;
  std::shared_ptr<DeviceControl> device;
  std::mutex log_mu;
  std::vector<std::string> log;
  std::unique_ptr<Gateway> gw;

  explicit Rig(double health_interval_s) {
    BreakerOptions bo;  // 3 in a row, 5 s cooldown, 2 probes
    breaker = *CircuitBreaker::create(env, "vulkan:0", bo);
    device = std::make_shared<DeviceControl>(env, dev.hooks(env));
    serve::SchedulerOptions o;
    o.queue_capacity = 8;
    o.n_ctx = 256;
    o.placement = "vulkan";
    o.path = "gpu";
    o.kv_blocks_total = 64;
    o.kv_block_tokens = 16;
    o.prior_rates = {1000.0, 100.0, 1.0, 0, false};
    o.observer = std::make_shared<BreakerObserver>(breaker);
    auto sched = serve::Scheduler::create(env, tiny_tokenizer(),
                                          serve::testing::make_fake_executors(env, 1, {1000.0, 100.0, 0}, faults), o);
    EXPECT_TRUE(sched.ok()) << sched.status().to_string();
    ExecutionPath p;
    p.name = "gpu";
    p.placement = "vulkan";
    p.model = "stories260K";
    p.scheduler = std::move(*sched);
    p.tokenizer = tiny_tokenizer();
    p.breaker = breaker;
    p.device = device;
    std::vector<ExecutionPath> paths;
    paths.push_back(std::move(p));
    GatewayPolicy gp;
    gp.health_interval_s = health_interval_s;
    gp.health_timeout_s = 2;
    gp.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lk(log_mu);
      log.push_back(line);
    };
    auto g = Gateway::create(env, std::move(paths), {}, gp);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (g.ok()) gw = std::move(*g);
  }
  ~Rig() {
    if (!gw) return;
    std::atomic<bool> done{false};
    std::thread stopper([&] {
      gw->shutdown(0ms);
      done = true;
    });
    while (!done) {
      env.advance_to_next();
      std::this_thread::sleep_for(100us);
    }
    stopper.join();
  }

  // Real-time wait until every gateway thread and worker is parked and the
  // clock's waiters are exactly those (read twice, stable).
  bool settle() {
    const auto until = std::chrono::steady_clock::now() + kRealTimeout;
    while (std::chrono::steady_clock::now() < until) {
      auto look = [&] {
        const Gateway::ProberPark pp = gw->prober_park();
        const Gateway::HealthPark hp = gw->health_park();
        const serve::LoadSnapshot l = gw->paths()[0].scheduler->load();
        const int expected = static_cast<int>(l.running.size()) + (pp.on_clock ? 1 : 0) + (hp.on_clock ? 1 : 0);
        const bool startable = !l.queued.empty() && l.running.empty();
        return std::array<int, 3>{pp.parked && hp.parked && !startable ? 1 : 0, expected, env.waiters()};
      };
      const auto a = look();
      const auto b = look();
      if (a == b && a[0] == 1 && a[1] == a[2]) return true;
      std::this_thread::sleep_for(50us);
    }
    ADD_FAILURE() << "the gateway did not settle";
    return false;
  }
  // Moves the clock to t, settling at every deadline on the way.
  void run_until(int64_t t) {
    for (int i = 0; i < 100000; ++i) {
      if (!settle()) return;
      const int64_t next = env.next_deadline_ns();
      if (next < 0 || next > t) break;
      env.advance_to(next);
    }
    env.advance_to(t);
    settle();
  }
  std::vector<std::string> logged() {
    std::lock_guard<std::mutex> lk(log_mu);
    return log;
  }
};

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

TEST(HealthProber, ChecksOnTheEnvClockAndThreeFailuresTripTheBreaker) {
  ASSERT_NE(tiny_tokenizer(), nullptr);
  Rig r(5.0);
  ASSERT_NE(r.gw, nullptr);
  const int64_t t0 = r.env.now_ns();
  r.run_until(t0 + ns(5) - 1);
  EXPECT_EQ(r.device->status().health_checks, 0u) << "nothing before the first interval";
  r.run_until(t0 + ns(5));
  EXPECT_EQ(r.device->status().health_checks, 1u);
  EXPECT_EQ(r.device->status().health_failures, 0u);
  {
    std::lock_guard<std::mutex> lk(r.dev.mu);
    for (int i = 0; i < 3; ++i) r.dev.health.push_back(Status(StatusCode::kUnavailable, "bad answer", FailureReason::kUnhealthy));
  }
  r.run_until(t0 + ns(15));
  EXPECT_EQ(r.breaker->state(), BreakerState::kClosed) << "two failures in a row";
  r.run_until(t0 + ns(20));
  const BreakerSnapshot snap = r.breaker->snapshot();
  EXPECT_EQ(snap.state, BreakerState::kOpen);
  ASSERT_EQ(snap.recent_trips.size(), 1u);
  EXPECT_EQ(snap.recent_trips.back().failure, "unhealthy");
  EXPECT_EQ(snap.since_ns, t0 + ns(20));
  EXPECT_EQ(r.device->status().health_failures, 3u);
  EXPECT_TRUE(any_contains(r.logged(), "health check of vulkan:0 failed")) ;
  // While open no checks run; the device stayed healthy, so the half-open
  // episode re-initialises nothing and the probes close it.
  r.run_until(t0 + ns(24.9));
  EXPECT_EQ(r.device->status().health_checks, 4u);
  r.run_until(t0 + ns(27));
  EXPECT_EQ(r.breaker->state(), BreakerState::kClosed);
  EXPECT_EQ(r.dev.reinit_calls.load(), 0);
  EXPECT_EQ(r.device->status().reinitializations, 0u);
  // Checks resume on their schedule once it is closed.
  r.run_until(t0 + ns(40));
  EXPECT_GE(r.device->status().health_checks, 5u);
}

TEST(DeviceControl, WithoutHooksCountsNothingAndABadHealthPolicyIsRefused) {
  ASSERT_NE(tiny_tokenizer(), nullptr);
  Rig r(5.0);
  ASSERT_NE(r.gw, nullptr);
  DeviceControl d(r.env, DeviceHooks{});
  EXPECT_TRUE(d.health_check().ok());
  EXPECT_EQ(d.status().health_checks, 0u) << "no hook: nothing counted";
  d.record_health_timeout(Status(StatusCode::kDeadlineExceeded, "no answer", FailureReason::kTimeout));
  EXPECT_EQ(d.status().health_failures, 1u);
  EXPECT_TRUE(d.recover().ok()) << "no healthy hook: always healthy";
  GatewayPolicy bad;
  bad.health_interval_s = -1;
  std::vector<ExecutionPath> none;
  EXPECT_FALSE(Gateway::create(r.env, std::move(none), {}, bad).ok());
}

TEST(DeviceRecovery, HalfOpenReinitialisesAnUnhealthyDeviceBeforeItsFirstProbe) {
  ASSERT_NE(tiny_tokenizer(), nullptr);
  Rig r(0);  // no health prober
  ASSERT_NE(r.gw, nullptr);
  // A device loss: the backend is unhealthy from now on, and the request on
  // it fails; the one loss opens the breaker.
  r.dev.healthy = false;
  {
    r.faults->fail_next(Status(StatusCode::kDeviceLost, "lost", FailureReason::kDeviceLost));
    RouteRequest q;
    q.generation.prompt = "a a a";
    q.generation.max_tokens = 4;
    auto a = r.gw->submit(q);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    r.settle();
    serve::testing::collect(*a->ticket, kRealTimeout);
  }
  r.settle();
  const int64_t t_trip = r.env.now_ns();
  ASSERT_EQ(r.breaker->state(), BreakerState::kOpen);
  // The first re-initialisation fails: the episode fails, open again with a
  // 10 s cooldown.
  {
    std::lock_guard<std::mutex> lk(r.dev.mu);
    r.dev.reinit.push_back(Status(StatusCode::kUnavailable, "vkCreateDevice failed", FailureReason::kUnhealthy));
  }
  r.run_until(t_trip + ns(5) - 1);
  EXPECT_EQ(r.dev.reinit_calls.load(), 0) << "nothing before the cooldown";
  r.run_until(t_trip + ns(5.25));
  EXPECT_EQ(r.dev.reinit_calls.load(), 1);
  BreakerSnapshot snap = r.breaker->snapshot();
  EXPECT_EQ(snap.state, BreakerState::kOpen);
  EXPECT_EQ(snap.trips, 2u);
  EXPECT_EQ(snap.cooldown_s, 10.0);
  EXPECT_EQ(snap.probes_run, 1u) << "the failed re-initialisation is the episode's failed probe";
  DeviceStatus ds = r.device->status();
  EXPECT_EQ(ds.failed_reinitializations, 1u);
  EXPECT_EQ(ds.reinitializations, 0u);
  EXPECT_NE(ds.last_recovery_error.find("vkCreateDevice failed"), std::string::npos);
  EXPECT_FALSE(ds.healthy);
  // The second works: 250 ms on the clock, then the probes pass and close it.
  const int64_t t_second = t_trip + ns(5.25) + ns(10);
  r.run_until(t_second + ns(2));
  EXPECT_EQ(r.dev.reinit_calls.load(), 2);
  EXPECT_EQ(r.breaker->state(), BreakerState::kClosed);
  ds = r.device->status();
  EXPECT_EQ(ds.reinitializations, 1u);
  EXPECT_DOUBLE_EQ(ds.last_recovery_ms, 250.0);
  EXPECT_TRUE(ds.healthy);
  EXPECT_TRUE(ds.last_recovery_error.empty());
  EXPECT_TRUE(any_contains(r.logged(), "device vulkan:0: re-initialised in 250.0 ms"));
  // Status carries it per path.
  const GatewayStatus st = r.gw->status();
  ASSERT_TRUE(st.paths[0].device.has_value());
  EXPECT_EQ(st.paths[0].device->reinitializations, 1u);
}

}  // namespace
}  // namespace spw::gateway
