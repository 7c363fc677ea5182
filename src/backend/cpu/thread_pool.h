// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// Contract: ThreadPool(n) starts n-1 workers; the calling thread is the n-th
// participant of every parallel_for. parallel_for(n_items, fn) calls
// fn(begin, end) over disjoint contiguous ranges covering [0, n_items) and
// returns when all calls have finished. Ranges are claimed dynamically (4 per
// thread, shrinking toward the end when there are 8 or more items per
// thread), so a worker that the OS has descheduled does not stall the
// caller; callers must therefore make fn's result independent of which thread
// runs which range (the kernels split rows and tokens, never a reduction, so results are
// bitwise independent of the thread count). Idle workers block on a condition
// variable after a short spin (no CPU burnt when idle).
// Thread safety: parallel_for may be called from several threads; calls are
// serialised (one parallel region at a time). fn must not call parallel_for on
// the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spw {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }
  void parallel_for(int64_t n_items, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_main();
  // Claims and runs chunks of job `gen` until none are left.
  void run_chunks(uint64_t gen);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises parallel_for callers

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};  // bumped per job (wakes workers)
  // Claim word: job generation (24 bits) | chunk count (20) | next chunk (20).
  // Claiming is a CAS on this word, so a late worker can never claim a chunk
  // of a job other than the one it read.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // chunks finished in the current job
  std::atomic<bool> stop_{false};  // set under mu_ so waiters cannot miss it
  // The current job; written before claim_ is published (release) and read
  // only by a thread holding a claimed, unfinished chunk of that job.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_items_ = 0;
};

}  // namespace spw
