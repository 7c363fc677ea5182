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
//     With job.logprobs >= 0 its text carries one entry (fake_logprobs(k,
//     job.logprobs)), unless k < job.logprobs_sent (the client has it).
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
//     and failover tests can script device faults; fail_after(k, status)
//     makes the next run fail after it emitted k tokens (a fault
//     mid-stream). Faults queue up: n calls fail the next n runs, in order.
//     Nothing else ever fails.
//   - Checkpoints: the model is `fingerprint` (default "fake-model") and
//     token k's id is k, so a checkpoint after n tokens holds the prompt and
//     ids 0..n-1 and the text "t0 ... t<n-1> ". One is reported every
//     job.checkpoint_every tokens and, when a run fails after its first
//     token, at the failing boundary (or the last safe one when
//     job.safe_points says that boundary is not safe). A job with `resume`
//     continues at token resume->n_generated (its prefill costs the
//     checkpoint's tokens); job.replay is regenerated and compared, not
//     emitted (a difference fails with kReplayMismatch).
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
#include "engine/checkpoint.h"
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
  void fail_next(Status status) { fail_after(0, std::move(status)); }
  // Explicit test fault injection: the next run() fails with `status` after
  // it emitted `tokens` tokens (0: before the first).
  void fail_after(int32_t tokens, Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({tokens, std::move(status)});
  }
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }
  // Runs started on executors sharing this object (failed ones included).
  int64_t runs() const { return runs_.load(std::memory_order_acquire); }

  // For FakeExecutor: counts a run and takes the fault scripted for it, if any.
  bool take(Status& out, int32_t& after_tokens) {
    runs_.fetch_add(1, std::memory_order_acq_rel);
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return false;
    after_tokens = pending_.front().first;
    out = std::move(pending_.front().second);
    pending_.pop_front();
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::deque<std::pair<int32_t, Status>> pending_;
  std::atomic<int64_t> runs_{0};
};

class FakeExecutor final : public Executor {
 public:
  FakeExecutor(Env& env, FakeSpeed speed, std::shared_ptr<FakeFaults> faults = nullptr,
               std::string fingerprint = "fake-model")
      : env_(env),
        speed_(speed),
        faults_(faults ? std::move(faults) : std::make_shared<FakeFaults>()),
        fingerprint_(std::move(fingerprint)) {}

  // Explicit test fault injection (see FakeFaults::fail_next): shared with
  // every executor built on the same FakeFaults.
  void fail_next(Status status) { faults_->fail_next(std::move(status)); }
  FakeFaults& faults() { return *faults_; }
  const FakeSpeed& speed() const { return speed_; }

  // The text of tokens [0, n): what an uninterrupted run emits.
  static std::string text_of(int32_t n) {
    std::string out;
    for (int32_t k = 0; k < n; ++k) out += piece(k);
    return out;
  }

  Result<ExecOutcome> run(const ExecJob& job, const ExecCallbacks& cb, const std::atomic<bool>& cancel) override {
    Status fault;
    int32_t fail_after = -1;
    if (faults_->take(fault, fail_after) && fail_after == 0) return fault;
    auto cancelled = [] {
      return Status(StatusCode::kCancelled, "request cancelled", FailureReason::kCancelled);
    };
    if (cancel.load(std::memory_order_acquire)) return cancelled();
    std::vector<TokenId> tokens = job.resume ? job.resume->tokens : job.prompt;
    const int32_t n_prompt = job.resume ? job.resume->n_prompt : static_cast<int32_t>(job.prompt.size());
    std::string text = job.resume ? job.resume->text : std::string();
    int32_t n = job.resume ? job.resume->n_generated : 0;
    env_.sleep_for_ns(ns_for(static_cast<double>(tokens.size()), speed_.prefill_tps));
    auto checkpoint = [&] {
      auto cp = std::make_shared<Checkpoint>();
      cp->model_fingerprint = fingerprint_;
      cp->tokens = tokens;
      cp->n_prompt = n_prompt;
      cp->n_generated = n;
      cp->text = text;
      cp->options.max_tokens = job.max_tokens;
      cp->options.sampler = job.sampler;
      cp->options.stop = job.stop;
      return std::shared_ptr<const Checkpoint>(std::move(cp));
    };
    std::shared_ptr<const Checkpoint> last_safe = job.resume;
    if (!last_safe && !job.safe_points.empty()) last_safe = checkpoint();
    auto report = [&](bool at_failure) {
      if (!cb.on_checkpoint) return;
      auto cp = checkpoint();
      if (check_safe_point(*cp, job.safe_points).ok()) {
        last_safe = cp;
        cb.on_checkpoint(std::move(cp));
      } else if (at_failure && last_safe) {
        cb.on_checkpoint(last_safe);
      }
    };
    const int32_t limit = speed_.stop_after > 0 ? std::min(job.max_tokens, speed_.stop_after) : job.max_tokens;
    size_t replayed = 0;
    int32_t this_run = 0;
    while (n < limit) {
      // Token boundary: the previous token (or the prefill) is complete.
      if (fail_after > 0 && this_run == fail_after) {
        report(/*at_failure=*/true);
        return fault;
      }
      if (cancel.load(std::memory_order_acquire)) return cancelled();
      env_.sleep_for_ns(ns_for(1.0, speed_.decode_tps));
      std::string p = piece(n);
      tokens.push_back(n);
      text += p;
      std::string_view out(p);
      if (replayed < job.replay.size()) {
        const size_t k = std::min(out.size(), job.replay.size() - replayed);
        if (out.substr(0, k) != std::string_view(job.replay).substr(replayed, k)) {
          return Status(StatusCode::kFailedPrecondition, "fake: replay differs", FailureReason::kReplayMismatch);
        }
        replayed += k;
        out.remove_prefix(k);
      }
      std::vector<TokenLogprobs> lp;
      if (job.logprobs >= 0 && n >= job.logprobs_sent) lp.push_back(fake_logprobs(n, job.logprobs));
      if (!out.empty() || !lp.empty()) cb.on_text(out, lp);
      ++n;
      ++this_run;
      if (cb.on_token) cb.on_token(n);
      if (job.checkpoint_every > 0 && n % job.checkpoint_every == 0 && n < limit) report(/*at_failure=*/false);
    }
    if (replayed < job.replay.size()) {
      return Status(StatusCode::kFailedPrecondition, "fake: replay longer than the run", FailureReason::kReplayMismatch);
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
  // Token k's entry: id k, log-probability -(k + 1) / 1000, its piece, and
  // n_top alternatives (k first, then k + 1, ...), each 0.5 less likely.
  static TokenLogprobs fake_logprobs(int32_t k, int32_t n_top) {
    TokenLogprobs e;
    e.index = k;
    e.token = {k, -(k + 1) / 1000.0, piece(k)};
    for (int32_t i = 0; i < n_top; ++i) e.top.push_back({k + i, e.token.logprob - 0.5 * i, piece(k + i)});
    return e;
  }
  static std::string piece(int32_t k) {
    // Appended piecewise: GCC 12 warns (-Wrestrict, a false positive) on "t" + to_string(k).
    std::string p = "t";
    p += std::to_string(k);
    p += ' ';
    return p;
  }

  Env& env_;
  const FakeSpeed speed_;
  std::shared_ptr<FakeFaults> faults_;
  const std::string fingerprint_;
};

// `n` executors of one speed sharing one FakeFaults (a path's workers).
inline std::vector<std::unique_ptr<Executor>> make_fake_executors(Env& env, int n, FakeSpeed speed,
                                                                  const std::shared_ptr<FakeFaults>& faults,
                                                                  const std::string& fingerprint = "fake-model") {
  std::vector<std::unique_ptr<Executor>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<FakeExecutor>(env, speed, faults, fingerprint));
  return out;
}

}  // namespace spw::serve::testing
