// Channel<T>: a thread-safe FIFO between one or more producers and consumers.
//
// Contract: push() appends and wakes a waiting consumer; it never blocks (the
// scheduler's producers are engine workers, which must not be stalled by a slow
// HTTP client; the amount queued per request is bounded by its max_tokens).
// pop_for() waits at most `timeout` for an item. After close(), push() returns
// false and drops the item, while pop_for() still drains what was queued and
// then reports kClosed. Waits use the steady clock (a condition variable
// cannot wait on a simulated Env clock; timestamps elsewhere come from Env).
// Thread safety: all methods may be called concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

namespace spw::serve {

enum class PopResult { kItem, kTimeout, kClosed };

template <typename T>
class Channel {
 public:
  bool push(T value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      items_.push_back(std::move(value));
    }
    cv_.notify_one();
    return true;
  }

  template <typename Rep, typename Period>
  PopResult pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty() || closed_; })) {
      return PopResult::kTimeout;
    }
    if (items_.empty()) return PopResult::kClosed;
    out = std::move(items_.front());
    items_.pop_front();
    return PopResult::kItem;
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace spw::serve
