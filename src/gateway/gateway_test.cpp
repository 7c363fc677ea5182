// Gateway tests under a simulated clock: real Schedulers, real memory ledgers
// and the real tokenizer of models/stories260K.gguf, with FakeExecutors doing
// the "generation" in simulated time, so every timing below is exact.
#include "gateway/gateway.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "admission/controller.h"
#include "admission/ledger.h"
#include "core/failure.h"
#include "core/size.h"
#include "core/sim_env.h"
#include "engine/engine_test_util.h"
#include "gguf/gguf.h"
#include "engine/checkpoint.h"
#include "serve/scheduler.h"
#include "serve/testing/collect.h"
#include "serve/testing/fake_executor.h"
#include "tokenizer/tokenizer.h"

namespace spw::gateway {
namespace {

using namespace std::chrono_literals;
using admission::DecisionKind;
using admission::PathRates;
using admission::PathRole;
using serve::RequestEvent;
using serve::RequestState;
using serve::Ticket;
using serve::testing::Collected;
using serve::testing::collect;
using serve::testing::FakeFaults;
using serve::testing::FakeSpeed;
using serve::testing::FakeExecutor;

// Status counts decisions by a typed kind: the controller's kinds keep their
// names (the status JSON and the metrics' labels), the gateway's own two are
// "failover" and "migrate".
TEST(DecisionCounterTest, NamesFollowTheControllersKinds) {
  for (DecisionKind k : {DecisionKind::kAdmit, DecisionKind::kDelay, DecisionKind::kShrink, DecisionKind::kOffload,
                         DecisionKind::kRedirect, DecisionKind::kReject}) {
    EXPECT_EQ(decision_counter_name(decision_counter(k)), admission::decision_kind_name(k));
  }
  EXPECT_EQ(decision_counter_name(DecisionCounter::kFailover), "failover");
  EXPECT_EQ(decision_counter_name(DecisionCounter::kMigrate), "migrate");
}

// Real-time bound on every wait: a correct run never comes near it; it turns
// a lost wake-up or a stuck worker into a failure instead of a hang.
constexpr std::chrono::milliseconds kRealTimeout = 10s;
constexpr uint64_t kMiB = 1024 * 1024;

int64_t ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

std::shared_ptr<const Tokenizer> tiny_tokenizer() { return spw::testing::stories_tokenizer(); }

int32_t count_tokens(const std::string& text) {
  const auto& tok = *tiny_tokenizer();
  return static_cast<int32_t>(tok.encode(text, tok.add_bos_default(), true).size());
}

// A prompt of exactly n tokens (BOS included), as the gateway will count it.
std::string prompt_of(int32_t n) {
  static std::mutex mu;
  static std::map<int32_t, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(n); it != cache.end()) return it->second;
  std::string text = "a";
  while (count_tokens(text) < n) text += " a";
  EXPECT_EQ(count_tokens(text), n) << "cannot build a prompt of " << n << " tokens";
  cache[n] = text;
  return text;
}

serve::testing::FakeSpeed speed(double prefill_tps, double decode_tps) {
  FakeSpeed s;
  s.prefill_tps = prefill_tps;
  s.decode_tps = decode_tps;
  return s;
}

// One execution path to build. Defaults: the GPU path of the brief (context
// 256, blocks of 16, a 64-block budget, 4 workers) at 1000 prompt tokens/s
// and 100 tokens/s (10 ms a token).
struct PathSpec {
  std::string name = "gpu";
  std::string placement = "vulkan";
  PathRole role = PathRole::kPrimary;
  int workers = 4;
  int32_t n_ctx = 256;
  int32_t queue_capacity = 16;
  int32_t kv_blocks_total = 64;
  int32_t kv_block_tokens = 16;
  FakeSpeed speed = FakeSpeed{1000.0, 100.0, 0};
  // What the ETA starts from; default: the fake's true speeds.
  std::optional<PathRates> prior;
  std::shared_ptr<admission::MemoryLedger> ledger;
  // Paths with the same breaker_group share one CircuitBreaker (a device);
  // empty: none.
  std::string breaker_group;
  BreakerOptions breaker_options;
  // The model it serves (ExecutionPath::fingerprint and every checkpoint's).
  std::string fingerprint = "fake-model";
  std::string cpu_kernels;  // ExecutionPath::cpu_kernels
  SafePointRules safe_points;
  int32_t checkpoint_every = 0;  // for journaled requests (record_id != 0)
};

PathSpec cpu_spec() {
  PathSpec s;
  s.name = "cpu";
  s.placement = "cpu";
  s.role = PathRole::kFallback;
  s.workers = 2;
  s.kv_blocks_total = 0;  // KV in host memory, bounded by the ledger only
  s.speed = speed(200.0, 20.0);
  return s;
}


std::string fake_text(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += 't';
    s += std::to_string(i);
    s += ' ';
  }
  return s;
}

RouteRequest request(int32_t prompt_tokens, std::optional<int32_t> max_tokens, bool allow_shrink = false) {
  RouteRequest r;
  r.generation.prompt = prompt_of(prompt_tokens);
  r.generation.sampler.temperature = 0;
  r.generation.max_tokens = max_tokens;
  r.allow_shrink = allow_shrink;
  return r;
}

// A Gateway over FakeExecutor paths on a SimEnv, with helpers to move the
// simulated clock only while every worker is parked on it.
class Harness {
 public:
  explicit Harness(std::vector<PathSpec> specs, admission::AdmissionPolicy policy = {},
                   std::vector<PathNotBuilt> not_built = {}, Overflow overflow = Overflow::kPlanned,
                   double reservation_max_share = GatewayPolicy{}.reservation_max_share) {
    std::vector<ExecutionPath> paths;
    for (const PathSpec& s : specs) {
      auto f = std::make_shared<FakeFaults>();
      faults.push_back(f);
      std::shared_ptr<CircuitBreaker> breaker;
      if (!s.breaker_group.empty()) {
        auto& b = breakers[s.breaker_group];
        if (!b) {
          auto created = CircuitBreaker::create(env, "vulkan:0", s.breaker_options);
          EXPECT_TRUE(created.ok()) << created.status().to_string();
          if (created.ok()) b = *created;
        }
        breaker = b;
      }
      serve::SchedulerOptions o;
      o.queue_capacity = s.queue_capacity;
      o.n_ctx = s.n_ctx;
      o.placement = s.placement;
      o.path = s.name;
      o.kv_blocks_total = s.kv_blocks_total;
      o.kv_block_tokens = s.kv_block_tokens;
      o.prior_rates = s.prior ? *s.prior : PathRates{s.speed.prefill_tps, s.speed.decode_tps, 1.0, 0, false};
      if (breaker) o.observer = std::make_shared<BreakerObserver>(breaker);
      o.safe_points = s.safe_points;
      o.checkpoint_every = s.checkpoint_every;
      auto sched = serve::Scheduler::create(
          env, tiny_tokenizer(), serve::testing::make_fake_executors(env, s.workers, s.speed, f, s.fingerprint), o);
      EXPECT_TRUE(sched.ok()) << sched.status().to_string();
      if (!sched.ok()) return;
      ExecutionPath p;
      p.name = s.name;
      p.placement = s.placement;
      p.model = "stories260K";
      p.role = s.role;
      p.scheduler = std::move(*sched);
      p.tokenizer = tiny_tokenizer();
      p.ledger = s.ledger;
      p.breaker = breaker;
      p.fingerprint = s.fingerprint;
      p.cpu_kernels = s.cpu_kernels;
      paths.push_back(std::move(p));
    }
    GatewayPolicy gp;
    gp.admission = policy;
    gp.overflow = overflow;
    gp.reservation_max_share = reservation_max_share;
    gp.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu);
      log.push_back(line);
    };
    auto g = Gateway::create(env, std::move(paths), std::move(not_built), gp);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (g.ok()) gw = std::move(*g);
  }

  // Shuts the gateway down while driving the clock, so that running requests
  // (parked in simulated sleeps) reach the token boundary where they see the
  // cancel. A shutdown that does not finish in real time aborts: a hung
  // worker cannot be joined and the suite must not hang.
  ~Harness() {
    if (!gw) return;
    std::promise<void> done;
    std::future<void> finished = done.get_future();
    std::thread stopper([&] {
      gw->shutdown(0ms);
      done.set_value();
    });
    const auto until = std::chrono::steady_clock::now() + kRealTimeout;
    while (finished.wait_for(100us) != std::future_status::ready) {
      if (std::chrono::steady_clock::now() > until) {
        std::fprintf(stderr, "gateway_test: shutdown hung\n");
        std::abort();
      }
      env.advance_to_next();
    }
    stopper.join();
    gw.reset();
  }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // Waits (real time) until the system is quiescent: every running request's
  // worker is parked on the simulated clock, no queued request could start
  // (no idle worker, or the head of the queue does not fit the free blocks),
  // and the gateway's prober (with breakers) is parked too, on the clock or
  // off it. The picture is read twice around the waiter count so that a
  // change in between is seen. Only then is advancing the clock exact.
  bool settle() {
    const auto until = std::chrono::steady_clock::now() + kRealTimeout;
    while (std::chrono::steady_clock::now() < until) {
      const Picture a = picture();
      const int w1 = env.waiters();
      const Picture b = picture();
      const int w2 = env.waiters();
      const int expected = a.running + (a.prober_on_clock ? 1 : 0);
      if (a == b && w1 == w2 && w1 == expected && !a.startable && a.prober_parked) return true;
      std::this_thread::sleep_for(50us);
    }
    const Picture p = picture();
    std::string paths;
    for (const auto& q : p.paths) {
      paths += " [running " + std::to_string(q[0]) + ", queued " + std::to_string(q[1]) + ", free blocks " +
               std::to_string(q[2]) + "]";
    }
    ADD_FAILURE() << "the gateway's workers did not settle: waiters " << env.waiters() << ", running " << p.running
                  << ", startable " << p.startable << ", prober parked " << p.prober_parked << " on clock "
                  << p.prober_on_clock << "; paths" << paths;
    return false;
  }

  // Moves the clock to `t`, stopping at every deadline on the way (a token,
  // a prefill) and settling there, so each step happens at its exact instant.
  void run_until(int64_t t) {
    for (int i = 0; i < 1'000'000; ++i) {
      if (!settle()) return;
      const int64_t next = env.next_deadline_ns();
      if (next < 0 || next > t) break;
      env.advance_to(next);
    }
    env.advance_to(t);
    settle();
  }
  void run_for(double s) { run_until(env.now_ns() + ns(s)); }

  // Runs until nothing is running or queued on any path.
  void run_to_idle() {
    for (int i = 0; i < 1'000'000; ++i) {
      if (!settle()) return;
      if (gw->in_flight() == 0) return;
      if (!env.advance_to_next()) break;
    }
    EXPECT_EQ(gw->in_flight(), 0) << "requests are stuck with no deadline ahead";
  }

  // Submits, expecting acceptance; then waits for the workers to take it.
  std::shared_ptr<Ticket> submit(const RouteRequest& r) {
    Refusal refusal;
    Result<Admitted> a = gw->submit(r, &refusal);
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    if (!a.ok()) return nullptr;
    settle();
    return a->ticket;
  }

  serve::Scheduler& sched(size_t i) { return *gw->paths()[i].scheduler; }

  // Runs the gateway's equivalence check (it blocks on its runs) while the
  // clock moves them along.
  std::vector<EquivalenceInfo> verify() {
    auto fut = std::async(std::launch::async, [this] { return gw->verify_equivalence(); });
    const auto until = std::chrono::steady_clock::now() + kRealTimeout;
    while (fut.wait_for(200us) != std::future_status::ready) {
      if (std::chrono::steady_clock::now() > until) {
        std::fprintf(stderr, "gateway_test: verify_equivalence hung\n");
        std::abort();
      }
      env.advance_to_next();
    }
    return fut.get();
  }
  double since(int64_t t0) { return static_cast<double>(env.now_ns() - t0) / 1e9; }

  std::vector<std::string> logged() {
    std::lock_guard<std::mutex> lock(log_mu);
    return log;
  }

  SimEnv env;  // declared before gw: outlives it
  std::vector<std::shared_ptr<FakeFaults>> faults;
  std::map<std::string, std::shared_ptr<CircuitBreaker>> breakers;  // by breaker_group
  std::mutex log_mu;
  std::vector<std::string> log;  // the gateway's breaker lines
  std::unique_ptr<Gateway> gw;

 private:
  struct Picture {
    std::vector<std::array<int64_t, 3>> paths;  // running, queued, free blocks
    int running = 0;
    bool startable = false;
    bool prober_parked = true;
    bool prober_on_clock = false;
    bool operator==(const Picture&) const = default;
  };
  Picture picture() const {
    Picture p;
    const Gateway::ProberPark park = gw->prober_park();
    p.prober_parked = park.parked;
    p.prober_on_clock = park.on_clock;
    for (const ExecutionPath& path : gw->paths()) {
      const serve::LoadSnapshot l = path.scheduler->load();
      p.paths.push_back({static_cast<int64_t>(l.running.size()), static_cast<int64_t>(l.queued.size()),
                         l.kv_blocks_free});
      p.running += static_cast<int>(l.running.size());
      if (!l.queued.empty() && static_cast<int>(l.running.size()) < path.scheduler->n_workers()) {
        const int32_t need = l.queued.front().kv_blocks;
        if (l.kv_blocks_total == 0 || need <= l.kv_blocks_free || need > l.kv_blocks_total) p.startable = true;
      }
    }
    return p;
  }
};

TEST(GatewayTest, PromptHelperCountsTokensLikeTheGateway) {
  ASSERT_NE(tiny_tokenizer(), nullptr) << "models/stories260K.gguf";
  for (int32_t n : {2, 20, 56, 100, 150, 250}) EXPECT_EQ(count_tokens(prompt_of(n)), n);
}

TEST(GatewayTest, ShortRequestsStayOnGpuAndALongPromptGoesToCpuBeforeRunning) {
  PathSpec gpu;
  gpu.kv_blocks_total = 8;  // 128 positions: less than one full context
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);

  std::vector<std::shared_ptr<Ticket>> shorts;
  for (int i = 0; i < 3; ++i) {
    auto t = h.submit(request(20, 20));  // 40 tokens: 3 blocks
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->path(), "gpu");
    EXPECT_EQ(t->decision().kind, i < 2 ? DecisionKind::kAdmit : DecisionKind::kDelay);
    EXPECT_FALSE(t->decision().degraded());
    shorts.push_back(t);
  }
  // 150 + 20 tokens need 11 blocks, more than the gpu's whole budget of 8:
  // decided for the cpu before any worker touches it.
  const int64_t gpu_runs = h.faults[0]->runs();
  const uint64_t gpu_submitted = h.sched(0).stats().submitted;
  Refusal refusal;
  Result<Admitted> a = h.gw->submit(request(150, 20), &refusal);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::shared_ptr<Ticket> longer = a->ticket;
  EXPECT_EQ(a->path->name, "cpu");
  EXPECT_EQ(longer->path(), "cpu");
  const admission::Decision& d = longer->decision();
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_TRUE(d.degraded());
  EXPECT_EQ(d.path, "cpu");
  EXPECT_EQ(d.kv_blocks, 11);
  EXPECT_NE(d.reason.find("gpu: needs 11 KV blocks"), std::string::npos) << d.reason;
  EXPECT_EQ(h.faults[0]->runs(), gpu_runs);
  EXPECT_EQ(h.sched(0).stats().submitted, gpu_submitted);
  EXPECT_EQ(longer->limits().max_tokens, 20);

  h.run_to_idle();
  for (auto& t : shorts) {
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.fin.state, RequestState::kDone);
    EXPECT_EQ(c.fin.finish, FinishReason::kLength);
    EXPECT_EQ(c.text, fake_text(20));
  }
  Collected c = collect(*longer, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kDone);
  EXPECT_EQ(c.fin.completion_tokens, 20);
  EXPECT_EQ(h.faults[1]->runs(), 1);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 8);
}

// A 40-block budget, 4 workers, one path. A (16 blocks) and B (16) run; C
// needs 10 of the 8 left, so it waits at the head of the queue with two
// workers idle, and D (2 blocks) waits behind it (FIFO). B ends first, at
// 0.1 s prefill + 156 tokens * 10 ms = 1.66 s: C and D start at that instant.
TEST(GatewayTest, KvGateHoldsARequestUntilAnEarlierOneFinishes) {
  PathSpec gpu;
  gpu.kv_blocks_total = 40;
  admission::AdmissionPolicy policy;
  policy.max_delay_s = 100;  // this test is about waiting on the gpu
  Harness h({gpu}, policy);
  ASSERT_NE(h.gw, nullptr);
  const int64_t t0 = h.env.now_ns();

  auto a = h.submit(request(56, 200));   // 256 tokens: 16 blocks, 2.056 s
  auto b = h.submit(request(100, 156));  // 16 blocks, 1.66 s
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->state(), RequestState::kRunning);
  EXPECT_EQ(b->state(), RequestState::kRunning);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 8);

  auto c = h.submit(request(60, 100));  // 160 tokens: 10 blocks
  auto d = h.submit(request(20, 12));   // 32 tokens: 2 blocks
  ASSERT_TRUE(c && d);
  EXPECT_EQ(c->state(), RequestState::kQueued);
  EXPECT_EQ(d->state(), RequestState::kQueued);
  EXPECT_EQ(c->decision().kind, DecisionKind::kDelay);
  EXPECT_EQ(c->decision().queue_position, 1);
  EXPECT_EQ(d->decision().queue_position, 2);
  EXPECT_EQ(h.gw->progress(*c).queue_position, 1);
  EXPECT_EQ(h.sched(0).stats().running, 2);  // two workers idle: KV is the limit
  // The estimate at acceptance is B's end, worked out the same way.
  EXPECT_NEAR(c->decision().timing.delay_s, 1.66, 1e-9);
  EXPECT_NEAR(d->decision().timing.delay_s, 1.66, 1e-9);

  // One nanosecond before B's end nothing has moved.
  h.run_until(t0 + ns(1.66) - 1);
  EXPECT_EQ(b->state(), RequestState::kRunning);
  EXPECT_EQ(c->state(), RequestState::kQueued);
  EXPECT_EQ(h.sched(0).queue_position(c->id()), 1);
  EXPECT_EQ(h.sched(0).queue_position(d->id()), 2);

  h.run_until(t0 + ns(1.66));
  EXPECT_EQ(b->state(), RequestState::kDone);
  EXPECT_EQ(c->state(), RequestState::kRunning);
  EXPECT_EQ(d->state(), RequestState::kRunning);
  EXPECT_EQ(c->queue_ns(), ns(1.66));
  EXPECT_EQ(d->queue_ns(), ns(1.66));
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 40 - 16 - 10 - 2);
  EXPECT_EQ(b->run_ns(), ns(1.66));

  h.run_to_idle();
  EXPECT_EQ(collect(*c, kRealTimeout).fin.completion_tokens, 100);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 40);
}

// Concurrency on one fixed budget: ctx 256, blocks of 16, 64 blocks. Sized
// per request (prompt + max_tokens), a 32-token request takes 2 blocks and
// 32 of them run at once (given workers enough: 40 here); a full context per
// request (the "worker holds n_ctx" plan) takes 16 blocks, so 4 fit.
TEST(GatewayTest, PerRequestKvBlocksRunMoreConcurrentRequestsThanFullContextSizing) {
  PathSpec gpu;
  gpu.workers = 40;
  gpu.kv_blocks_total = 64;
  gpu.queue_capacity = 64;
  admission::AdmissionPolicy policy;
  policy.max_delay_s = 100;
  auto concurrent = [&](std::optional<int32_t> max_tokens, int32_t* blocks) {
    Harness h({gpu}, policy);
    if (!h.gw) return -1;
    for (int i = 0; i < 40; ++i) {
      auto t = h.submit(request(16, max_tokens));
      if (!t) return -1;
      *blocks = t->kv_blocks();
    }
    return h.sched(0).stats().running;
  };
  int32_t short_blocks = 0, full_blocks = 0;
  const int per_request = concurrent(16, &short_blocks);  // 16 + 16 tokens
  const int full_context = concurrent(std::nullopt, &full_blocks);
  EXPECT_EQ(short_blocks, 2);
  EXPECT_EQ(full_blocks, 16);
  EXPECT_EQ(per_request, 32);
  EXPECT_EQ(full_context, 4);
  EXPECT_GT(per_request, full_context);
  std::printf("[ measure  ] KV budget 64 blocks x 16 tokens, ctx 256, 40 workers: %d concurrent 32-token requests "
              "with per-request blocks (%d blocks each) vs %d with the full-context plan (%d blocks each)\n",
              per_request, short_blocks, full_context, full_blocks);
  RecordProperty("concurrent_per_request_blocks", per_request);
  RecordProperty("concurrent_full_context_plan", full_context);
}

// Two workers; R1 (1.05 s) and R2 (0.6 s) run; Q1, Q2, Q3 queue. The ETA at
// acceptance and the progress() estimate while queued are compared with the
// real simulated wait, first with the prior rates (the fake's true speeds),
// then again once the rates are measured from finished requests.
TEST(GatewayTest, EstimatedDelayOfAQueuedRequestMatchesTheSimulatedWait) {
  PathSpec gpu;
  gpu.workers = 2;
  admission::AdmissionPolicy policy;
  policy.max_delay_s = 100;
  Harness h({gpu}, policy);
  ASSERT_NE(h.gw, nullptr);

  for (int round = 0; round < 2; ++round) {
    const int64_t t0 = h.env.now_ns();
    auto r1 = h.submit(request(50, 100));
    auto r2 = h.submit(request(100, 50));
    std::vector<std::shared_ptr<Ticket>> queued{h.submit(request(30, 80)), h.submit(request(40, 40)),
                                                h.submit(request(20, 20))};
    ASSERT_TRUE(r1 && r2 && queued[0] && queued[1] && queued[2]);
    std::vector<double> at_acceptance, progress_est;
    std::vector<int64_t> progress_at;
    for (auto& q : queued) {
      EXPECT_EQ(q->state(), RequestState::kQueued);
      EXPECT_EQ(q->decision().kind, DecisionKind::kDelay);
      at_acceptance.push_back(q->decision().timing.delay_s);
    }
    // Mid-way, between two token boundaries: what progress() says is left.
    h.run_for(0.305);
    for (auto& q : queued) {
      const Progress p = h.gw->progress(*q);
      EXPECT_GE(p.queue_position, 1);
      progress_est.push_back(p.estimated_delay_s);
      progress_at.push_back(h.env.now_ns());
    }
    h.run_to_idle();
    for (size_t i = 0; i < queued.size(); ++i) {
      const double real = static_cast<double>(queued[i]->queue_ns()) / 1e9;
      const double left = real - static_cast<double>(progress_at[i] - t0) / 1e9;
      const double r_acc = at_acceptance[i] / real;
      const double r_prog = progress_est[i] / left;
      std::printf("[ measure  ] round %d (%s rates) Q%zu: ETA at acceptance %.3f s, progress() at +0.305 s "
                  "%.3f s left; real wait %.3f s (%.3f s left); ratios %.3f, %.3f\n",
                  round, round == 0 ? "prior" : "measured", i + 1, at_acceptance[i], progress_est[i], real, left,
                  r_acc, r_prog);
      EXPECT_GT(real, 0.0);
      EXPECT_GE(r_acc, 0.5);
      EXPECT_LE(r_acc, 2.0);
      EXPECT_GE(r_prog, 0.5);
      EXPECT_LE(r_prog, 2.0);
      if (round == 0) {
        EXPECT_NEAR(r_acc, 1.0, 1e-6) << "prior = true speeds: the simulation is exact";
      }
    }
    // Hand check of round 0: Q1 starts when R2 ends (0.1 + 0.5), Q2 when R1
    // ends (0.05 + 1.0), Q3 when Q1 ends (0.6 + 0.03 + 0.8).
    if (round == 0) {
      EXPECT_EQ(queued[0]->queue_ns(), ns(0.6));
      EXPECT_EQ(queued[1]->queue_ns(), ns(1.05));
      EXPECT_EQ(queued[2]->queue_ns(), ns(1.43));
    }
  }
}

struct Ledgers {
  std::shared_ptr<admission::MemoryLedger> gpu, host;
  admission::Ticket weights;
};

// A 1000 MiB device with 600 MiB of model weights on it, and a host ledger
// with a fixed 4 GiB cap.
Ledgers make_ledgers() {
  Ledgers l;
  auto dev = admission::DeviceLedger::create("vulkan:0", 1000 * kMiB);
  EXPECT_TRUE(dev.ok());
  l.gpu = std::shared_ptr<admission::MemoryLedger>(std::move(*dev));
  auto w = l.gpu->reserve({admission::OwnerKind::kModelWeights, "stories260K"}, 600 * kMiB);
  EXPECT_TRUE(w.ok());
  l.weights = *w;
  admission::HostBudgetPolicy hp;
  hp.cap_bytes = 4096 * kMiB;
  admission::HostReadings readings;
  readings.mem_available = 64 * 1024 * kMiB;
  auto host = admission::HostLedger::create("host", hp, readings);
  EXPECT_TRUE(host.ok());
  l.host = std::shared_ptr<admission::MemoryLedger>(std::move(*host));
  return l;
}

// The GPU path on the device ledger and the CPU fallback on the host ledger.
std::vector<PathSpec> gpu_and_cpu(const Ledgers& l) {
  PathSpec gpu;
  gpu.ledger = l.gpu;
  PathSpec cpu = cpu_spec();
  cpu.ledger = l.host;
  return {gpu, cpu};
}

TEST(GatewayTest, CoTenantReservationMovesNewRequestsToCpuUntilReleasedOrExpired) {
  Ledgers l = make_ledgers();
  Harness h(gpu_and_cpu(l));
  ASSERT_NE(h.gw, nullptr);

  auto running = h.submit(request(20, 100));  // 1.02 s on the gpu
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->path(), "gpu");

  // A reservation that still fits leaves routing alone.
  auto small = h.gw->reserve_cotenant("indexer", 100 * kMiB, 60);
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  EXPECT_TRUE(small->fits);
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  ASSERT_TRUE(h.gw->release(small->id).ok());

  // 600 + 500 MiB > 1000 MiB: accepted (it cannot be refused) but it does not fit.
  auto big = h.gw->reserve_cotenant("trainer", 500 * kMiB, 60);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_FALSE(big->fits);
  EXPECT_EQ(big->after.used, 1100 * kMiB);
  EXPECT_EQ(big->ledger, "vulkan:0");
  auto moved = h.submit(request(20, 10));
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->path(), "cpu");
  EXPECT_EQ(moved->decision().kind, DecisionKind::kRedirect);
  EXPECT_NE(moved->decision().reason.find("memory pressure on vulkan:0"), std::string::npos)
      << moved->decision().reason;
  // The request already running on the gpu is untouched.
  EXPECT_EQ(running->state(), RequestState::kRunning);
  h.run_for(0.5);
  EXPECT_EQ(running->state(), RequestState::kRunning);

  // Released: back to the gpu. Releasing twice is NotFound.
  ASSERT_TRUE(h.gw->release(big->id).ok());
  EXPECT_EQ(h.gw->release(big->id).code(), StatusCode::kNotFound);
  auto back = h.submit(request(20, 10));
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->path(), "gpu");
  h.run_to_idle();
  Collected c = collect(*running, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kDone);
  EXPECT_EQ(c.fin.completion_tokens, 100);

  // Lease expiry: not renewed within 5 s, the next call that refreshes drops it.
  auto lapsing = h.gw->reserve_cotenant("trainer", 500 * kMiB, 5);
  ASSERT_TRUE(lapsing.ok());
  EXPECT_EQ(h.submit(request(20, 10))->path(), "cpu");
  h.run_for(4.999);
  EXPECT_EQ(h.gw->reservations().size(), 1u);
  h.run_for(0.001);
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  EXPECT_TRUE(h.gw->reservations().empty());
  EXPECT_EQ(h.gw->renew(lapsing->id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(l.gpu->snapshot().used, 600 * kMiB);

  // renew() extends the lease by its ttl from now.
  auto renewed = h.gw->reserve_cotenant("trainer", 500 * kMiB, 5);
  ASSERT_TRUE(renewed.ok());
  h.run_for(3);
  auto r = h.gw->renew(renewed->id);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->expires_in_s, 5.0, 1e-9);
  h.run_for(3);  // 6 s after the reservation: alive only thanks to the renew
  EXPECT_EQ(h.submit(request(20, 10))->path(), "cpu");
  auto listed = h.gw->reservations();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_NEAR(listed[0].expires_in_s, 2.0, 1e-9);
  h.run_for(2);
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  h.run_to_idle();
}

// A reservation belongs to the key that made them: another key neither sees,
// renews nor releases it (NotFound, as if absent); the admin sees and ends
// every one. Each key has its own cap, so one key filling its own cannot
// refuse another's.
TEST(GatewayTest, ReservationsBelongToTheKeyThatMadeThem) {
  Ledgers l = make_ledgers();
  Harness h(gpu_and_cpu(l));
  ASSERT_NE(h.gw, nullptr);
  const ReservationCaller a{"key-a", false}, b{"key-b", false}, admin{"", true};
  auto mine = h.gw->reserve_cotenant("whisper", kMiB, 60, a);
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  EXPECT_EQ(h.gw->reservations(a).size(), 1u);
  EXPECT_TRUE(h.gw->reservations(b).empty());
  EXPECT_EQ(h.gw->renew(mine->id, b).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(h.gw->release(mine->id, b).code(), StatusCode::kNotFound);
  EXPECT_EQ(h.gw->reservations(a).size(), 1u) << "B's release did nothing";
  EXPECT_TRUE(h.gw->renew(mine->id, a).ok());
  EXPECT_EQ(h.gw->status().reservations.size(), 1u) << "status lists every lease; the HTTP layer filters";

  // Per-key caps: A fills its own, B still reserves.
  for (size_t i = 1; i < kMaxReservationsPerOwner; ++i) ASSERT_TRUE(h.gw->reserve_cotenant("w", kMiB, 60, a).ok()) << i;
  auto over = h.gw->reserve_cotenant("w", kMiB, 60, a);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("for this API key"), std::string::npos) << over.status().to_string();
  EXPECT_TRUE(h.gw->reserve_cotenant("w", kMiB, 60, b).ok());

  EXPECT_EQ(h.gw->reservations(admin).size(), kMaxReservationsPerOwner + 1);
  ASSERT_TRUE(h.gw->release(mine->id, admin).ok());
  EXPECT_EQ(h.gw->reservations(a).size(), kMaxReservationsPerOwner - 1);
  h.run_to_idle();
}

// Sizes outside the domain are refused whole (nothing declared): a second
// reservation of 2^64 - 1.9 GiB once wrapped the ledger's co-tenant total to
// 1 byte and sent work to a GPU whose memory whisper held. Clients' leases
// together hold at most reservation_max_share of the ledger's limit.
TEST(GatewayTest, ReservationSizesStayInTheirDomainAndShare) {
  Ledgers l = make_ledgers();
  Harness h(gpu_and_cpu(l));
  ASSERT_NE(h.gw, nullptr);
  auto whisper = h.gw->reserve_cotenant("whisper", 300 * kMiB, 60);
  ASSERT_TRUE(whisper.ok()) << whisper.status().to_string();
  for (const uint64_t bytes : std::vector<uint64_t>{18446744073709551615ull, 18446744071669442151ull, kMaxByteSize + 1}) {
    auto r = h.gw->reserve_cotenant("wrap", bytes, 60);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bytes;
    EXPECT_EQ(r.status().field(), "bytes");
  }
  EXPECT_EQ(l.gpu->snapshot().reserved[static_cast<int>(admission::OwnerKind::kCoTenant)], 300 * kMiB)
      << "whisper's bytes are still in the ledger";
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  // 300 + 501 MiB > 80% of the 1000 MiB limit: refused, naming the share.
  auto big = h.gw->reserve_cotenant("trainer", 501 * kMiB, 60);
  EXPECT_EQ(big.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(big.status().message().find("more than 80% of its limit"), std::string::npos) << big.status().to_string();
  EXPECT_NE(big.status().message().find("--reservation-max-share"), std::string::npos);
  EXPECT_TRUE(h.gw->reserve_cotenant("trainer", 500 * kMiB, 60).ok()) << "exactly at the share";
  h.run_to_idle();
}

// A CPU-only server (one path, on the host ledger): a reservation that would
// leave the model no path for its smallest request is refused with the
// reason, unless the operator set the share to 1; one that leaves room passes.
TEST(GatewayTest, AReservationNeverTakesTheLastPathWithoutTheOperatorsLeave) {
  for (const double share : {0.9, 1.0}) {
    Ledgers l = make_ledgers();
    auto weights = l.host->reserve({admission::OwnerKind::kModelWeights, "stories260K"}, 2048 * kMiB);
    ASSERT_TRUE(weights.ok());
    PathSpec cpu = cpu_spec();
    cpu.ledger = l.host;
    Harness h({cpu}, {}, {}, Overflow::kPlanned, share);
    ASSERT_NE(h.gw, nullptr);
    EXPECT_TRUE(h.gw->reserve_cotenant("small", 1024 * kMiB, 60).ok()) << "leaves 1 GiB: the model still runs";
    auto last = h.gw->reserve_cotenant("hog", 1536 * kMiB, 60);
    if (share < 1.0) {
      ASSERT_EQ(last.status().code(), StatusCode::kFailedPrecondition) << last.status().to_string();
      EXPECT_NE(last.status().message().find("would have no path left"), std::string::npos) << last.status().to_string();
      EXPECT_NE(last.status().message().find("--reservation-max-share 1"), std::string::npos);
      auto t = h.submit(request(20, 10));
      ASSERT_NE(t, nullptr) << "the server still serves";
      EXPECT_EQ(t->path(), "cpu");
    } else {
      EXPECT_TRUE(last.ok()) << "the operator's leave: " << last.status().to_string();
    }
    h.run_to_idle();
  }
}

// The drill's baselines (Overflow): a naive free-memory check does not see a
// declared co-tenant and admits to the GPU over the reserve line, recording
// the true pressure; without an overflow path a device fault is the answer.
TEST(GatewayOverflowTest, BaselinesIgnoreThePlanAndRecordTheTruePressure) {
  {
    Ledgers l = make_ledgers();
    Harness h(gpu_and_cpu(l), {}, {}, Overflow::kNaive);
    ASSERT_NE(h.gw, nullptr);
    auto big = h.gw->reserve_cotenant("trainer", 500 * kMiB, 60);
    ASSERT_TRUE(big.ok());
    EXPECT_FALSE(big->fits);
    auto t = h.submit(request(20, 10));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->path(), "gpu") << "the reading shows 400 MiB free; the declaration is not seen";
    EXPECT_NEAR(t->decision().pressure, 1.1, 1e-9) << "600 MiB ours + 500 MiB declared over a 1000 MiB line";
    h.run_to_idle();
  }
  {
    Ledgers l = make_ledgers();
    PathSpec gpu;
    gpu.ledger = l.gpu;
    gpu.breaker_group = "vulkan:0";
    PathSpec cpu = cpu_spec();
    cpu.ledger = l.host;
    Harness h({gpu, cpu}, {}, {}, Overflow::kNone);
    ASSERT_NE(h.gw, nullptr);
    ASSERT_TRUE(h.gw->reserve_cotenant("trainer", 500 * kMiB, 60).ok());
    h.faults[0]->fail_next(Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost));
    auto t = h.submit(request(20, 10));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->decision().kind, DecisionKind::kAdmit) << t->decision().reason;
    h.run_to_idle();
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.fin.state, RequestState::kFailed);
    EXPECT_EQ(c.fin.status.reason(), FailureReason::kDeviceLost) << "no failover: the fault is the answer";
    EXPECT_EQ(h.faults[1]->runs(), 0) << "the CPU path never ran it";
  }
  EXPECT_EQ(parse_overflow("naive").value(), Overflow::kNaive);
  EXPECT_EQ(parse_overflow("nope").status().reason(), FailureReason::kInvalidField);
}

// Same shape as the KV-gate test: A and B run (16 blocks each of 40), C (10
// blocks) is the blocked head of the queue, D (2 blocks) waits behind it.
TEST(GatewayTest, CancelEndsQueuedAtOnceAndRunningAtTheNextTokenBoundary) {
  PathSpec gpu;
  gpu.kv_blocks_total = 40;
  admission::AdmissionPolicy policy;
  policy.max_delay_s = 100;
  Harness h({gpu}, policy);
  ASSERT_NE(h.gw, nullptr);
  const int64_t t0 = h.env.now_ns();
  auto a = h.submit(request(56, 200));
  auto b = h.submit(request(100, 156));
  auto c = h.submit(request(60, 100));
  auto d = h.submit(request(20, 12));
  ASSERT_TRUE(a && b && c && d);
  ASSERT_EQ(c->state(), RequestState::kQueued);
  ASSERT_EQ(d->state(), RequestState::kQueued);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 8);

  // Queued C: ends at once, and its place at the head no longer holds D back:
  // D starts at the same simulated instant.
  h.run_until(t0 + ns(0.2));
  EXPECT_TRUE(h.gw->cancel(c->id()));
  EXPECT_EQ(c->state(), RequestState::kCancelled);
  Collected cc = collect(*c, kRealTimeout);
  EXPECT_EQ(cc.n_finished, 1);
  EXPECT_EQ(cc.fin.state, RequestState::kCancelled);
  EXPECT_EQ(cc.fin.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(cc.fin.status.reason(), FailureReason::kCancelled);
  EXPECT_TRUE(cc.text.empty());
  EXPECT_EQ(c->run_ns(), 0);
  h.settle();
  EXPECT_EQ(d->state(), RequestState::kRunning);
  EXPECT_EQ(d->queue_ns(), ns(0.2));
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 8 - 2);
  EXPECT_FALSE(h.gw->cancel(c->id()));  // already finished

  // Running A, cancelled at 0.505 s, between tokens 45 (0.506 s: 0.056 s of
  // prefill + 45 x 10 ms) and 44: it finishes the token it is computing and
  // stops at that boundary, giving its 16 blocks back.
  h.run_until(t0 + ns(0.505));
  EXPECT_TRUE(h.gw->cancel(a->id()));
  h.settle();
  EXPECT_EQ(a->state(), RequestState::kRunning);
  h.run_until(t0 + ns(0.506));
  EXPECT_EQ(a->state(), RequestState::kCancelled);
  Collected ca = collect(*a, kRealTimeout);
  EXPECT_EQ(ca.fin.state, RequestState::kCancelled);
  EXPECT_EQ(ca.fin.status.reason(), FailureReason::kCancelled);
  EXPECT_EQ(ca.fin.completion_tokens, 45);
  EXPECT_EQ(ca.text, fake_text(45));
  EXPECT_EQ(a->run_ns(), ns(0.506));
  // D (0.02 + 0.12 s from 0.2 s) is done by now; only B holds blocks.
  EXPECT_EQ(d->state(), RequestState::kDone);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 40 - 16);
  EXPECT_FALSE(h.gw->cancel(999'999));
  h.run_to_idle();
  EXPECT_EQ(b->state(), RequestState::kDone);
  const serve::SchedulerStats st = h.sched(0).stats();
  EXPECT_EQ(st.cancelled, 2u);
  EXPECT_EQ(st.done, 2u);
}

TEST(GatewayTest, QuoteAgreesWithTheDecisionSubmitTakes) {
  Ledgers l = make_ledgers();
  PathSpec gpu;
  gpu.workers = 1;
  gpu.kv_blocks_total = 8;
  gpu.ledger = l.gpu;
  PathSpec cpu = cpu_spec();
  cpu.ledger = l.host;
  Harness h({gpu, cpu});
  ASSERT_NE(h.gw, nullptr);

  auto check = [&](const RouteRequest& r, DecisionKind want, const std::string& want_path) {
    auto q = h.gw->quote(r);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    auto a = h.gw->submit(r);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    const admission::Decision& d = a->ticket->decision();
    EXPECT_EQ(q->decision.kind, want) << q->decision.reason;
    EXPECT_EQ(d.kind, q->decision.kind);
    EXPECT_EQ(d.path, q->decision.path);
    EXPECT_EQ(d.path, want_path);
    EXPECT_EQ(q->placement, want_path == "gpu" ? "vulkan" : "cpu");
    EXPECT_EQ(d.max_tokens, q->decision.max_tokens);
    EXPECT_EQ(d.kv_blocks, q->decision.kv_blocks);
    EXPECT_EQ(d.queue_position, q->decision.queue_position);
    EXPECT_DOUBLE_EQ(d.timing.delay_s, q->decision.timing.delay_s);
    EXPECT_EQ(d.reason, q->decision.reason);
    // Each path's own prediction is listed too.
    ASSERT_EQ(q->paths.size(), 2u);
    EXPECT_EQ(q->paths[0].path, "gpu");
    EXPECT_EQ(q->paths[1].path, "cpu");
    EXPECT_DOUBLE_EQ(q->paths[1].decode_tps, 20.0);
    h.settle();
  };
  check(request(20, 20), DecisionKind::kAdmit, "gpu");      // idle gpu
  check(request(20, 20), DecisionKind::kDelay, "gpu");      // behind it (0.22 s)
  check(request(150, 20), DecisionKind::kRedirect, "cpu");  // 11 blocks > 8
  check(request(100, 500), DecisionKind::kRedirect, "cpu");  // clamped to 156; 16 blocks > 8
  auto clamped = h.gw->quote(request(100, 500));
  ASSERT_TRUE(clamped.ok());
  EXPECT_TRUE(clamped->decision.max_tokens_clamped);
  EXPECT_EQ(clamped->decision.max_tokens, 156);
  check(request(50, 200, /*allow_shrink=*/true), DecisionKind::kShrink, "gpu");
  auto big = h.gw->reserve_cotenant("trainer", 500 * kMiB, 60);
  ASSERT_TRUE(big.ok());
  check(request(20, 20), DecisionKind::kRedirect, "cpu");  // memory pressure
  h.run_to_idle();
}

TEST(GatewayTest, StatusReportsQueuesKvDecisionsAndReservations) {
  Ledgers l = make_ledgers();
  PathSpec gpu;
  gpu.workers = 1;
  gpu.queue_capacity = 4;
  gpu.kv_blocks_total = 8;
  gpu.ledger = l.gpu;
  PathSpec cpu = cpu_spec();
  cpu.ledger = l.host;
  cpu.queue_capacity = 2;
  Harness h({gpu, cpu}, {}, {PathNotBuilt{"hybrid", "no Vulkan device"}});
  ASSERT_NE(h.gw, nullptr);
  EXPECT_TRUE(h.gw->ready());

  auto r = h.submit(request(20, 60));  // 5 blocks, 0.62 s
  auto q1 = h.submit(request(20, 20));
  auto q2 = h.submit(request(20, 20));
  auto red = h.submit(request(150, 20));
  ASSERT_TRUE(r && q1 && q2 && red);
  auto res = h.gw->reserve_cotenant("indexer", 100 * kMiB, 60);
  ASSERT_TRUE(res.ok());
  h.run_for(0.25);

  const GatewayStatus st = h.gw->status();
  EXPECT_TRUE(st.ready);
  ASSERT_EQ(st.paths.size(), 2u);
  const PathStatus& g = st.paths[0];
  EXPECT_EQ(g.name, "gpu");
  EXPECT_EQ(g.placement, "vulkan");
  EXPECT_EQ(g.role, "primary");
  EXPECT_EQ(g.workers, 1);
  EXPECT_EQ(g.running, 1);
  EXPECT_EQ(g.queue_depth, 2);
  EXPECT_EQ(g.queue_capacity, 4);
  EXPECT_NEAR(g.oldest_queued_s, 0.25, 1e-9);
  EXPECT_EQ(g.kv_blocks_total, 8);
  EXPECT_EQ(g.kv_blocks_free, 8 - 5);
  EXPECT_EQ(g.kv_block_tokens, 16);
  EXPECT_EQ(g.n_ctx, 256);
  EXPECT_EQ(st.paths[1].name, "cpu");
  EXPECT_EQ(st.paths[1].role, "fallback");
  EXPECT_EQ(st.paths[1].running, 1);
  EXPECT_EQ(st.paths[1].queue_depth, 0);
  EXPECT_EQ(st.decided(DecisionCounter::kAdmit), 1u);
  EXPECT_EQ(st.decided(DecisionCounter::kDelay), 2u);
  EXPECT_EQ(st.decided(DecisionCounter::kRedirect), 1u);
  EXPECT_EQ(st.decided(DecisionCounter::kReject), 0u);
  ASSERT_EQ(st.reservations.size(), 1u);
  EXPECT_EQ(st.reservations[0].name, "indexer");
  EXPECT_EQ(st.reservations[0].bytes, 100 * kMiB);
  EXPECT_EQ(st.reservations[0].ledger, "vulkan:0");
  EXPECT_NEAR(st.reservations[0].expires_in_s, 60 - 0.25, 1e-9);
  EXPECT_TRUE(st.reservations[0].fits);
  ASSERT_EQ(st.ledgers.size(), 2u);
  EXPECT_EQ(st.ledgers[0].name, "vulkan:0");
  EXPECT_EQ(st.ledgers[0].used, 700 * kMiB);
  ASSERT_EQ(st.not_built.size(), 1u);
  EXPECT_EQ(st.not_built[0].name, "hybrid");

  // Fill the gpu queue (4) and the cpu's (2), then one more: refused with
  // 429 and counted as a reject.
  h.submit(request(20, 20));
  h.submit(request(20, 20));
  ASSERT_EQ(h.sched(0).stats().queue_depth, 4);
  for (int i = 0; i < 3; ++i) h.submit(request(150, 20));  // one runs, two queue
  ASSERT_EQ(h.sched(1).stats().queue_depth, 2);
  Refusal refusal;
  Result<Admitted> refused = h.gw->submit(request(20, 20), &refusal);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().reason(), FailureReason::kQueueFull);
  EXPECT_EQ(refusal.decision.http_status, 429);
  EXPECT_GE(refusal.decision.retry_after_s, 1.0);
  EXPECT_GE(h.gw->status().decided(DecisionCounter::kReject), 1u);
  h.run_to_idle();
}

// Rates start from a deliberately wrong prior and are measured from finished
// requests: prefill from start to the first token (which includes that
// token's 10 ms here, so a long prompt keeps the bias small), decode from the
// first token to the last.
TEST(GatewayTest, MeasuredRatesApproachTheExecutorsSpeeds) {
  PathSpec gpu;
  gpu.speed = speed(500.0, 100.0);
  gpu.prior = PathRates{100.0, 10.0, 1.0, 0, false};
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  EXPECT_FALSE(h.sched(0).rates().measured);
  for (int i = 0; i < 4; ++i) h.submit(request(200, 50));
  h.run_to_idle();
  const PathRates r = h.sched(0).rates();
  EXPECT_TRUE(r.measured);
  EXPECT_EQ(r.samples, 4u);
  std::printf("[ measure  ] measured rates: prefill %.1f tok/s (true 500), decode %.1f tok/s (true 100), share %.2f\n",
              r.prefill_tps, r.decode_tps, r.completion_share);
  EXPECT_NEAR(r.prefill_tps, 500.0, 50.0);
  EXPECT_NEAR(r.decode_tps, 100.0, 10.0);
  EXPECT_NEAR(r.completion_share, 1.0, 1e-9);
  // The status shows the same; the idle cpu path still has its prior.
  const GatewayStatus st = h.gw->status();
  EXPECT_DOUBLE_EQ(st.paths[0].rates.decode_tps, r.decode_tps);
  EXPECT_FALSE(st.paths[1].rates.measured);
}

// Explicit test fault injection: a scripted failure ends the next run before
// its first token, at once, with that Status; the blocks come back and the
// path serves the next request normally.
TEST(GatewayTest, InjectedFaultFailsTheNextRunBeforeItsFirstToken) {
  Harness h({PathSpec{}});
  ASSERT_NE(h.gw, nullptr);
  h.faults[0]->fail_next(Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost));
  const int64_t t0 = h.env.now_ns();
  auto failed = h.submit(request(20, 20));
  ASSERT_NE(failed, nullptr);
  Collected c = collect(*failed, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kFailed);
  EXPECT_EQ(c.fin.status.code(), StatusCode::kDeviceLost);
  EXPECT_EQ(c.fin.status.reason(), FailureReason::kDeviceLost);
  EXPECT_EQ(c.fin.completion_tokens, 0);
  EXPECT_TRUE(c.text.empty());
  EXPECT_EQ(h.env.now_ns(), t0);  // no simulated time passed
  EXPECT_EQ(h.faults[0]->pending(), 0u);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64);
  auto ok = h.submit(request(20, 20));
  ASSERT_NE(ok, nullptr);
  h.run_to_idle();
  EXPECT_EQ(collect(*ok, kRealTimeout).fin.state, RequestState::kDone);
  EXPECT_EQ(h.faults[0]->runs(), 2);
  EXPECT_EQ(h.sched(0).stats().failed, 1u);
}

// Real threads: 4 submitters x 25 requests (some long, redirected to the cpu;
// every fifth cancelled; quotes and status in between) while a driver thread
// moves the clock. Every accepted ticket ends, and each path's KV gate has
// its whole budget back. Bounded in real time; meant for TSan.
TEST(GatewayTest, ConcurrentSubmittersAllFinishAndTheKvGateIsWhole) {
  PathSpec gpu;
  gpu.kv_blocks_total = 12;  // 192 positions: a 200-token prompt goes to the cpu
  gpu.queue_capacity = 8;
  PathSpec cpu = cpu_spec();
  cpu.kv_blocks_total = 48;
  cpu.queue_capacity = 8;
  Harness h({gpu, cpu});
  ASSERT_NE(h.gw, nullptr);
  // Warm the prompt cache on this thread (the helper is shared).
  for (int n : {10, 30, 200}) prompt_of(n);

  std::atomic<bool> stop{false};
  std::thread driver([&] {
    while (!stop.load()) {
      if (!h.env.advance_to_next()) std::this_thread::sleep_for(20us);
    }
  });
  std::mutex mu;
  std::vector<std::shared_ptr<Ticket>> accepted;
  std::atomic<int> refused{0};
  std::vector<std::thread> submitters;
  for (int s = 0; s < 4; ++s) {
    submitters.emplace_back([&, s] {
      for (int i = 0; i < 25; ++i) {
        const int32_t prompt = (i % 7 == 3) ? 200 : (i % 2 ? 10 : 30);
        RouteRequest r = request(prompt, 8 + (i + s) % 17);
        if (i % 10 == 0) (void)h.gw->quote(r);
        if (i % 12 == 0) (void)h.gw->status();
        Result<Admitted> a = h.gw->submit(r);
        if (!a.ok()) {
          EXPECT_EQ(a.status().reason(), FailureReason::kQueueFull) << a.status().to_string();
          refused.fetch_add(1);
          std::this_thread::sleep_for(200us);
          continue;
        }
        if (i % 5 == 4) h.gw->cancel(a->ticket->id());
        std::lock_guard<std::mutex> lock(mu);
        accepted.push_back(a->ticket);
      }
    });
  }
  for (auto& t : submitters) t.join();
  const auto until = std::chrono::steady_clock::now() + 20s;
  auto all_done = [&] {
    for (auto& t : accepted) {
      if (!serve::is_terminal(t->state())) return false;
    }
    return true;
  };
  while (!all_done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  stop.store(true);
  driver.join();
  ASSERT_TRUE(all_done()) << "some accepted requests never finished";
  EXPECT_GT(accepted.size(), 20u);
  std::printf("[ measure  ] concurrent: %zu accepted, %d refused (queue full)\n", accepted.size(), refused.load());
  uint64_t done = 0, cancelled = 0;
  for (auto& t : accepted) {
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.n_finished, 1);
    EXPECT_TRUE(c.fin.state == RequestState::kDone || c.fin.state == RequestState::kCancelled)
        << serve::request_state_name(c.fin.state);
    if (c.fin.state == RequestState::kDone) {
      ++done;
      EXPECT_EQ(c.text, fake_text(t->limits().max_tokens));
    } else {
      ++cancelled;
    }
  }
  EXPECT_EQ(done + cancelled, accepted.size());
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 12);
  EXPECT_EQ(h.sched(1).load().kv_blocks_free, 48);
  uint64_t submitted = 0;
  for (size_t i = 0; i < 2; ++i) {
    const serve::SchedulerStats st = h.sched(i).stats();
    submitted += st.submitted;
    EXPECT_EQ(st.done + st.cancelled + st.failed, st.submitted);
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.queue_depth, 0);
  }
  EXPECT_EQ(submitted, accepted.size());
  EXPECT_EQ(h.gw->in_flight(), 0);
}


// ---- Circuit breaker in the request path (gateway/breaker.h) ----

Status injected_device_loss() {
  return Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost);
}
// A device fault the breaker counts (a lost device trips it at once).
Status injected_timeout() {
  return Status(StatusCode::kDeadlineExceeded, "injected fence timeout", FailureReason::kTimeout);
}

// The breaker probe's simulated durations on the fake paths: the probe
// prompt's prefill plus 8 tokens, as FakeExecutor spends them.
struct ProbeTimes {
  int64_t gpu_ns = 0;  // PathSpec{} speeds: 1000 prompt tokens/s, 100 tokens/s
  int64_t cpu_ns = 0;  // cpu_spec() speeds: 200 and 20
};
ProbeTimes probe_times() {
  using serve::testing::FakeExecutor;
  const double p = count_tokens("Once upon a time");
  ProbeTimes t;
  t.gpu_ns = FakeExecutor::ns_for(p, 1000.0) + 8 * FakeExecutor::ns_for(1.0, 100.0);
  t.cpu_ns = FakeExecutor::ns_for(p, 200.0) + 8 * FakeExecutor::ns_for(1.0, 20.0);
  return t;
}

// Three scripted device timeouts on the GPU path trip its breaker (the
// consecutive rule; a device loss would trip it at once); returns the instant
// of the trip. Each request fails before its first token, so with a CPU path
// it fails over there under the same ticket (queued, run when the test
// advances the clock; kept in `moved`); without one it fails.
int64_t trip_gpu(Harness& h, std::vector<std::shared_ptr<Ticket>>* moved = nullptr) {
  for (int i = 0; i < 3; ++i) {
    h.faults[0]->fail_next(injected_timeout());
    auto t = h.submit(request(20, 10));
    EXPECT_NE(t, nullptr);
    if (!t) return 0;
    h.settle();  // the GPU worker fails it at once (no simulated time passes)
    if (moved) {
      EXPECT_EQ(t->path(), "cpu");
      EXPECT_EQ(t->attempts(), 1);
      EXPECT_TRUE(t->decision().reason.starts_with("failover from gpu after timeout before the first token"))
          << t->decision().reason;
      moved->push_back(t);
    } else {
      Collected c = collect(*t, kRealTimeout);
      EXPECT_EQ(c.fin.state, RequestState::kFailed);
      EXPECT_EQ(c.fin.status.reason(), FailureReason::kTimeout);
    }
  }
  // The GPU worker tells the breaker after the request has moved (the
  // scheduler's on_failover), so settle() can see the system quiescent just
  // before the last fault is counted: wait for the count (real time, bounded).
  const auto until = std::chrono::steady_clock::now() + kRealTimeout;
  while (h.breakers.at("vulkan:0")->snapshot().faults < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return h.env.now_ns();
}

// What failed over ran on the CPU path to the end: the whole text, once.
void expect_finished_on_cpu(const std::vector<std::shared_ptr<Ticket>>& moved) {
  for (const auto& t : moved) {
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.fin.state, RequestState::kDone) << c.fin.status.to_string();
    EXPECT_EQ(c.text, fake_text(10));
    EXPECT_EQ(c.n_finished, 1);
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- Failover before the first token ----

// A device loss before the first token: the request runs on the CPU path
// under the same ticket, id and stream, with nothing repeated; the GPU path
// gets its KV blocks back, the breaker counts the fault (and stays closed
// after one), and the next request is admitted on the GPU again.
TEST(GatewayFailoverTest, ADeviceLossBeforeTheFirstTokenRunsTheRequestOnTheCpuPath) {
  PathSpec gpu;
  gpu.breaker_group = "vulkan:0";
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  CircuitBreaker& b = *h.breakers.at("vulkan:0");

  h.faults[0]->fail_next(injected_device_loss());
  auto t = h.submit(request(20, 10));
  ASSERT_NE(t, nullptr);
  const uint64_t id = t->id();
  h.settle();
  EXPECT_EQ(t->path(), "cpu");
  EXPECT_EQ(t->attempts(), 1);
  EXPECT_EQ(t->state(), RequestState::kRunning) << "a CPU worker took it; it runs on the simulated clock";
  const admission::Decision d = t->decision();
  EXPECT_EQ(d.path, "cpu");
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_TRUE(d.degraded());
  EXPECT_TRUE(contains(d.reason, "gpu: out of service (failed this request before its first token (device_lost))"))
      << d.reason;
  EXPECT_EQ(h.gw->find(id), t) << "same ticket under the same id";
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64) << "the GPU path's blocks came back at once";
  EXPECT_EQ(h.sched(0).stats().failed_over, 1u);
  EXPECT_EQ(h.sched(0).stats().failed, 0u);
  EXPECT_EQ(h.sched(1).stats().adopted, 1u);
  // A lost device stays lost until re-initialised: the one loss opened the
  // breaker, so the next request is not sent there to fail over again.
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_EQ(b.snapshot().recent_trips.back().reason, "device lost");

  h.run_to_idle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kDone);
  EXPECT_EQ(c.text, fake_text(10)) << "every token once, none before the move";
  EXPECT_EQ(c.n_finished, 1);
  EXPECT_EQ(h.faults[0]->runs(), 1);
  EXPECT_EQ(h.faults[1]->runs(), 1);
  EXPECT_EQ(h.gw->status().decided(DecisionCounter::kFailover), 1u);

  auto next = h.submit(request(20, 10));
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->path(), "cpu");
  EXPECT_TRUE(contains(next->decision().reason, "gpu_unavailable")) << next->decision().reason;
  h.run_to_idle();
  EXPECT_EQ(collect(*next, kRealTimeout).fin.state, RequestState::kDone);
  EXPECT_EQ(h.faults[0]->runs(), 1) << "nothing more was sent to the lost device";
}

// No failover where it cannot help or would repeat: a cancelled request and a
// client error stay where they are, and with the CPU path's queue full the
// device loss is the request's answer.
TEST(GatewayFailoverTest, WithNoRoomElsewhereTheDeviceLossIsTheAnswer) {
  PathSpec gpu;
  PathSpec cpu = cpu_spec();
  cpu.workers = 1;
  cpu.queue_capacity = 1;
  Harness h({gpu, cpu});
  ASSERT_NE(h.gw, nullptr);
  // Fill the CPU path: one running, one queued (the GPU path is preferred, so
  // submit straight to the CPU scheduler).
  std::vector<std::shared_ptr<Ticket>> busy;
  for (int i = 0; i < 2; ++i) {
    serve::GenerationRequest g;
    g.prompt = "Once upon a time";
    g.max_tokens = 50;
    auto r = h.sched(1).submit(g);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    busy.push_back(*r);
    h.settle();
  }
  h.faults[0]->fail_next(injected_device_loss());
  auto t = h.submit(request(20, 10));
  ASSERT_NE(t, nullptr);
  h.settle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kFailed);
  EXPECT_EQ(c.fin.status.reason(), FailureReason::kDeviceLost);
  EXPECT_EQ(t->path(), "gpu");
  EXPECT_EQ(t->attempts(), 0);
  EXPECT_EQ(h.sched(0).stats().failed, 1u);
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64);

  // A client error is not a device fault: no failover either.
  h.faults[0]->fail_next(invalid_field("prompt", "scripted client error"));
  auto e = h.submit(request(20, 10));
  ASSERT_NE(e, nullptr);
  h.settle();
  EXPECT_EQ(collect(*e, kRealTimeout).fin.status.reason(), FailureReason::kInvalidField);
  EXPECT_EQ(h.sched(0).stats().failed_over, 0u);
  h.run_to_idle();
  for (auto& r : busy) EXPECT_EQ(collect(*r, kRealTimeout).fin.state, RequestState::kDone);
}

TEST(GatewayBreakerTest, DeviceFaultsOpenTheBreakerTheCpuPathServesAndProbesCloseIt) {
  PathSpec gpu;
  gpu.breaker_group = "vulkan:0";
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  CircuitBreaker& b = *h.breakers.at("vulkan:0");
  const ProbeTimes pt = probe_times();

  std::vector<std::shared_ptr<Ticket>> moved;
  const int64_t t_trip = trip_gpu(h, &moved);
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_TRUE(h.gw->ready()) << "the CPU path can serve";
  EXPECT_EQ(h.gw->status().decided(DecisionCounter::kFailover), 3u);
  // The next requests go to the CPU path, with the breaker's reason.
  auto redirected = h.submit(request(20, 10));
  ASSERT_NE(redirected, nullptr);
  EXPECT_EQ(redirected->path(), "cpu");
  EXPECT_EQ(redirected->decision().kind, DecisionKind::kRedirect);
  EXPECT_TRUE(contains(redirected->decision().reason,
                       "gpu: out of service (gpu_unavailable: circuit breaker open since 0.0 s ago after 3 "
                       "consecutive device faults (timeout: injected fence timeout); next probe in 5.0 s)"))
      << redirected->decision().reason;
  auto q = h.gw->quote(request(20, 10));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->decision.path, "cpu");
  EXPECT_TRUE(contains(q->decision.reason, "gpu_unavailable")) << q->decision.reason;
  GatewayStatus st = h.gw->status();
  ASSERT_TRUE(st.paths[0].breaker.has_value());
  EXPECT_EQ(st.paths[0].breaker->state, BreakerState::kOpen);
  EXPECT_EQ(st.paths[0].breaker->trips, 1u);
  EXPECT_EQ(st.paths[0].breaker->next_probe_ns, t_trip + ns(5));
  EXPECT_EQ(st.paths[0].breaker->recent_trips.back().failure, "timeout");
  EXPECT_FALSE(st.paths[1].breaker.has_value());
  EXPECT_TRUE(st.ready);
  h.run_to_idle();
  EXPECT_EQ(collect(*redirected, kRealTimeout).fin.state, RequestState::kDone);
  expect_finished_on_cpu(moved);

  // Nothing touches the GPU before the cooldown ends ...
  h.run_until(t_trip + ns(5) - 1);
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_EQ(h.faults[0]->runs(), 3);
  // ... then the prober runs probe 1 on the GPU path and the reference on
  // the CPU path (same model: the texts must agree).
  h.run_until(t_trip + ns(5));
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_EQ(h.faults[0]->runs(), 4);
  EXPECT_EQ(h.faults[1]->runs(), 5);  // 3 failovers, the redirected request, the reference
  // Half-open still keeps clients off the GPU.
  auto during = h.submit(request(20, 10));
  ASSERT_NE(during, nullptr);
  EXPECT_EQ(during->path(), "cpu");
  EXPECT_TRUE(contains(during->decision().reason, "circuit breaker half-open (probing)")) << during->decision().reason;
  // Probe 1 is judged when the reference is done too; probe 2 (reference
  // cached) closes it.
  const int64_t t_closed = t_trip + ns(5) + pt.cpu_ns + pt.gpu_ns;
  h.run_until(t_closed - 1);
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  EXPECT_EQ(b.snapshot().probes_passed, 1);
  EXPECT_EQ(h.faults[0]->runs(), 5);
  h.run_until(t_closed);
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  EXPECT_EQ(b.snapshot().since_ns, t_closed);
  EXPECT_EQ(b.snapshot().probes_run, 2u);
  EXPECT_EQ(h.faults[0]->runs(), 5);
  EXPECT_EQ(h.faults[1]->runs(), 6);  // + `during`
  // Probes are not client requests: no decision was counted for them.
  EXPECT_EQ(h.gw->status().decided(DecisionCounter::kRedirect), 2u);
  // New requests are admitted on the GPU again.
  auto back = h.submit(request(20, 10));
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->path(), "gpu");
  EXPECT_EQ(back->decision().kind, DecisionKind::kAdmit);
  h.run_to_idle();
  EXPECT_EQ(collect(*back, kRealTimeout).fin.state, RequestState::kDone);
  const std::vector<std::string> log = h.logged();
  ASSERT_GE(log.size(), 4u);
  EXPECT_TRUE(contains(log.front(), "circuit breaker vulkan:0: open after 3 consecutive device faults")) << log.front();
  EXPECT_TRUE(contains(log[log.size() - 2], "probe passed (text equals the cpu path's)")) << log[log.size() - 2];
  EXPECT_TRUE(contains(log.back(), "circuit breaker vulkan:0: closed")) << log.back();
}

TEST(GatewayBreakerTest, AFailedProbeKeepsItOpenWithALongerCooldown) {
  PathSpec gpu;
  gpu.breaker_group = "vulkan:0";
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  CircuitBreaker& b = *h.breakers.at("vulkan:0");
  const ProbeTimes pt = probe_times();
  std::vector<std::shared_ptr<Ticket>> moved;
  const int64_t t_trip = trip_gpu(h, &moved);
  ASSERT_EQ(b.state(), BreakerState::kOpen);

  // The device is still sick when the first probe runs: it fails at once,
  // without waiting for the CPU path's reference run.
  h.faults[0]->fail_next(injected_device_loss());
  h.run_until(t_trip + ns(5));
  BreakerSnapshot s = b.snapshot();
  EXPECT_EQ(s.state, BreakerState::kOpen);
  EXPECT_EQ(s.trips, 2u);
  EXPECT_DOUBLE_EQ(s.cooldown_s, 10);
  EXPECT_EQ(s.since_ns, t_trip + ns(5));
  EXPECT_EQ(s.next_probe_ns, t_trip + ns(15));
  EXPECT_EQ(s.recent_trips.back().reason, "probe 1 of 2 failed");
  EXPECT_EQ(s.recent_trips.back().failure, "device_lost");
  EXPECT_EQ(h.faults[0]->runs(), 4);
  auto r = h.submit(request(20, 10));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->path(), "cpu");
  EXPECT_TRUE(contains(r->decision().reason, "after probe 1 of 2 failed (device_lost: injected device loss); next "
                                             "probe in 10.0 s"))
      << r->decision().reason;

  // The reference finished meanwhile and is kept: at the next probe time
  // only the GPU runs, two probes back to back.
  h.run_until(t_trip + ns(15) - 1);
  EXPECT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_EQ(h.faults[0]->runs(), 4);
  const int64_t t_closed = t_trip + ns(15) + 2 * pt.gpu_ns;
  h.run_until(t_closed - 1);
  EXPECT_EQ(b.state(), BreakerState::kHalfOpen);
  h.run_until(t_closed);
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  EXPECT_EQ(h.faults[0]->runs(), 6);
  EXPECT_EQ(h.faults[1]->runs(), 5);  // 3 failovers, the reference (once), the redirected request
  expect_finished_on_cpu(moved);
  EXPECT_GE(pt.cpu_ns, pt.gpu_ns);
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  h.run_to_idle();
}

// With no other path, an open breaker refuses with 503 no_path and the
// breaker's reason; /health/ready is false; probes judge success alone.
TEST(GatewayBreakerTest, WithoutACpuPathAnOpenBreakerRefusesAndProbesCountSuccessAlone) {
  PathSpec gpu;
  gpu.breaker_group = "vulkan:0";
  Harness h({gpu});
  ASSERT_NE(h.gw, nullptr);
  CircuitBreaker& b = *h.breakers.at("vulkan:0");
  const int64_t t_trip = trip_gpu(h);
  ASSERT_EQ(b.state(), BreakerState::kOpen);
  EXPECT_FALSE(h.gw->ready());
  Refusal refusal;
  Result<Admitted> a = h.gw->submit(request(20, 10), &refusal);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(a.status().reason(), FailureReason::kNoPath);
  EXPECT_TRUE(contains(a.status().message(), "gpu_unavailable: circuit breaker open")) << a.status().message();
  EXPECT_EQ(refusal.decision.http_status, 503);
  EXPECT_FALSE(classify(a.status()).device_fault) << "a refusal never feeds the breaker";

  h.run_until(t_trip + ns(5) + 2 * probe_times().gpu_ns);
  EXPECT_EQ(b.state(), BreakerState::kClosed);
  EXPECT_TRUE(h.gw->ready());
  const std::vector<std::string> log = h.logged();
  ASSERT_GE(log.size(), 2u);
  EXPECT_TRUE(contains(log[log.size() - 2], "probe passed (text not compared: no CPU path)")) << log[log.size() - 2];
  EXPECT_EQ(h.submit(request(20, 10))->path(), "gpu");
  h.run_to_idle();
}


// ---- Migration after tokens were streamed, resumable errors, resume ----

// A request that has journaled checkpoints (record_id != 0 enables them).
RouteRequest journaled(int32_t prompt_tokens, int32_t max_tokens) {
  RouteRequest r = request(prompt_tokens, max_tokens);
  r.generation.record_id = 1;
  return r;
}

TEST(GatewayMigrationTest, ADeviceLossMidStreamContinuesOnTheCpuPathFromTheCheckpoint) {
  PathSpec gpu;
  gpu.breaker_group = "vulkan:0";
  Harness h({gpu, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  EXPECT_FALSE(h.gw->migration_allowed(0, 1).ok()) << "not before the equivalence check";
  const std::vector<EquivalenceInfo> eq = h.verify();
  ASSERT_EQ(eq.size(), 1u);
  EXPECT_TRUE(eq[0].passed) << eq[0].detail;
  EXPECT_EQ(eq[0].fingerprint, "fake-model");
  EXPECT_TRUE(h.gw->migration_allowed(0, 1).ok());
  EXPECT_TRUE(h.gw->migration_allowed(1, 0).ok());
  EXPECT_EQ(h.gw->status().equivalence.size(), 1u);
  const int64_t gpu_runs = h.faults[0]->runs();
  const int64_t cpu_runs = h.faults[1]->runs();

  h.faults[0]->fail_after(7, injected_device_loss());
  auto t = h.submit(request(20, 30));
  ASSERT_NE(t, nullptr);
  h.run_to_idle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kDone) << c.fin.status.to_string();
  EXPECT_EQ(c.text, fake_text(30)) << "every token exactly once across the move";
  EXPECT_EQ(c.fin.completion_tokens, 30);
  EXPECT_EQ(c.n_finished, 1);
  EXPECT_EQ(t->path(), "cpu");
  EXPECT_EQ(t->migrations(), 1);
  EXPECT_EQ(t->attempts(), 1);
  EXPECT_TRUE(contains(t->decision().reason, "migrated from gpu after device_lost at token 7")) << t->decision().reason;
  EXPECT_EQ(t->limits().max_tokens, 30) << "the limits count the whole generation";
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64) << "the GPU path's blocks came back";
  EXPECT_EQ(h.sched(0).stats().failed_over, 1u);
  EXPECT_EQ(h.sched(0).stats().failed, 0u);
  EXPECT_EQ(h.sched(1).stats().adopted, 1u);
  EXPECT_EQ(h.faults[0]->runs() - gpu_runs, 1);
  EXPECT_EQ(h.faults[1]->runs() - cpu_runs, 1);
  EXPECT_EQ(h.gw->status().decided(DecisionCounter::kMigrate), 1u);
  EXPECT_EQ(h.breakers.at("vulkan:0")->snapshot().faults, 1u) << "the fault reached the breaker";
  EXPECT_EQ(h.breakers.at("vulkan:0")->state(), BreakerState::kOpen) << "a device loss trips it at once";
}

TEST(GatewayMigrationTest, AFailedEquivalenceCheckForbidsMigration) {
  PathSpec cpu = cpu_spec();
  cpu.speed.stop_after = 5;  // its text ends early: not the GPU path's
  Harness h({PathSpec{}, cpu});
  ASSERT_NE(h.gw, nullptr);
  const std::vector<EquivalenceInfo> eq = h.verify();
  ASSERT_EQ(eq.size(), 1u);
  EXPECT_FALSE(eq[0].passed);
  EXPECT_TRUE(contains(eq[0].detail, "texts differ")) << eq[0].detail;
  const Status why = h.gw->migration_allowed(0, 1);
  EXPECT_TRUE(contains(why.message(), "equivalence check with gpu failed")) << why.message();
  h.faults[0]->fail_after(3, injected_device_loss());
  auto t = h.submit(request(20, 10));
  ASSERT_NE(t, nullptr);
  h.run_to_idle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.status.reason(), FailureReason::kResumable) << c.fin.status.to_string();
  EXPECT_EQ(c.text, fake_text(3));
}

// Two paths of one model and placement whose CPU kernel variants differ
// round differently: they are checked like two placements, and a request
// moves between them only once the check passed. Equal variants need none.
TEST(GatewayMigrationTest, PathsOfDifferentKernelVariantsNeedTheEquivalenceCheck) {
  PathSpec a = cpu_spec(), b = cpu_spec();
  a.name = "cpu-v3";
  a.role = PathRole::kPrimary;
  a.cpu_kernels = "x86-64-v3";
  b.name = "cpu-v2";
  b.cpu_kernels = "x86-64-v2";
  Harness h({a, b});
  ASSERT_NE(h.gw, nullptr);
  const Status why = h.gw->migration_allowed(0, 1);
  EXPECT_TRUE(contains(why.message(), "equivalence with cpu-v3 not verified")) << why.message();
  const std::vector<EquivalenceInfo> eq = h.verify();
  ASSERT_EQ(eq.size(), 1u);
  EXPECT_EQ(eq[0].placement_a, "cpu/x86-64-v3");
  EXPECT_EQ(eq[0].placement_b, "cpu/x86-64-v2");
  EXPECT_TRUE(eq[0].passed) << eq[0].detail;
  EXPECT_TRUE(h.gw->migration_allowed(0, 1).ok());
  EXPECT_EQ(h.gw->status().paths[1].cpu_kernels, "x86-64-v2");

  b.cpu_kernels = "x86-64-v3";
  Harness same({a, b});
  ASSERT_NE(same.gw, nullptr);
  EXPECT_TRUE(same.gw->migration_allowed(0, 1).ok()) << "one placement and variant: bitwise by contract";
  EXPECT_TRUE(same.verify().empty()) << "nothing to check";
}

// Without a verified pair the stream ends with a resumable error that keeps
// the checkpoint; resume() continues it after whatever text the client has.
TEST(GatewayMigrationTest, WithoutVerifiedEquivalenceTheStreamEndsResumableAndResumeCompletesIt) {
  Harness h({PathSpec{}, cpu_spec()});
  ASSERT_NE(h.gw, nullptr);
  const Status why = h.gw->migration_allowed(0, 1);
  EXPECT_TRUE(contains(why.message(), "equivalence with gpu not verified")) << why.message();

  h.faults[0]->fail_after(5, injected_device_loss());
  auto t = h.submit(request(20, 30));
  ASSERT_NE(t, nullptr);
  h.run_to_idle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kFailed);
  EXPECT_EQ(c.fin.status.reason(), FailureReason::kResumable);
  EXPECT_TRUE(classify(c.fin.status).resumable);
  EXPECT_FALSE(classify(c.fin.status).device_fault) << "the device fault was counted where it happened";
  EXPECT_TRUE(contains(c.fin.status.message(), "after 5 tokens")) << c.fin.status.message();
  EXPECT_TRUE(contains(c.fin.status.message(), "not verified")) << c.fin.status.message();
  EXPECT_EQ(c.text, fake_text(5));
  EXPECT_EQ(c.fin.completion_tokens, 5);
  std::shared_ptr<const Checkpoint> cp = t->checkpoint();
  ASSERT_NE(cp, nullptr);
  EXPECT_EQ(cp->n_generated, 5);
  EXPECT_EQ(cp->text, fake_text(5));
  EXPECT_EQ(cp->model_fingerprint, "fake-model");
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64);

  // The client got only part of the stream: the rest of the checkpoint's
  // text comes first, then the continuation.
  ResumeRequest rr;
  rr.checkpoint = cp;
  rr.received_text = fake_text(2);
  Result<Resumed> r = h.gw->resume(rr);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->unsent, fake_text(5).substr(fake_text(2).size()));
  EXPECT_EQ(r->admitted.ticket->path(), "gpu") << "any path serving the model; the GPU path has no breaker here";
  EXPECT_TRUE(contains(r->admitted.ticket->decision().reason, "resumed at token 5"));
  h.run_to_idle();
  Collected rc = collect(*r->admitted.ticket, kRealTimeout);
  EXPECT_EQ(rc.fin.state, RequestState::kDone) << rc.fin.status.to_string();
  EXPECT_EQ(fake_text(2) + r->unsent + rc.text, fake_text(30));
  EXPECT_EQ(rc.fin.completion_tokens, 30);
  EXPECT_EQ(r->admitted.ticket->text(), fake_text(30)) << "the whole generation, for the journal";

  // The client has more than the checkpoint: regenerated silently, compared.
  rr.received_text = fake_text(8);
  Result<Resumed> more = h.gw->resume(rr);
  ASSERT_TRUE(more.ok()) << more.status().to_string();
  EXPECT_EQ(more->unsent, "");
  h.run_to_idle();
  Collected mc = collect(*more->admitted.ticket, kRealTimeout);
  EXPECT_EQ(mc.fin.state, RequestState::kDone) << mc.fin.status.to_string();
  EXPECT_EQ(fake_text(8) + mc.text, fake_text(30));

  // Text that disagrees with the checkpoint, before or after it.
  rr.received_text = "t0 t9 ";
  Result<Resumed> bad = h.gw->resume(rr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().reason(), FailureReason::kReplayMismatch);
  EXPECT_TRUE(contains(bad.status().message(), "at byte 4")) << bad.status().message();
  rr.received_text = fake_text(5) + "t7 ";
  Result<Resumed> late = h.gw->resume(rr);
  ASSERT_TRUE(late.ok()) << "beyond the checkpoint only the run can tell";
  h.run_to_idle();
  Collected lc = collect(*late->admitted.ticket, kRealTimeout);
  EXPECT_EQ(lc.fin.state, RequestState::kFailed);
  EXPECT_EQ(lc.fin.status.reason(), FailureReason::kReplayMismatch);
  EXPECT_EQ(lc.text, "") << "nothing of a diverging run reaches the client";

  // A checkpoint of a model no path serves.
  auto other = std::make_shared<Checkpoint>(*cp);
  other->model_fingerprint = "another-model";
  rr.checkpoint = other;
  rr.received_text = "";
  Refusal refusal;
  Result<Resumed> none = h.gw->resume(rr, &refusal);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().reason(), FailureReason::kNoPath);
  EXPECT_TRUE(contains(none.status().message(), "serves another model")) << none.status().message();
  h.run_to_idle();
  EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64);
}

TEST(GatewayMigrationTest, AClientThatSaysNeverAndAFallbackModelGetResumableErrors) {
  {
    PathSpec gpu;
    gpu.breaker_group = "vulkan:0";
    Harness h({gpu, cpu_spec()});
    ASSERT_NE(h.gw, nullptr);
    h.verify();
    h.faults[0]->fail_after(4, injected_device_loss());
    RouteRequest r = request(20, 12);
    r.allow_migration = false;
    auto t = h.submit(r);
    ASSERT_NE(t, nullptr);
    h.run_to_idle();
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.fin.status.reason(), FailureReason::kResumable);
    EXPECT_TRUE(contains(c.fin.status.message(), "X-Spillway-Migrate: never")) << c.fin.status.message();
    EXPECT_EQ(c.text, fake_text(4));
    EXPECT_EQ(c.fin.cause.reason(), FailureReason::kDeviceLost);
    EXPECT_EQ(h.sched(1).stats().adopted, 0u);
    EXPECT_EQ(h.breakers.at("vulkan:0")->snapshot().faults, 1u)
        << "the device fault behind the resumable error reached the breaker";
  }
  {
    PathSpec cpu = cpu_spec();
    cpu.fingerprint = "fake-fallback-model";  // --fallback-model: same tokenizer, another model
    Harness h({PathSpec{}, cpu});
    ASSERT_NE(h.gw, nullptr);
    EXPECT_TRUE(h.verify().empty()) << "different models are never compared";
    h.faults[0]->fail_after(4, injected_device_loss());
    auto t = h.submit(request(20, 12));
    ASSERT_NE(t, nullptr);
    h.run_to_idle();
    Collected c = collect(*t, kRealTimeout);
    EXPECT_EQ(c.fin.status.reason(), FailureReason::kResumable);
    EXPECT_TRUE(contains(c.fin.status.message(), "serves another model")) << c.fin.status.message();
    // A failure before the first token still goes to the fallback model
    // (nothing was streamed, so nothing is spliced).
    h.faults[0]->fail_next(injected_device_loss());
    auto f = h.submit(request(20, 12));
    ASSERT_NE(f, nullptr);
    h.run_to_idle();
    EXPECT_EQ(collect(*f, kRealTimeout).fin.state, RequestState::kDone);
    EXPECT_EQ(f->path(), "cpu");
  }
}

// Safe points: inside "t3 " ... "t6 " no checkpoint may be taken, so a fault
// there continues from the last safe one, regenerating (not re-sending) the
// tokens streamed since.
TEST(GatewayMigrationTest, AnUnsafeBoundaryContinuesFromTheLastSafeCheckpoint) {
  SafePointRules rules;
  rules.spans.push_back({"t3 ", "t6 "});
  PathSpec gpu;
  gpu.safe_points = rules;
  gpu.checkpoint_every = 1;
  PathSpec cpu = cpu_spec();
  cpu.safe_points = rules;
  cpu.checkpoint_every = 1;
  Harness h({gpu, cpu});
  ASSERT_NE(h.gw, nullptr);
  h.verify();

  Checkpoint inside;
  inside.text = fake_text(5);
  inside.n_generated = 5;
  const Status unsafe = check_safe_point(inside, rules);
  EXPECT_EQ(unsafe.reason(), FailureReason::kNotSafePoint);
  EXPECT_TRUE(contains(unsafe.message(), "inside \"t3 \"")) << unsafe.message();
  inside.text = fake_text(7);
  EXPECT_TRUE(check_safe_point(inside, rules).ok());

  // With checkpoints every token (a journaled request): from token 3.
  // Tokens 3 and 4 are replayed, and so are their log-probability entries:
  // not sent again.
  h.faults[0]->fail_after(5, injected_device_loss());
  RouteRequest jr = journaled(20, 20);
  jr.generation.logprobs = 1;
  auto t = h.submit(jr);
  ASSERT_NE(t, nullptr);
  h.run_to_idle();
  Collected c = collect(*t, kRealTimeout);
  EXPECT_EQ(c.fin.state, RequestState::kDone) << c.fin.status.to_string();
  EXPECT_EQ(c.text, fake_text(20));
  EXPECT_TRUE(contains(t->decision().reason, "at token 3")) << t->decision().reason;
  ASSERT_EQ(c.logprobs.size(), 20u);
  for (int32_t k = 0; k < 20; ++k) EXPECT_EQ(c.logprobs[static_cast<size_t>(k)].index, k);

  // Without periodic checkpoints: from the start, all 5 tokens regenerated.
  h.faults[0]->fail_after(5, injected_device_loss());
  auto u = h.submit(request(20, 20));
  ASSERT_NE(u, nullptr);
  h.run_to_idle();
  Collected uc = collect(*u, kRealTimeout);
  EXPECT_EQ(uc.fin.state, RequestState::kDone) << uc.fin.status.to_string();
  EXPECT_EQ(uc.text, fake_text(20));
  EXPECT_TRUE(contains(u->decision().reason, "at token 0")) << u->decision().reason;
}

// Property: whatever faults hit the paths, before or during generation, once
// or twice, with or without permission to migrate, every accepted request
// ends with exactly its tokens, each once, either streamed in one go or
// streamed up to a resumable error and completed by resume(); and no path
// keeps a KV block.
TEST(GatewayMigrationPropertyTest, RandomFaultSequencesNeverLoseSkipOrRepeatAToken) {
  int resumed = 0, migrated = 0, restarted = 0;
  // SPW_SEED_ONLY=N runs one sequence (to reproduce a failure).
  const char* only = std::getenv("SPW_SEED_ONLY");
  const uint64_t first = only ? std::strtoull(only, nullptr, 10) : 1;
  const uint64_t last = only ? first : 12;
  for (uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    PathSpec gpu;
    gpu.breaker_group = "vulkan:0";
    gpu.workers = 2;
    Harness h({gpu, cpu_spec()});
    ASSERT_NE(h.gw, nullptr);
    h.verify();
    for (int i = 0; i < 6; ++i) {
      const int32_t max_tokens = uniform(3, 30);
      const int kind = uniform(0, 4);
      // Every kind of device fault the backends report (classify: device_fault).
      auto any_fault = [&] {
        switch (uniform(0, 3)) {
          case 0: return injected_device_loss();
          case 1: return Status(StatusCode::kResourceExhausted, "injected allocation failure",
                                FailureReason::kDeviceOutOfMemory);
          case 2: return Status(StatusCode::kDeadlineExceeded, "injected fence timeout", FailureReason::kTimeout);
          default: return Status(StatusCode::kUnavailable, "injected unhealthy device", FailureReason::kUnhealthy);
        }
      };
      auto fault_on = [&](size_t path) {
        if (uniform(0, 1) == 0) h.faults[path]->fail_next(any_fault());
        else h.faults[path]->fail_after(uniform(1, max_tokens), any_fault());
      };
      if (kind >= 1) fault_on(0);
      if (kind >= 3) fault_on(1);  // and the path it moves to
      RouteRequest r = request(uniform(5, 40), max_tokens);
      r.allow_migration = uniform(0, 3) != 0;
      r.generation.logprobs = 1;  // each token's entry reaches the stream once, across moves too
      Refusal refusal;
      Result<Admitted> a = h.gw->submit(r, &refusal);
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      std::shared_ptr<Ticket> t = a->ticket;
      h.run_to_idle();
      Collected c = collect(*t, kRealTimeout);
      ASSERT_EQ(c.n_finished, 1);
      const std::string want = fake_text(max_tokens);
      migrated += t->migrations();
      restarted += t->attempts() - t->migrations();
      if (c.fin.state == RequestState::kDone) {
        EXPECT_EQ(c.text, want);
        EXPECT_EQ(c.fin.completion_tokens, max_tokens);
        ASSERT_EQ(c.logprobs.size(), static_cast<size_t>(max_tokens));
        for (int32_t k = 0; k < max_tokens; ++k) EXPECT_EQ(c.logprobs[static_cast<size_t>(k)].index, k);
        continue;
      }
      ASSERT_EQ(c.fin.state, RequestState::kFailed) << c.fin.status.to_string();
      std::string have = c.text;
      ASSERT_EQ(want.compare(0, have.size(), have), 0) << "streamed text is a prefix: " << have;
      if (c.fin.status.reason() != FailureReason::kResumable) {
        // Failed before anything was streamed (every path refused it).
        EXPECT_EQ(have, "");
        EXPECT_TRUE(classify(c.fin.status).resumable) << c.fin.status.to_string();
        continue;
      }
      // Resume until done: a fault may still be pending, the GPU path may
      // be out; time moves on between tries (cooldowns, probes).
      bool done = false;
      for (int tries = 0; tries < 8 && !done; ++tries) {
        ResumeRequest rr;
        rr.checkpoint = t->checkpoint();
        ASSERT_NE(rr.checkpoint, nullptr);
        rr.received_text = have;
        Result<Resumed> res = h.gw->resume(rr);
        if (!res.ok()) {
          h.run_for(10);
          continue;
        }
        have += res->unsent;
        t = res->admitted.ticket;
        h.run_to_idle();
        Collected rc = collect(*t, kRealTimeout);
        have += rc.text;
        ASSERT_EQ(want.compare(0, have.size(), have), 0) << "resumed text is a prefix: " << have;
        done = rc.fin.state == RequestState::kDone;
        if (!done) {
          ASSERT_EQ(rc.fin.status.reason(), FailureReason::kResumable) << rc.fin.status.to_string();
          h.run_for(10);
        }
      }
      EXPECT_TRUE(done);
      EXPECT_EQ(have, want);
      ++resumed;
    }
    h.run_to_idle();
    EXPECT_EQ(h.sched(0).load().kv_blocks_free, 64) << "no KV block left behind";
    EXPECT_EQ(h.gw->in_flight(), 0);
  }
  std::printf("property: %d migrations, %d restarts, %d resumed\n", migrated, restarted, resumed);
  // The sequences exercised every way out.
  if (std::getenv("SPW_SEED_ONLY") == nullptr) {
    EXPECT_GT(migrated, 0);
    EXPECT_GT(restarted, 0);
    EXPECT_GT(resumed, 0);
  }
}

}  // namespace
}  // namespace spw::gateway
