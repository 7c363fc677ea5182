// StepBatcher: continuous batching of a session group's decode steps and
// prompt chunks, without changing how a request is generated.
//
// Contract: each worker thread keeps generating its own request with its own
// Generator and Session; while a worker runs a request its session is a
// member (join() returns a Membership; its destruction leaves, also on an
// early return). A member's Session::eval goes to eval(), which waits for
// the other members' next tokens and runs one Session::eval_batch for all
// that arrived: the weights are streamed once per step instead of once per
// stream. A step starts when every member has arrived, or when the oldest
// waiting entry has waited max_wait (a member busy with host work: a journal
// write, a slow client callback), so one straggler delays the others by at
// most max_wait and never blocks them. Whoever finds the step ready runs it
// (no thread of its own); entries arriving meanwhile wait for the next step.
// Prefill is mixed into the steps (chunked prefill): a prompt of several
// tokens is fed to the steps a chunk at a time, each step taking every
// decode token that arrived plus, in arrival order, as many prompt tokens as
// fit in step_tokens (at least one for the oldest prompt, so a prompt always
// advances; another that does not fit waits for the next step). A long
// prompt therefore costs the streams already running one step of at most
// step_tokens rows per token they decode, not its whole prefill; step_tokens
// is the trade-off between its time to first token (larger chunks, fewer
// steps) and their inter-token latency (smaller steps). A step holds at most
// max(step_tokens, members) rows: admission prices a path's scratch for that.
// An eval of several tokens reserves their KV first and is all or nothing,
// as Session::eval: a failed chunk truncates the session back to where the
// eval began.
// A session's outcome is what its own eval would give (Session::eval_batch:
// bitwise on one backend), so batching changes timing, never tokens.
// Times (max_wait) are on the Env's clock.
// Thread safety: every method may be called from any thread; a Session is
// joined by one thread at a time (the one generating with it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "engine/session.h"

namespace spw {

struct StepBatcherStats {
  uint64_t steps = 0;            // eval_batch calls
  uint64_t tokens = 0;           // decode tokens through them
  uint64_t prompt_tokens = 0;    // prompt tokens through them
  uint64_t mixed_steps = 0;      // steps with prompt and decode tokens
  int32_t max_batch = 0;         // most sequences in one step
  int32_t max_rows = 0;          // most tokens (rows) in one step
  uint64_t straggler_steps = 0;  // started by max_wait with members missing
};

struct StepBatcherOptions {
  int64_t max_wait_ns = 1'000'000;
  int32_t step_tokens = 64;  // rows per step when a prompt is mixed in (>= 1)
  // false: a prompt runs on its member's thread beside the steps (its
  // session leaves the count of members meanwhile, so no step waits for
  // it), sharing the backend's thread pool one ubatch at a time. For
  // comparison (bench/batching_bench); the server mixes.
  bool mix_prefill = true;
};

class StepBatcher {
 public:
  explicit StepBatcher(Env& env, StepBatcherOptions options = {});
  StepBatcher(const StepBatcher&) = delete;
  StepBatcher& operator=(const StepBatcher&) = delete;

  class Membership {
   public:
    Membership() = default;
    Membership(Membership&& o) noexcept : batcher_(o.batcher_), session_(o.session_) { o.batcher_ = nullptr; }
    Membership& operator=(Membership&&) = delete;
    ~Membership();

   private:
    friend class StepBatcher;
    Membership(StepBatcher* b, Session* s) : batcher_(b), session_(s) {}
    StepBatcher* batcher_ = nullptr;
    Session* session_ = nullptr;
  };
  // The session's evals go through this batcher until the Membership is
  // destroyed.
  Membership join(Session& session);

  // Called by Session::eval for a member: its tokens, evaluated with whatever
  // other members' tokens arrive for the same steps (one step for a decode
  // token, a chunk per step for a prompt). The last token's logits.
  Result<std::span<const float>> eval(Session& session, std::span<const TokenId> tokens);

  StepBatcherStats stats() const;
  int32_t members() const;

 private:
  struct Entry {
    Session* session = nullptr;
    std::span<const TokenId> tokens;  // what is left to evaluate
    int32_t taken = 0;                 // tokens the step took
    Status status;
    bool done = false;
  };
  // Waits for a step that takes some of e's tokens (e.taken of them).
  Status step(Entry& e);
  void leave(Session& session);

  Env& env_;
  const int64_t max_wait_ns_;
  const int32_t step_tokens_;
  const bool mix_prefill_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int32_t members_ = 0;
  std::vector<Entry*> pending_;
  int64_t oldest_ns_ = 0;  // arrival of pending_.front()
  bool running_ = false;
  StepBatcherStats stats_;
};

}  // namespace spw
