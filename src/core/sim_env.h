// SimEnv: an Env whose clock moves only when the test says so.
//
// Scheduling, timeout and failover logic takes an Env&; under a SimEnv a test
// drives it deterministically instead of sleeping:
//   - now_ns() is simulated time: it starts at SimEnvOptions::start_ns and
//     moves only by advance(ns) / advance_to(t) / advance_to_next(), never
//     backwards. wall_time_ms() is wall_epoch_ms + now_ns() / 1e6.
//   - sleep_for_ns(ns) blocks the calling thread until simulated time reaches
//     its deadline (now + ns when called); ns <= 0 returns at once.
//   - wait_until_ns(lock, cv, deadline) returns false at once when now >=
//     deadline; otherwise it waits on `cv` and returns true when woken by an
//     ordinary notify (or spuriously), false when an advance reaches the
//     deadline. No wake-up is lost: the waiter registers (under SimEnv's
//     mutex) while still holding its own lock, and advance() notifies a
//     waiter's cv while holding that waiter's mutex, so a notify cannot fall
//     between the registration and the wait.
//   - random_u64() is xoshiro256** seeded by SplitMix64 from
//     SimEnvOptions::seed: the same seed gives the same sequence.
//   - Files go to Env::default_env() (tests use real files).
// Test helpers: waiters() / wait_for_waiters(n, real_timeout) tell a test that
// its worker threads are blocked on the simulated clock (quiescent) before it
// advances; next_deadline_ns() / advance_to_next() step from deadline to
// deadline.
//
// Lock order: a waiter's own mutex (the one its lock holds), then SimEnv's
// internal mutex. advance() therefore collects the expired waiters under the
// internal mutex, lets go of it, and only then takes each waiter's mutex to
// notify. So that it never uses a waiter's mutex or cv after that waiter's
// wait_until_ns has returned (the caller may destroy them then), advance()
// holds a separate notify mutex for the whole collect-and-notify pass, and
// wait_until_ns, once woken, unregisters, drops the caller's lock, passes
// through the notify mutex (any advance that saw it has finished with it) and
// re-locks the caller's lock. Full order: notify mutex, waiter's mutex,
// internal mutex.
//
// Thread safety: every method may be called from any thread. advance*() must
// not be called while holding a mutex that a thread waits with in
// wait_until_ns (advance takes it to notify: self-deadlock), and a thread
// that sleeps on the clock while holding such a mutex blocks every advance()
// that does not itself reach that sleeper's deadline; concurrent advances are
// serialised. Destroy a SimEnv only when no thread is blocked in
// it. Failure: none (no method fails; advancing backwards is a no-op).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/rng.h"

namespace spw {

struct SimEnvOptions {
  int64_t start_ns = 1'000'000'000;          // now_ns() at construction
  int64_t wall_epoch_ms = 1'700'000'000'000;  // wall_time_ms() at now_ns() == 0
  uint64_t seed = 0;                          // random_u64() sequence
};

class SimEnv final : public Env {
 public:
  SimEnv() : SimEnv(SimEnvOptions{}) {}
  explicit SimEnv(const SimEnvOptions& options);
  ~SimEnv() override;
  SimEnv(const SimEnv&) = delete;
  SimEnv& operator=(const SimEnv&) = delete;

  int64_t now_ns() override;
  int64_t wall_time_ms() override;
  void sleep_for_ns(int64_t ns) override;
  using Env::wait_until_ns;  // keep the predicate overload visible on SimEnv
  bool wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, int64_t deadline_ns) override;
  uint64_t random_u64() override;

  using Env::map_file;
  Result<std::unique_ptr<MappedFile>> map_file(const std::string& path, const MapOptions& options) override;
  Result<std::string> read_file(const std::string& path) override;
  Status write_file(const std::string& path, std::string_view data) override;
  bool file_exists(const std::string& path) override;

  // Moves the clock forward by ns (ns <= 0: no-op) and wakes every sleeper and
  // timed waiter whose deadline it reaches; they have been notified (not
  // necessarily run yet) when it returns.
  void advance(int64_t ns);
  // Moves the clock to t (t <= now: no-op), as advance.
  void advance_to(int64_t t);
  // Advances exactly to next_deadline_ns(); false (clock unchanged) if none.
  bool advance_to_next();
  // The earliest deadline of a thread blocked on the clock, or -1 if none.
  int64_t next_deadline_ns() const;

  // Threads blocked in sleep_for_ns or wait_until_ns whose deadline is still
  // ahead. A timed waiter woken by its cv stops counting once it has run.
  int waiters() const;
  // Blocks in REAL time until waiters() >= n; false if real_timeout passes
  // first. The way to know workers are quiescent before advancing.
  bool wait_for_waiters(int n, std::chrono::milliseconds real_timeout);

 private:
  struct Waiter {
    int64_t deadline_ns;
    std::mutex* mu;                // the waiter's own mutex; null for sleep_for_ns
    std::condition_variable* cv;   // its cv; null for sleep_for_ns
  };

  // Moves now_ns_ to target(now_ns_) if that is later, then wakes the due.
  template <class Target>
  void advance_impl(Target target);
  void add_waiter_locked(Waiter* w);
  void remove_waiter_locked(Waiter* w);
  int pending_locked() const;

  const int64_t wall_epoch_ms_;
  // Held by advance*() across collect-and-notify, and passed through by a
  // woken timed waiter before it returns (see the header comment).
  std::mutex notify_mu_;
  mutable std::mutex mu_;  // guards everything below
  int64_t now_ns_;
  Rng rng_;  // xoshiro256** seeded by SplitMix64 (core/rng.h)
  std::vector<Waiter*> waiters_;        // blocked threads (their stack entries)
  std::condition_variable sleep_cv_;    // sleepers wait here on mu_
  std::condition_variable waiters_cv_;  // waiters_ grew (wait_for_waiters)
};

}  // namespace spw
