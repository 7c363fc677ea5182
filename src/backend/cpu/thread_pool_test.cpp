#include "backend/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

namespace spw {
namespace {

TEST(ThreadPool, CoversEveryItemOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    // Below, at and above the guided split's threshold (8 items per thread).
    for (int64_t n : {1, 2, 7, 15, 16, 17, 24, 31, 32, 33, 1000}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (int rep = 0; rep < 50; ++rep) {
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
        });
      }
      for (int h : hits) ASSERT_EQ(h, 50) << threads << " threads, n=" << n;
    }
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int i = 0; i < 200; ++i)
      pool.parallel_for(10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 10);
}

TEST(ThreadPool, IdleThenWork) {
  ThreadPool pool(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers go to sleep
  std::atomic<int> n{0};
  pool.parallel_for(2, [&](int64_t b, int64_t e) { n.fetch_add(static_cast<int>(e - b)); });
  EXPECT_EQ(n.load(), 2);
}

TEST(ThreadPool, IdleWorkersDoNotBurnCpu) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  pool.parallel_for(2, [&](int64_t b, int64_t e) { n.fetch_add(static_cast<int>(e - b)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the spin phase end
  const std::clock_t c0 = std::clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  EXPECT_LT(cpu_ms, 60.0) << "workers spin while idle";
  EXPECT_EQ(n.load(), 2);
}

}  // namespace
}  // namespace spw
