#include "admission/controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace spw::admission {
namespace {

constexpr double kEps = 1e-9;

// A path with round numbers so the expected timings can be worked out by
// hand: 1000 prompt tokens/s, 50 generated tokens/s, every request generates
// its whole max_tokens (share 1), 64 free blocks of 16 tokens, one worker.
PathSnapshot make_path(std::string name, PathRole role = PathRole::kPrimary) {
  PathSnapshot p;
  p.placement = name == "gpu" ? "vulkan" : name;
  p.name = std::move(name);
  p.model = "stories";
  p.role = role;
  p.n_ctx = 256;
  p.workers = 1;
  p.queue_capacity = 8;
  p.kv_block_tokens = 16;
  p.kv_blocks_total = 64;
  p.kv_blocks_free = 64;
  p.rates = PathRates{1000.0, 50.0, 1.0, 10, true};
  return p;
}

RequestShape shape(int32_t prompt, std::optional<int32_t> max_tokens, bool allow_shrink = false) {
  RequestShape r;
  r.prompt_tokens = prompt;
  r.max_tokens = max_tokens;
  r.allow_shrink = allow_shrink;
  return r;
}

WorkItem item(int32_t prompt, int32_t max_tokens, int32_t generated, int32_t blocks, double elapsed = 0) {
  WorkItem w;
  w.prompt_tokens = prompt;
  w.max_tokens = max_tokens;
  w.generated = generated;
  w.kv_blocks = blocks;
  w.elapsed_s = elapsed;
  return w;
}

// Puts `w` on `p` as running work, taking its blocks out of the free count.
void run_on(PathSnapshot& p, WorkItem w) {
  p.kv_blocks_free -= w.kv_blocks;
  p.running.push_back(w);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(AdmissionController, AdmitsOnAnIdlePrimary) {
  const Decision d = decide(shape(20, 30), {make_path("gpu"), make_path("cpu", PathRole::kFallback)}, {});
  EXPECT_EQ(d.kind, DecisionKind::kAdmit);
  EXPECT_EQ(d.path_index, 0);
  EXPECT_EQ(d.path, "gpu");
  EXPECT_FALSE(d.degraded());
  EXPECT_EQ(d.http_status, 200);
  EXPECT_EQ(d.failure, FailureReason::kNone);
  EXPECT_EQ(d.max_tokens, 30);
  EXPECT_FALSE(d.max_tokens_clamped);
  EXPECT_EQ(d.kv_blocks, 4);  // ceil(50 / 16)
  EXPECT_EQ(d.queue_position, 0);
  EXPECT_NEAR(d.timing.delay_s, 0.0, kEps);
  EXPECT_NEAR(d.timing.ttft_s, 0.02, kEps);         // 20 / 1000
  EXPECT_NEAR(d.timing.total_s, 0.02 + 0.6, kEps);  // + 30 / 50
  ASSERT_EQ(d.verdicts.size(), 1u);  // the first path that fits ends the search
  EXPECT_TRUE(d.verdicts[0].eligible);
  EXPECT_TRUE(contains(d.reason, "admit on gpu")) << d.reason;
}

TEST(AdmissionController, DelaysWhenTheWaitIsWithinMaxDelay) {
  PathSnapshot gpu = make_path("gpu");
  // Running: 40 of its 50 tokens left at 50 tokens/s = 0.8 s.
  run_on(gpu, item(100, 50, 10, 10, 0.5));
  // Queued ahead: 200 / 1000 + 20 / 50 = 0.2 + 0.4 = 0.6 s.
  gpu.queued.push_back(item(200, 20, 0, 14));
  AdmissionPolicy policy;
  policy.max_delay_s = 2.0;
  Decision d = decide(shape(40, 24), {gpu, make_path("cpu", PathRole::kFallback)}, policy);
  EXPECT_EQ(d.kind, DecisionKind::kDelay) << d.reason;
  EXPECT_EQ(d.path, "gpu");
  EXPECT_NEAR(d.timing.delay_s, 0.8 + 0.6, kEps);
  EXPECT_NEAR(d.timing.ttft_s, 1.4 + 0.04, kEps);          // + 40 / 1000
  EXPECT_NEAR(d.timing.total_s, 1.4 + 0.04 + 0.48, kEps);  // + 24 / 50
  EXPECT_EQ(d.queue_position, 2);  // behind the one already queued
  EXPECT_FALSE(d.degraded());

  // Requests generating half their max_tokens on average: the running one has
  // max(1, 25 - 10) = 15 tokens left (0.3 s), the queued one 0.2 + 10 / 50.
  gpu.rates.completion_share = 0.5;
  d = decide(shape(40, 24), {gpu}, policy);
  EXPECT_EQ(d.kind, DecisionKind::kDelay);
  EXPECT_NEAR(d.timing.delay_s, 0.3 + 0.4, kEps);
  EXPECT_NEAR(d.timing.total_s, 0.7 + 0.04 + 12.0 / 50.0, kEps);
}

TEST(AdmissionController, RedirectsAPromptThatCanNeverFitThePrimaryKvBudget) {
  PathSnapshot gpu = make_path("gpu");
  gpu.kv_blocks_total = 8;  // 128 positions
  gpu.kv_blocks_free = 8;
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.kv_blocks_total = 0;  // unlimited
  const Decision d = decide(shape(150, 20), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kRedirect) << d.reason;
  EXPECT_EQ(d.path_index, 1);
  EXPECT_EQ(d.path, "cpu");
  EXPECT_TRUE(d.degraded());
  EXPECT_EQ(d.max_tokens, 20);
  EXPECT_EQ(d.kv_blocks, 11);  // ceil(170 / 16)
  ASSERT_EQ(d.verdicts.size(), 2u);
  EXPECT_FALSE(d.verdicts[0].eligible);
  EXPECT_TRUE(d.verdicts[1].eligible);
  // The reason names the path passed over, what it needed and its budget.
  EXPECT_TRUE(contains(d.reason, "redirect on cpu")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "gpu: needs 11 KV blocks")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "whole KV budget is 8")) << d.reason;

  // A short one still goes to the gpu.
  EXPECT_EQ(decide(shape(20, 20), {gpu, cpu}, {}).kind, DecisionKind::kAdmit);
}

TEST(AdmissionController, RedirectsWhileTheLedgerIsOverThePressureThreshold) {
  PathSnapshot gpu = make_path("gpu");
  gpu.ledger = "vulkan:0";
  gpu.ledger_limit = 1000;
  gpu.ledger_used = 1100;  // a co-tenant declared 500 on top of our 600
  gpu.ledger_cotenants = 500;
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  Decision d = decide(shape(20, 20), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_EQ(d.path, "cpu");
  EXPECT_TRUE(contains(d.reason, "memory pressure on vulkan:0")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "110%")) << d.reason;

  // The co-tenant left: back to the gpu, its pressure reported.
  gpu.ledger_used = 900;
  gpu.ledger_cotenants = 0;
  d = decide(shape(20, 20), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kAdmit);
  EXPECT_EQ(d.path, "gpu");
  EXPECT_NEAR(d.pressure, 0.9, kEps);

  // The request's own extra memory counts: 900 + 150 > 1000.
  gpu.request_extra_bytes = 150;
  EXPECT_EQ(decide(shape(20, 20), {gpu, cpu}, {}).path, "cpu");
  // And so does a lower threshold.
  gpu.request_extra_bytes = 0;
  AdmissionPolicy strict;
  strict.pressure_threshold = 0.85;
  EXPECT_EQ(decide(shape(20, 20), {gpu, cpu}, strict).path, "cpu");
}

TEST(AdmissionController, OffloadsToAHybridPathBeforeTheFallback) {
  PathSnapshot gpu = make_path("gpu");
  gpu.ledger = "vulkan:0";
  gpu.ledger_limit = 1000;
  gpu.ledger_used = 1200;
  PathSnapshot hybrid = make_path("hybrid", PathRole::kOffload);
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  Decision d = decide(shape(20, 20), {gpu, hybrid, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kOffload) << d.reason;
  EXPECT_EQ(d.path, "hybrid");
  EXPECT_EQ(d.path_index, 1);
  EXPECT_TRUE(d.degraded());

  // The hybrid path out of service: the CPU fallback, a redirect.
  hybrid.usable = false;
  hybrid.unusable_reason = "device lost";
  d = decide(shape(20, 20), {gpu, hybrid, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_EQ(d.path, "cpu");
  EXPECT_TRUE(contains(d.reason, "hybrid: out of service (device lost)")) << d.reason;
}

TEST(AdmissionController, ShrinksOnlyWhenAllowedAndWhenEnoughTokensRemain) {
  PathSnapshot gpu = make_path("gpu");
  gpu.kv_blocks_total = 8;
  gpu.kv_blocks_free = 8;
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  // 50 + 200 tokens need 16 blocks; the gpu has 8 (128 positions) in all.
  const RequestShape asks = shape(50, 200, /*allow_shrink=*/true);

  Decision d = decide(asks, {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kShrink) << d.reason;
  EXPECT_EQ(d.path, "gpu");
  EXPECT_TRUE(d.shrunk);
  EXPECT_FALSE(d.degraded());
  EXPECT_EQ(d.max_tokens, 8 * 16 - 50);  // 78: what the free blocks hold
  EXPECT_EQ(d.kv_blocks, 8);
  EXPECT_LE(d.max_tokens, 200);
  EXPECT_TRUE(contains(d.reason, "shrunk max_tokens 200 -> 78")) << d.reason;

  // Not asked for and not the policy: it leaves the gpu instead.
  d = decide(shape(50, 200, false), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_EQ(d.max_tokens, 200);
  EXPECT_FALSE(d.shrunk);

  // The policy may allow it for every request.
  AdmissionPolicy always;
  always.allow_shrink = true;
  d = decide(shape(50, 200, false), {gpu, cpu}, always);
  EXPECT_EQ(d.kind, DecisionKind::kShrink);
  EXPECT_EQ(d.max_tokens, 78);

  // Fewer than min_shrink_tokens would remain: no shrink.
  AdmissionPolicy picky;
  picky.min_shrink_tokens = 100;
  d = decide(asks, {gpu, cpu}, picky);
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_FALSE(d.shrunk);
  // ... and with nowhere else to go it is refused rather than shrunk.
  d = decide(asks, {gpu}, picky);
  EXPECT_EQ(d.kind, DecisionKind::kReject);
  EXPECT_EQ(d.http_status, 503);
}

TEST(AdmissionController, ShrinksToTheFreeBlocksInsteadOfWaitingTooLong) {
  PathSnapshot gpu = make_path("gpu");
  gpu.workers = 4;
  // One long request holds 58 of the 64 blocks for another 500 / 50 = 10 s.
  run_on(gpu, item(10, 600, 100, 58));
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  // 40 + 100 tokens = 9 blocks: within the budget, but only 6 are free.
  Decision d = decide(shape(40, 100, true), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kShrink) << d.reason;
  EXPECT_EQ(d.max_tokens, 6 * 16 - 40);  // 56
  EXPECT_EQ(d.kv_blocks, 6);
  EXPECT_NEAR(d.timing.delay_s, 0.0, kEps);  // fits the free blocks and a free worker now
  EXPECT_EQ(d.queue_position, 0);
  // Without shrinking, the 10 s wait sends it to the cpu.
  d = decide(shape(40, 100, false), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_TRUE(contains(d.reason, "estimated wait 10.00 s exceeds max_delay 2.00 s")) << d.reason;
}

TEST(AdmissionController, RejectsWith429AndRetryAfterWhenEveryQueueIsFull) {
  PathSnapshot gpu = make_path("gpu");
  gpu.queue_capacity = 2;
  run_on(gpu, item(100, 100, 50, 13));      // 50 / 50 = 1.0 s left
  gpu.queued.push_back(item(100, 50, 0, 10));  // 0.1 + 1.0 s
  gpu.queued.push_back(item(100, 50, 0, 10));  // 0.1 + 1.0 s
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.rates = PathRates{100.0, 10.0, 1.0, 3, true};
  cpu.queue_capacity = 1;
  run_on(cpu, item(10, 100, 0, 7));     // 10 / 100 + 100 / 10 = 10.1 s
  cpu.queued.push_back(item(10, 10, 0, 2));  // 0.1 + 1.0 s
  const Decision d = decide(shape(20, 20), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kReject);
  EXPECT_EQ(d.path_index, -1);
  EXPECT_EQ(d.http_status, 429);
  EXPECT_EQ(d.failure, FailureReason::kQueueFull);
  // The soonest any full queue would start it: gpu, 1.0 + 1.1 + 1.1 s.
  EXPECT_NEAR(d.retry_after_s, 3.2, 1e-6);
  EXPECT_TRUE(contains(d.reason, "gpu: queue full (2 of 2)")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "cpu: queue full (1 of 1)")) << d.reason;

  // Retry-After is at least a second.
  PathSnapshot quick = make_path("gpu");
  quick.queue_capacity = 1;
  quick.queued.push_back(item(10, 1, 0, 1));
  EXPECT_NEAR(decide(shape(20, 20), {quick}, {}).retry_after_s, 1.0, kEps);
}

TEST(AdmissionController, RejectsWith503WhenNoPathCanServeIt) {
  PathSnapshot gpu = make_path("gpu");
  gpu.usable = false;
  gpu.unusable_reason = "device lost";
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.n_ctx = 64;
  Decision d = decide(shape(100, 10), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kReject);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.failure, FailureReason::kNoPath);
  EXPECT_EQ(d.retry_after_s, 0.0);
  EXPECT_TRUE(contains(d.reason, "gpu: out of service (device lost)")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "cpu: prompt of 100 tokens does not fit its context of 64")) << d.reason;

  d = decide(shape(10, 10), {}, {});
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.failure, FailureReason::kNoPath);
  EXPECT_TRUE(contains(d.reason, "no execution path")) << d.reason;
}

// A prompt longer than every path's context (out of service or not) can
// never be served: 400, not a retryable 503. Longer only than the usable
// paths' contexts is a 503: the other path may come back.
TEST(AdmissionController, RejectsWith400WhenNoPathsContextHoldsThePrompt) {
  PathSnapshot gpu = make_path("gpu");  // n_ctx 256
  gpu.usable = false;
  gpu.unusable_reason = "device lost";
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.n_ctx = 64;
  Decision d = decide(shape(300, 10), {gpu, cpu}, {});
  EXPECT_EQ(d.kind, DecisionKind::kReject);
  EXPECT_EQ(d.http_status, 400);
  EXPECT_EQ(d.failure, FailureReason::kContextFull);
  EXPECT_TRUE(contains(d.reason, "300 tokens does not fit the context of 256 tokens of any path")) << d.reason;
  d = decide(shape(100, 10), {gpu, cpu}, {});
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.failure, FailureReason::kNoPath);
}

TEST(AdmissionController, ClampsMaxTokensToTheContext) {
  const std::vector<PathSnapshot> paths{make_path("gpu")};
  Decision d = decide(shape(200, 100), paths, {});
  EXPECT_EQ(d.max_tokens, 56);  // 256 - 200
  EXPECT_TRUE(d.max_tokens_clamped);
  EXPECT_EQ(d.max_tokens_requested, std::optional<int32_t>(100));
  EXPECT_EQ(d.n_ctx, 256);
  EXPECT_EQ(d.kv_blocks, 16);

  d = decide(shape(200, std::nullopt), paths, {});  // "to the end of the context"
  EXPECT_EQ(d.max_tokens, 56);
  EXPECT_FALSE(d.max_tokens_clamped);

  d = decide(shape(200, 10), paths, {});
  EXPECT_EQ(d.max_tokens, 10);
  EXPECT_FALSE(d.max_tokens_clamped);
}

TEST(AdmissionController, QueuesOnThePrimaryWhenTheWaitIsLongButNothingElseCanTakeIt) {
  PathSnapshot gpu = make_path("gpu");
  run_on(gpu, item(10, 600, 100, 40));  // 10 s to go, one worker
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.n_ctx = 64;  // cannot hold the 100-token prompt
  AdmissionPolicy policy;
  policy.max_delay_s = 2.0;

  Decision d = decide(shape(100, 10), {gpu, cpu}, policy);
  EXPECT_EQ(d.kind, DecisionKind::kDelay) << d.reason;
  EXPECT_EQ(d.path, "gpu");
  EXPECT_EQ(d.http_status, 200);
  EXPECT_NEAR(d.timing.delay_s, 10.0, kEps);
  EXPECT_EQ(d.queue_position, 1);
  EXPECT_EQ(d.max_tokens, 10);
  EXPECT_TRUE(contains(d.reason, "no other path can take it, so it waits on gpu")) << d.reason;

  // The same with no other path at all.
  d = decide(shape(100, 10), {gpu}, policy);
  EXPECT_EQ(d.kind, DecisionKind::kDelay);
  EXPECT_EQ(d.path, "gpu");

  // A fallback that can take it does (the wait is over max_delay).
  cpu.n_ctx = 256;
  d = decide(shape(100, 10), {gpu, cpu}, policy);
  EXPECT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_EQ(d.path, "cpu");
}

// Two or three workers, a 10-block budget, two running and two queued items;
// 100 prompt tokens/s and 10 generated tokens/s. Worked by hand:
//   running R1: prefill 0.5 s with 0.2 s done, then 20 tokens: 0.3 + 2.0 = 2.3 s, 5 blocks
//   running R2: 30 of 40 tokens left: 3.0 s, 3 blocks      (free: 10 - 8 = 2)
//   queued  Q1: 100 / 100 + 10 / 10 = 2.0 s, 6 blocks
//   queued  Q2: 50 / 100 + 5 / 10 = 1.0 s, 2 blocks
// Three workers: Q1 needs 6 blocks, so it starts when R1 ends (2.3; free 7 -> 1,
// ends 4.3); Q2 needs 2, free 1, so it starts when R2 ends (3.0; free 4 -> 2,
// ends 4.0). A new request of 2 blocks fits then: 3.0 (FIFO: not before Q2,
// though a worker and 2 blocks were free at 0). Of 4 blocks: when Q2 ends,
// 4.0. Of 9: when Q1 ends too, 4.3. Of 11: never (more than the budget).
// Two workers: every start also waits for a worker, so 2 blocks -> 4.0.
TEST(AdmissionController, StartDelayFollowsTheFifoQueueWorkersAndKvBudget) {
  PathSnapshot p = make_path("gpu");
  p.rates = PathRates{100.0, 10.0, 1.0, 5, true};
  p.workers = 3;
  p.kv_blocks_total = 10;
  p.kv_blocks_free = 10;
  run_on(p, item(50, 20, 0, 5, 0.2));
  run_on(p, item(10, 40, 10, 3, 1.5));
  p.queued.push_back(item(100, 10, 0, 6));
  p.queued.push_back(item(50, 5, 0, 2));
  EXPECT_NEAR(estimate_start_delay(p, 2), 3.0, kEps);
  EXPECT_NEAR(estimate_start_delay(p, 4), 4.0, kEps);
  EXPECT_NEAR(estimate_start_delay(p, 9), 4.3, kEps);
  EXPECT_TRUE(std::isinf(estimate_start_delay(p, 11)));

  p.workers = 2;
  EXPECT_NEAR(estimate_start_delay(p, 2), 4.0, kEps);

  // An idle path starts it at once; one with unknown rates and work ahead
  // cannot say when.
  PathSnapshot idle = make_path("gpu");
  EXPECT_NEAR(estimate_start_delay(idle, 4), 0.0, kEps);
  idle.rates = PathRates{};
  EXPECT_NEAR(estimate_start_delay(idle, 4), 0.0, kEps);
  run_on(idle, item(10, 10, 0, 2));
  EXPECT_TRUE(std::isinf(estimate_start_delay(idle, 4)));
  EXPECT_NEAR(estimate_run_s(PathRates{100.0, 10.0, 0.5, 1, true}, 50, 40), 0.5 + 2.0, kEps);
}

TEST(AdmissionController, AnUnloadedReplicaAddsItsLoadTimeToTheWaitAndTheQuote) {
  // GPU path over pressure: the request goes to the CPU path, whose
  // on-demand replica must load first (2.5 s predicted).
  PathSnapshot gpu = make_path("gpu");
  gpu.ledger_limit = 100;
  gpu.ledger_used = 120;
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  cpu.startup_s = 2.5;
  EXPECT_NEAR(estimate_start_delay(cpu, 2), 2.5, kEps);
  const Decision d = decide(shape(100, 50), {gpu, cpu}, AdmissionPolicy{});
  ASSERT_EQ(d.kind, DecisionKind::kRedirect);
  EXPECT_NEAR(d.timing.delay_s, 2.5, kEps);
  EXPECT_NEAR(d.timing.ttft_s, 2.5 + 0.1, kEps);
  EXPECT_NEAR(d.timing.total_s, 2.5 + 0.1 + 1.0, kEps);
  // Work already queued behind the load waits for it too.
  cpu.queued.push_back(item(100, 50, 0, 10));
  EXPECT_NEAR(estimate_start_delay(cpu, 2), 2.5 + 1.1, kEps);
}

TEST(AdmissionController, TimesGrowWithPositionWhenTheRatesSaySo) {
  PathRates r{100.0, 10.0, 1.0, 5, true};
  // Flat: the old arithmetic.
  EXPECT_NEAR(prefill_s(r, 50), 0.5, kEps);
  EXPECT_NEAR(decode_s(r, 50, 0, 20), 2.0, kEps);
  // 1 ms per token per earlier position while decoding: tokens at
  // positions 50..69 add 1e-3 * (50 + ... + 69) = 1.19 s.
  r.decode_s_per_pos = 1e-3;
  EXPECT_NEAR(decode_s(r, 50, 0, 20), 2.0 + 1.19, 1e-9);
  // From the 10th token on: positions 60..69.
  EXPECT_NEAR(decode_s(r, 50, 10, 20), 1.0 + 1e-3 * 645, 1e-9);
  r.prefill_s_per_pos = 1e-4;  // positions 0..49: 1e-4 * 1225
  EXPECT_NEAR(prefill_s(r, 50), 0.5 + 0.1225, 1e-9);
  EXPECT_NEAR(estimate_run_s(r, 50, 20), 0.5 + 0.1225 + 2.0 + 1.19, 1e-9);
  // A running request's remaining time counts its own positions.
  PathSnapshot p = make_path("gpu");
  p.rates = r;
  run_on(p, item(50, 20, 10, 5, 1.0));
  EXPECT_NEAR(estimate_start_delay(p, 2), 1.0 + 1e-3 * 645, 1e-9);
}

TEST(AdmissionController, CostFitRecoversTheLineFromRunsAtDifferentPositions) {
  // Runs of a path whose token costs 20 ms + 0.05 ms per position.
  const double c = 0.02, d = 5e-5;
  auto run = [&](double n, double first_pos) {
    const double s = n * first_pos + n * (n - 1) / 2;
    return std::pair<double, double>{s, n * c + s * d};
  };
  CostFit fit;
  double tps = 0, slope = 0;
  EXPECT_FALSE(fit.solve(tps, slope));
  for (const auto& [n, pos] : std::vector<std::pair<double, double>>{{10, 5}, {50, 400}, {20, 1500}, {30, 60}}) {
    const auto [s, t] = run(n, pos);
    fit.add(n, s, t, 0.3);
  }
  ASSERT_TRUE(fit.solve(tps, slope));
  // The ridge pulls the slope a little toward flat; the predictions stay
  // within a few percent where the samples were.
  EXPECT_NEAR(tps, 1 / c, 0.05 * (1 / c));
  EXPECT_NEAR(slope, d, 0.05 * d);
  PathRates r{1000.0, tps, 1.0, 4, true};
  r.decode_s_per_pos = slope;
  const auto [s, t] = run(40, 1000);
  EXPECT_NEAR(decode_s(r, 1000, 0, 40), t, 0.03 * t);
  (void)s;

  // Every run at the same positions: no slope can be told apart, so the line
  // is (nearly) flat and still right at those positions.
  CostFit same;
  for (int i = 0; i < 5; ++i) {
    const auto [s1, t1] = run(20, 100);
    same.add(20, s1, t1, 0.3);
  }
  ASSERT_TRUE(same.solve(tps, slope));
  PathRates flat{1000.0, tps, 1.0, 5, true};
  flat.decode_s_per_pos = slope;
  EXPECT_NEAR(decode_s(flat, 100, 0, 20), run(20, 100).second, 0.02 * run(20, 100).second);

  // Noise that makes later positions look cheaper gives a flat rate, never a
  // negative slope.
  CostFit noisy;
  noisy.add(10, 100, 0.5, 0.3);
  noisy.add(10, 10000, 0.3, 0.3);
  ASSERT_TRUE(noisy.solve(tps, slope));
  EXPECT_EQ(slope, 0);
  // The flat rate is the weighted mean: the older run weighs 1 - alpha.
  EXPECT_NEAR(tps, (0.7 * 100 + 100) / (0.7 * 10 * 0.5 + 10 * 0.3), 1e-9);
}

TEST(AdmissionController, SameInputsGiveTheSameDecision) {
  PathSnapshot gpu = make_path("gpu");
  gpu.workers = 2;
  run_on(gpu, item(30, 100, 20, 9, 1.0));
  run_on(gpu, item(60, 50, 0, 7, 0.01));
  gpu.queued.push_back(item(40, 40, 0, 5));
  gpu.ledger = "vulkan:0";
  gpu.ledger_limit = 1000;
  gpu.ledger_used = 700;
  PathSnapshot cpu = make_path("cpu", PathRole::kFallback);
  const std::vector<PathSnapshot> paths{gpu, cpu};
  const RequestShape r = shape(70, 90, true);
  const Decision a = decide(r, paths, {});
  const Decision b = decide(r, paths, {});
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.path_index, b.path_index);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.kv_blocks, b.kv_blocks);
  EXPECT_EQ(a.queue_position, b.queue_position);
  EXPECT_EQ(a.timing.delay_s, b.timing.delay_s);
  EXPECT_EQ(a.timing.total_s, b.timing.total_s);
  EXPECT_EQ(a.pressure, b.pressure);
  ASSERT_EQ(a.verdicts.size(), b.verdicts.size());
  for (size_t i = 0; i < a.verdicts.size(); ++i) EXPECT_EQ(a.verdicts[i].reason, b.verdicts[i].reason);
}

// Random snapshots (fixed seeds, bounded count): whatever path is chosen can
// really take the request.
TEST(AdmissionController, ChosenPathAlwaysSatisfiesItsLimits) {
  int chosen = 0, rejected = 0;
  for (uint32_t seed : {1u, 2u, 3u, 42u, 1234u}) {
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    for (int iter = 0; iter < 2000; ++iter) {
      std::vector<PathSnapshot> paths;
      const int n_paths = uni(1, 3);
      for (int i = 0; i < n_paths; ++i) {
        const PathRole role = i == 0 ? PathRole::kPrimary : (uni(0, 1) ? PathRole::kOffload : PathRole::kFallback);
        std::string name = "p";
        name += std::to_string(i);
        PathSnapshot p = make_path(name, role);
        p.usable = uni(0, 9) != 0;
        p.n_ctx = uni(16, 512);
        p.workers = uni(1, 4);
        p.queue_capacity = uni(0, 4);
        p.kv_block_tokens = uni(0, 3) ? 16 : 32;
        p.kv_blocks_total = uni(0, 4) == 0 ? 0 : uni(1, 40);
        p.kv_blocks_free = p.kv_blocks_total;
        if (uni(0, 4) == 0) p.rates = PathRates{};  // nothing known yet
        else p.rates = PathRates{uni(10, 2000) * 1.0, uni(1, 100) * 1.0, uni(1, 10) / 10.0, 1, true};
        const int n_run = uni(0, p.workers);
        for (int k = 0; k < n_run; ++k) {
          const int b = p.kv_blocks_total > 0 ? uni(0, p.kv_blocks_free) : uni(1, 8);
          run_on(p, item(uni(1, 100), uni(1, 100), uni(0, 50), b, uni(0, 100) / 100.0));
        }
        if (p.kv_blocks_total == 0) p.kv_blocks_free = 0;
        const int n_queued = uni(0, p.queue_capacity);
        for (int k = 0; k < n_queued; ++k)
          p.queued.push_back(item(uni(1, 100), uni(1, 100), 0, std::max(1, uni(1, std::max(1, p.kv_blocks_total)))));
        if (uni(0, 1)) {
          p.ledger = "ledger";
          p.ledger += std::to_string(i);
          p.ledger_limit = static_cast<uint64_t>(uni(1, 1000));
          p.ledger_used = static_cast<uint64_t>(uni(0, 1200));
          p.request_extra_bytes = static_cast<uint64_t>(uni(0, 100));
        }
        paths.push_back(std::move(p));
      }
      AdmissionPolicy policy;
      policy.pressure_threshold = uni(50, 110) / 100.0;
      policy.max_delay_s = uni(0, 50) / 10.0;
      policy.allow_shrink = uni(0, 3) == 0;
      policy.min_shrink_tokens = uni(1, 32);
      const std::optional<int32_t> requested = uni(0, 3) ? std::optional<int32_t>(uni(1, 600)) : std::nullopt;
      const RequestShape r = shape(uni(1, 520), requested, uni(0, 3) == 0);

      const Decision d = decide(r, paths, policy);
      const std::string where = "seed " + std::to_string(seed) + " iter " + std::to_string(iter) + ": " + d.reason;
      if (d.kind == DecisionKind::kReject) {
        ++rejected;
        ASSERT_EQ(d.path_index, -1) << where;
        // 400 exactly when no path's context holds the prompt; else retryable.
        const bool fits_some_context = std::any_of(paths.begin(), paths.end(),
                                                   [&](const PathSnapshot& p) { return r.prompt_tokens < p.n_ctx; });
        if (fits_some_context) {
          ASSERT_TRUE(d.http_status == 429 || d.http_status == 503) << where;
        } else {
          ASSERT_EQ(d.http_status, 400) << where;
          ASSERT_EQ(d.failure, FailureReason::kContextFull) << where;
        }
        continue;
      }
      ++chosen;
      ASSERT_GE(d.path_index, 0) << where;
      ASSERT_LT(d.path_index, n_paths) << where;
      const PathSnapshot& p = paths[static_cast<size_t>(d.path_index)];
      ASSERT_EQ(d.path, p.name) << where;
      ASSERT_TRUE(p.usable) << where;
      ASSERT_LT(r.prompt_tokens, p.n_ctx) << where;
      ASSERT_GE(d.max_tokens, 1) << where;
      ASSERT_LE(r.prompt_tokens + d.max_tokens, p.n_ctx) << where;
      if (requested) {
        ASSERT_LE(d.max_tokens, *requested) << where;
      }
      ASSERT_EQ(d.kv_blocks, kv_blocks_for(r.prompt_tokens + d.max_tokens, p.kv_block_tokens)) << where;
      if (p.kv_blocks_total > 0) {
        ASSERT_LE(d.kv_blocks, p.kv_blocks_total) << where;
      }
      if (p.ledger_limit > 0) {
        ASSERT_LE(d.pressure, policy.pressure_threshold) << where;
      }
      ASSERT_LT(static_cast<int32_t>(p.queued.size()), p.queue_capacity) << where;
      if (d.kind == DecisionKind::kShrink) {
        ASSERT_TRUE(r.allow_shrink || policy.allow_shrink) << where;
        ASSERT_GE(d.max_tokens, policy.min_shrink_tokens) << where;
        ASSERT_LE(d.kv_blocks, p.kv_blocks_free) << where;
      }
      if (d.kind == DecisionKind::kOffload) {
        ASSERT_EQ(p.role, PathRole::kOffload) << where;
      }
      if (d.kind == DecisionKind::kRedirect) {
        ASSERT_EQ(p.role, PathRole::kFallback) << where;
      }
      // Deterministic: the same inputs again give the same answer.
      const Decision again = decide(r, paths, policy);
      ASSERT_EQ(again.kind, d.kind) << where;
      ASSERT_EQ(again.reason, d.reason) << where;
    }
  }
  // Both outcomes were exercised.
  EXPECT_GT(chosen, 1000);
  EXPECT_GT(rejected, 100);
}

}  // namespace

// OpenAI's n: the prompt's full blocks once, each choice's own from there.
TEST(AdmissionController, PricesNChoicesSharingThePromptsKv) {
  EXPECT_EQ(kv_blocks_for_choices(200, 20, 16, 1), kv_blocks_for(220, 16));
  // 12 full prompt blocks shared; each choice 14 - 12 = 2 of its own.
  EXPECT_EQ(kv_blocks_for_choices(200, 20, 16, 3), 12 + 3 * 2);
  EXPECT_LT(kv_blocks_for_choices(200, 20, 16, 3), 3 * kv_blocks_for(220, 16));
  // A prompt that fills its last block: a choice re-evaluates its last
  // position in a copy of that block (11 shared, 14 - 11 = 3 each).
  EXPECT_EQ(kv_blocks_for_choices(192, 20, 16, 3), 11 + 3 * 3);

  PathSnapshot gpu = make_path("gpu");
  gpu.kv_blocks_total = 20;
  gpu.kv_blocks_free = 20;
  RequestShape one = shape(200, 20);
  RequestShape three = one;
  three.n = 3;
  Decision d1 = decide(one, {gpu}, {});
  Decision d3 = decide(three, {gpu}, {});
  EXPECT_EQ(d1.kv_blocks, 14);
  EXPECT_EQ(d3.kind, DecisionKind::kAdmit) << d3.reason;
  EXPECT_EQ(d3.kv_blocks, 18);
  // The run is priced as n x max_tokens generated tokens.
  EXPECT_GT(d3.timing.total_s, d1.timing.total_s);
  // Five choices (12 + 5 x 2 = 22) exceed the whole budget: the reason names n.
  RequestShape five = one;
  five.n = 5;
  Decision d5 = decide(five, {gpu}, {});
  EXPECT_EQ(d5.kind, DecisionKind::kReject);
  EXPECT_TRUE(contains(d5.reason, "needs 22 KV blocks")) << d5.reason;
  EXPECT_TRUE(contains(d5.reason, "n = 5 choices")) << d5.reason;
  // Shrunk, each choice gets what the free blocks leave it: (20 - 12) / 5 =
  // 1 block each, so 13 x 16 - 200 = 8 tokens.
  five.allow_shrink = true;
  AdmissionPolicy small;
  small.min_shrink_tokens = 1;
  Decision s5 = decide(five, {gpu}, small);
  EXPECT_EQ(s5.kind, DecisionKind::kShrink) << s5.reason;
  EXPECT_EQ(s5.max_tokens, 8);
  EXPECT_EQ(s5.kv_blocks, 12 + 5);
  EXPECT_TRUE(contains(s5.reason, "n = 5 choices")) << s5.reason;
}

}  // namespace spw::admission
