// TimedMutex: a mutex whose lock can be given up after a deadline
// (try_lock_for), for the waits that can reach a device that may hang.
//
// Why not std::timed_mutex: libstdc++ implements its try_lock_for with
// pthread_mutex_clocklock, which ThreadSanitizer (GCC 12) does not intercept.
// TSan then sees no happens-before edge between the holders of the lock and
// reports every access it guards as a race (and halts the process under
// halt_on_error). This one is a std::mutex and a condition variable, which
// every sanitizer understands. The lock is not fair and not recursive.
//
// Meets Lockable and TimedLockable for the durations used here, so
// std::lock_guard / std::unique_lock work with it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace spw {

class TimedMutex {
 public:
  TimedMutex() = default;
  TimedMutex(const TimedMutex&) = delete;
  TimedMutex& operator=(const TimedMutex&) = delete;

  void lock() {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return !held_; });
    held_ = true;
  }

  bool try_lock() {
    std::lock_guard<std::mutex> lk(m_);
    if (held_) return false;
    held_ = true;
    return true;
  }

  // Waits on the steady clock: a device's hang is real time, not the Env's.
  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& d) {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, d, [&] { return !held_; })) return false;
    held_ = true;
    return true;
  }

  void unlock() {
    {
      std::lock_guard<std::mutex> lk(m_);
      held_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool held_ = false;
};

}  // namespace spw
