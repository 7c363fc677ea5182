#include "core/sim_env.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>


namespace spw {
namespace {

constexpr int64_t kMaxNs = std::numeric_limits<int64_t>::max();

// a + b for b > 0, pinned at the largest time instead of overflowing.
int64_t saturating_add(int64_t a, int64_t b) { return a > kMaxNs - b ? kMaxNs : a + b; }

}  // namespace

SimEnv::SimEnv(const SimEnvOptions& options)
    : wall_epoch_ms_(options.wall_epoch_ms), now_ns_(options.start_ns), rng_(options.seed) {}

SimEnv::~SimEnv() {
  std::lock_guard<std::mutex> g(mu_);
  assert(waiters_.empty() && "SimEnv destroyed while a thread is blocked on its clock");
}

int64_t SimEnv::now_ns() {
  std::lock_guard<std::mutex> g(mu_);
  return now_ns_;
}

int64_t SimEnv::wall_time_ms() { return wall_epoch_ms_ + now_ns() / 1'000'000; }

void SimEnv::sleep_for_ns(int64_t ns) {
  if (ns <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  Waiter w{saturating_add(now_ns_, ns), nullptr, nullptr};
  add_waiter_locked(&w);
  // Sleepers wait on mu_ itself, so advance's notify_all after moving now_ns_
  // under mu_ cannot be missed.
  sleep_cv_.wait(lock, [&] { return now_ns_ >= w.deadline_ns; });
  remove_waiter_locked(&w);
}

bool SimEnv::wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, int64_t deadline_ns) {
  assert(lock.owns_lock());
  Waiter w{deadline_ns, lock.mutex(), &cv};
  {
    std::lock_guard<std::mutex> g(mu_);
    if (now_ns_ >= deadline_ns) return false;
    add_waiter_locked(&w);
  }
  // `lock` is still held: an advance that reaches the deadline from here on
  // must take lock.mutex() to notify, which it gets only once cv.wait has
  // released it, i.e. once this thread is waiting. No lost wake-up.
  cv.wait(lock);
  {
    std::lock_guard<std::mutex> g(mu_);
    remove_waiter_locked(&w);
  }
  // An advance may have collected this waiter before it was removed and may
  // still be about to lock lock.mutex() and notify cv; once this function
  // returns the caller may destroy both. Passing through notify_mu_ waits for
  // such an advance to finish. lock must be released first: advance holds
  // notify_mu_ while it takes the waiter's mutex.
  lock.unlock();
  { std::lock_guard<std::mutex> barrier(notify_mu_); }
  lock.lock();
  return now_ns() < deadline_ns;
}

uint64_t SimEnv::random_u64() {
  std::lock_guard<std::mutex> g(mu_);
  return rng_.next_u64();
}

Result<std::unique_ptr<MappedFile>> SimEnv::map_file(const std::string& path, const MapOptions& options) {
  return Env::default_env().map_file(path, options);
}
Result<std::string> SimEnv::read_file(const std::string& path) { return Env::default_env().read_file(path); }
Status SimEnv::write_file(const std::string& path, std::string_view data) {
  return Env::default_env().write_file(path, data);
}
bool SimEnv::file_exists(const std::string& path) { return Env::default_env().file_exists(path); }

void SimEnv::advance(int64_t ns) {
  if (ns <= 0) return;
  advance_impl([ns](int64_t now) { return saturating_add(now, ns); });
}

void SimEnv::advance_to(int64_t t) {
  advance_impl([t](int64_t) { return t; });
}

bool SimEnv::advance_to_next() {
  const int64_t t = next_deadline_ns();
  if (t < 0) return false;
  advance_to(t);  // a concurrent advance past t makes this a no-op
  return true;
}

template <class Target>
void SimEnv::advance_impl(Target target) {
  // notify_mu_ for the whole pass: a timed waiter does not return (and its
  // caller cannot destroy its mutex and cv) until this pass is over.
  std::lock_guard<std::mutex> pass(notify_mu_);
  std::vector<std::pair<std::mutex*, std::condition_variable*>> due;
  {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t t = target(now_ns_);
    if (t <= now_ns_) return;
    now_ns_ = t;
    for (const Waiter* w : waiters_) {
      if (w->mu == nullptr || w->deadline_ns > t) continue;
      const std::pair<std::mutex*, std::condition_variable*> key(w->mu, w->cv);
      // Waiters sharing a cv need one notify_all.
      if (std::find(due.begin(), due.end(), key) == due.end()) due.push_back(key);
    }
  }
  sleep_cv_.notify_all();
  // mu_ is released: the waiter's mutex comes before it in the lock order.
  // Notifying under the waiter's mutex is what makes the wake-up certain (see
  // wait_until_ns).
  for (auto [m, cv] : due) {
    std::lock_guard<std::mutex> g(*m);
    cv->notify_all();
  }
}

int64_t SimEnv::next_deadline_ns() const {
  std::lock_guard<std::mutex> g(mu_);
  int64_t next = -1;
  for (const Waiter* w : waiters_) {
    if (w->deadline_ns > now_ns_ && (next < 0 || w->deadline_ns < next)) next = w->deadline_ns;
  }
  return next;
}

int SimEnv::waiters() const {
  std::lock_guard<std::mutex> g(mu_);
  return pending_locked();
}

bool SimEnv::wait_for_waiters(int n, std::chrono::milliseconds real_timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return waiters_cv_.wait_for(lock, real_timeout, [&] { return pending_locked() >= n; });
}

void SimEnv::add_waiter_locked(Waiter* w) {
  waiters_.push_back(w);
  waiters_cv_.notify_all();
}

void SimEnv::remove_waiter_locked(Waiter* w) {
  auto it = std::find(waiters_.begin(), waiters_.end(), w);
  assert(it != waiters_.end());
  waiters_.erase(it);
}

int SimEnv::pending_locked() const {
  // A waiter whose deadline has passed is about to run, not blocked.
  return static_cast<int>(
      std::count_if(waiters_.begin(), waiters_.end(), [&](const Waiter* w) { return w->deadline_ns > now_ns_; }));
}

}  // namespace spw
