#include "backend/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPW_PAUSE() _mm_pause()
#else
#define SPW_PAUSE() std::this_thread::yield()
#endif

namespace spw {

namespace {
// A few microseconds of spinning: long enough to catch the next matmul of the
// same token, short enough that an idle pool sleeps almost at once.
constexpr int kSpinIters = 4000;
constexpr int kChunksPerThread = 4;
constexpr uint64_t kGenMask = (1ull << 24) - 1;
constexpr uint64_t kFieldMask = (1ull << 20) - 1;

// Where chunk i of k begins in [0, n). With at least 8 items per chunk, the
// chunks shrink toward the end (guided): of k = 4T chunks for T threads, the
// first T take 4/8T of the items each, the next T 2/8T, the last 2T 1/8T. A
// thread that finds no chunk left then waits on a chunk of 1/8T of the
// work at most instead of 1/4T, which is most of what an even split loses to
// the barrier at the end of each matmul of a decode step. Which thread runs
// which range never changes a result (see the contract).
int64_t chunk_begin(int64_t n, int64_t k, int64_t i, bool guided) {
  if (!guided) return n * i / k;
  const int64_t t = k / 4;
  const int64_t units = 4 * std::min(i, t) + 2 * std::clamp<int64_t>(i - t, 0, t) + std::clamp<int64_t>(i - 2 * t, 0, 2 * t);
  return n * units / (8 * t);
}

uint64_t pack(uint64_t gen, uint64_t chunks, uint64_t next) {
  return ((gen & kGenMask) << 40) | (chunks << 20) | next;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(uint64_t gen) {
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    if ((c >> 40) != (gen & kGenMask)) return;  // a different job
    const uint64_t chunks = (c >> 20) & kFieldMask;
    const uint64_t next = c & kFieldMask;
    if (next >= chunks) return;  // all claimed
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Holding an unfinished chunk: the caller is still waiting, job_ is stable.
    const int64_t n = job_items_;
    const int64_t k = static_cast<int64_t>(chunks);
    const int64_t i = static_cast<int64_t>(next);
    const bool guided = k % 4 == 0 && n >= 2 * k;
    const int64_t begin = chunk_begin(n, k, i, guided);
    const int64_t end = chunk_begin(n, k, i + 1, guided);
    if (begin < end) (*job_)(begin, end);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == k) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::worker_main() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIters && gen == seen; ++i) {
      SPW_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] {
        return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_acquire);
      });
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen;
    run_chunks(gen);
  }
}

void ThreadPool::parallel_for(int64_t n_items, const std::function<void(int64_t, int64_t)>& fn) {
  if (n_items <= 0) return;
  if (n_threads_ == 1 || n_items == 1) {
    fn(0, n_items);
    return;
  }
  std::lock_guard<std::mutex> call_lk(call_mu_);
  const int64_t chunks = std::min<int64_t>(n_items, static_cast<int64_t>(n_threads_) * kChunksPerThread);
  job_ = &fn;
  job_items_ = n_items;
  done_.store(0, std::memory_order_relaxed);
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    gen = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store(pack(gen, static_cast<uint64_t>(chunks), 0), std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
  }
  work_cv_.notify_all();
  run_chunks(gen);
  for (int i = 0; i < kSpinIters && done_.load(std::memory_order_acquire) != chunks; ++i) SPW_PAUSE();
  if (done_.load(std::memory_order_acquire) != chunks) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == chunks; });
  }
}

}  // namespace spw
