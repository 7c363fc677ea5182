// StepBatcher: continuous batching of decode steps across the sessions of
// one session group, without changing how a request is generated.
//
// Contract: each worker thread keeps generating its own request with its own
// Generator and Session; while a worker is in its decode loop its session is
// a member (join() returns a Membership; its destruction leaves, also on an
// early return). A member's one-token Session::eval goes to step(), which
// waits for the other members' next tokens and runs one Session::eval_batch
// for all that arrived: the weights are streamed once per step instead of
// once per stream. A step starts when every member has arrived, or when the
// oldest waiting token has waited max_wait (a member busy with host work: a
// journal write, a slow client callback), so one straggler delays the others
// by at most max_wait and never blocks them. Whoever finds the step ready
// runs it (no thread of its own); tokens arriving meanwhile wait for the
// next step. Prefill (eval of several tokens) never goes through here: a new
// request's prompt runs on its own thread beside the steps, sharing the
// backend's thread pool with them one parallel region (a ubatch of
// SessionOptions::n_ubatch tokens, a step) at a time, so a long prompt
// delays running streams by one ubatch per step, not by its whole prefill;
// n_ubatch is the trade-off between its time to first token and their
// inter-token latency.
// A session's outcome is what its own eval would give (Session::eval_batch:
// bitwise on the CPU), so batching changes timing, never tokens.
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
  uint64_t steps = 0;      // eval_batch calls
  uint64_t tokens = 0;     // tokens decoded through them
  int32_t max_batch = 0;   // largest step so far
  uint64_t straggler_steps = 0;  // started by max_wait with members missing
};

class StepBatcher {
 public:
  explicit StepBatcher(Env& env, int64_t max_wait_ns = 1'000'000);
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
  // The session's one-token evals go through this batcher until the
  // Membership is destroyed.
  Membership join(Session& session);

  // Called by Session::eval for a member: its token, decoded with whatever
  // other members' tokens arrive for the same step.
  Result<std::span<const float>> step(Session& session, TokenId token);

  StepBatcherStats stats() const;
  int32_t members() const;

 private:
  struct Entry {
    Session* session;
    TokenId token;
    Status status;
    bool done = false;
  };
  void leave(Session& session);

  Env& env_;
  const int64_t max_wait_ns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int32_t members_ = 0;
  std::vector<Entry*> pending_;
  int64_t oldest_ns_ = 0;  // arrival of pending_.front()
  bool running_ = false;
  StepBatcherStats stats_;
};

}  // namespace spw
