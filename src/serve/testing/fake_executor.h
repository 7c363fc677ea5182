// FakeExecutor: a deterministic stand-in for an engine worker, for tests of
// the scheduler, the gateway and anything above them. Test-only, header-only.
//
// Contract (run()):
//   - Time is simulated through the injected Env (use a SimEnv): the prefill
//     costs prompt_tokens / prefill_tps seconds (one env.sleep_for_ns), then
//     every generated token, the first included, costs 1 / decode_tps seconds
//     (one env.sleep_for_ns each). A job of P prompt tokens and N tokens thus
//     runs P / prefill_tps + N / decode_tps, the same model of a request's
//     duration that admission::estimate_run_s uses with completion_share 1.
//     A speed <= 0 makes that step free.
//   - Token k (0-based) is emitted as the text "t<k> " through on_text, then
//     on_token(k + 1) is called, at the simulated instant the token is done.
//   - It stops after job.max_tokens tokens with FinishReason::kLength, or,
//     with FakeSpeed::stop_after > 0, after that many tokens with kStop (as an
//     end-of-generation token would), whichever comes first.
//   - `cancel` is polled before the prefill and at every token boundary
//     (before each token is computed). Once it is set, run() returns
//     Status(kCancelled, ..., FailureReason::kCancelled) at the next boundary:
//     a token already being computed when cancel was set is still emitted,
//     as an engine finishes the step it is in.
//   - Explicit test fault injection: FakeFaults::fail_next(status) makes the
//     next run() of any executor sharing that FakeFaults return `status`
//     before its first token, at once (no simulated time passes), so breaker
//     and failover tests can script device faults. Faults queue up: n calls
//     fail the next n runs, in order. Nothing else ever fails.
// Thread safety: one FakeExecutor per worker thread (as Scheduler uses it);
// FakeFaults may be shared by all executors of a path and called from any
// thread. The Env must outlive every executor; under a SimEnv a run() blocks
// until the test advances the clock past each step's deadline.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "serve/scheduler.h"

namespace spw::serve::testing {

struct FakeSpeed {
  double prefill_tps = 1000.0;  // prompt tokens per simulated second
  double decode_tps = 100.0;    // generated tokens per simulated second
  int32_t stop_after = 0;       // > 0: end with kStop after this many tokens
};

// Scripted failures, shared by the executors of one path (see the contract).
class FakeFaults {
 public:
  // Explicit test fault injection: the next run() fails with `status` (which
  // must not be OK) before its first token.
  void fail_next(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(status));
  }
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }
  // Runs started on executors sharing this object (failed ones included).
  int64_t runs() const { return runs_.load(std::memory_order_acquire); }

  // For FakeExecutor: counts a run and takes the fault scripted for it, if any.
  bool take(Status& out) {
    runs_.fetch_add(1, std::memory_order_acq_rel);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return false;
    out = std::move(pending_.front());
    pending_.pop_front();
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::deque<Status> pending_;
  std::atomic<int64_t> runs_{0};
};

class FakeExecutor final : public Executor {
 public:
  FakeExecutor(Env& env, FakeSpeed speed, std::shared_ptr<FakeFaults> faults = nullptr)
      : env_(env), speed_(speed), faults_(faults ? std::move(faults) : std::make_shared<FakeFaults>()) {}

  // Explicit test fault injection (see FakeFaults::fail_next): shared with
  // every executor built on the same FakeFaults.
  void fail_next(Status status) { faults_->fail_next(std::move(status)); }
  FakeFaults& faults() { return *faults_; }
  const FakeSpeed& speed() const { return speed_; }

  Result<ExecOutcome> run(const ExecJob& job, const std::function<void(std::string_view)>& on_text,
                          const std::function<void(int32_t)>& on_token, const std::atomic<bool>& cancel) override {
    Status fault;
    if (faults_->take(fault)) return fault;
    auto cancelled = [] {
      return Status(StatusCode::kCancelled, "request cancelled", FailureReason::kCancelled);
    };
    if (cancel.load(std::memory_order_acquire)) return cancelled();
    env_.sleep_for_ns(ns_for(static_cast<double>(job.prompt.size()), speed_.prefill_tps));
    const int32_t limit = speed_.stop_after > 0 ? std::min(job.max_tokens, speed_.stop_after) : job.max_tokens;
    int32_t n = 0;
    while (n < limit) {
      // Token boundary: the previous token (or the prefill) is complete.
      if (cancel.load(std::memory_order_acquire)) return cancelled();
      env_.sleep_for_ns(ns_for(1.0, speed_.decode_tps));
      std::string piece = "t";
      piece += std::to_string(n);
      piece += ' ';
      on_text(piece);
      ++n;
      on_token(n);
    }
    ExecOutcome out;
    out.completion_tokens = n;
    out.finish = (speed_.stop_after > 0 && n == speed_.stop_after && n < job.max_tokens) ? FinishReason::kStop
                                                                                        : FinishReason::kLength;
    return out;
  }

  // Simulated nanoseconds for `units` at `per_second` (free when the speed is 0).
  static int64_t ns_for(double units, double per_second) {
    if (per_second <= 0 || units <= 0) return 0;
    return static_cast<int64_t>(std::llround(units * 1e9 / per_second));
  }

 private:
  Env& env_;
  const FakeSpeed speed_;
  std::shared_ptr<FakeFaults> faults_;
};

// `n` executors of one speed sharing one FakeFaults (a path's workers).
inline std::vector<std::unique_ptr<Executor>> make_fake_executors(Env& env, int n, FakeSpeed speed,
                                                                  const std::shared_ptr<FakeFaults>& faults) {
  std::vector<std::unique_ptr<Executor>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<FakeExecutor>(env, speed, faults));
  return out;
}

}  // namespace spw::serve::testing
