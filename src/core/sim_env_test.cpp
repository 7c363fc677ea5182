#include "core/sim_env.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace spw {
namespace {

using namespace std::chrono_literals;

// Real-time bound on every wait in these tests: generous, since a correct run
// never comes near it, and it turns a lost wake-up into a failure, not a hang.
constexpr std::chrono::milliseconds kRealTimeout = 10s;
constexpr int64_t kStart = 1'000'000'000;

// A thread the test can wait for in real time. If it has not finished when the
// Worker is destroyed (a wake-up was lost), the process aborts: a hung thread
// cannot be joined, and the suite must not hang.
class Worker {
 public:
  explicit Worker(std::function<void()> fn)
      : done_(finished_.get_future()), thread_([this, fn = std::move(fn)] {
          fn();
          finished_.set_value();
        }) {}
  ~Worker() {
    if (!finished_within(kRealTimeout)) {
      std::fprintf(stderr, "sim_env_test: a worker thread hung (lost wake-up)\n");
      std::abort();
    }
    thread_.join();
  }
  bool finished_within(std::chrono::milliseconds t) { return done_.wait_for(t) == std::future_status::ready; }

 private:
  std::promise<void> finished_;
  std::future<void> done_;
  std::thread thread_;
};

TEST(SimEnvTest, ClockWallTimeAndRandomAreDeterministic) {
  SimEnv env;
  EXPECT_EQ(env.now_ns(), kStart);
  const int64_t wall0 = env.wall_time_ms();
  env.advance(5'000'000);
  EXPECT_EQ(env.now_ns(), kStart + 5'000'000);
  EXPECT_EQ(env.wall_time_ms(), wall0 + 5);
  env.advance_to(kStart);  // backwards: no-op
  env.advance(-7);
  EXPECT_EQ(env.now_ns(), kStart + 5'000'000);
  EXPECT_EQ(env.next_deadline_ns(), -1);
  EXPECT_FALSE(env.advance_to_next());

  SimEnv custom(SimEnvOptions{.start_ns = 42, .wall_epoch_ms = 1000, .seed = 7});
  EXPECT_EQ(custom.now_ns(), 42);
  EXPECT_EQ(custom.wall_time_ms(), 1000);

  SimEnv a(SimEnvOptions{.seed = 7}), b(SimEnvOptions{.seed = 7}), c(SimEnvOptions{.seed = 8});
  bool differs = false;
  for (int i = 0; i < 16; ++i) {
    const uint64_t x = a.random_u64();
    EXPECT_EQ(x, b.random_u64());
    differs |= x != c.random_u64();
  }
  EXPECT_TRUE(differs);
}

TEST(SimEnvTest, FilesGoToTheRealFilesystem) {
  SimEnv env;
  std::string path = (std::filesystem::temp_directory_path() / "spw_sim_env_test.txt").string();
  ASSERT_TRUE(env.write_file(path, "hello").ok());
  EXPECT_TRUE(env.file_exists(path));
  auto read = env.read_file(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "hello");
  auto mapped = env.map_file(path);
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ((*mapped)->size(), 5u);
  std::filesystem::remove(path);
}

TEST(SimEnvTest, SleepWakesExactlyAtItsDeadline) {
  SimEnv env;
  std::atomic<bool> woke{false};
  std::atomic<int64_t> woke_at{0};
  Worker sleeper([&] {
    env.sleep_for_ns(100);
    woke_at = env.now_ns();
    woke = true;
  });
  ASSERT_TRUE(env.wait_for_waiters(1, kRealTimeout));
  EXPECT_EQ(env.next_deadline_ns(), kStart + 100);
  env.advance(99);
  // Still blocked: still counted, and re-checking the clock did not let it go.
  EXPECT_EQ(env.waiters(), 1);
  EXPECT_FALSE(sleeper.finished_within(0ms));
  EXPECT_FALSE(woke);
  env.advance(1);
  ASSERT_TRUE(sleeper.finished_within(kRealTimeout));
  EXPECT_EQ(woke_at, kStart + 100);
  EXPECT_EQ(env.waiters(), 0);
  env.sleep_for_ns(0);  // returns at once
  env.sleep_for_ns(-5);
}

TEST(SimEnvTest, TimedWaitReturnsFalseAtTheDeadline) {
  SimEnv env;
  std::mutex mu;
  std::condition_variable cv;
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(env.wait_until_ns(lock, cv, kStart));  // already reached: at once
    EXPECT_TRUE(lock.owns_lock());
  }
  std::atomic<int> result{-1};
  std::atomic<int64_t> returned_at{0};
  Worker waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    bool r = env.wait_until_ns(lock, cv, kStart + 1000);
    EXPECT_TRUE(lock.owns_lock());
    returned_at = env.now_ns();
    result = r ? 1 : 0;
  });
  ASSERT_TRUE(env.wait_for_waiters(1, kRealTimeout));
  EXPECT_EQ(env.next_deadline_ns(), kStart + 1000);
  env.advance(999);
  EXPECT_FALSE(waiter.finished_within(0ms));
  EXPECT_EQ(env.waiters(), 1);
  EXPECT_TRUE(env.advance_to_next());
  ASSERT_TRUE(waiter.finished_within(kRealTimeout));
  EXPECT_EQ(result, 0);
  EXPECT_EQ(returned_at, kStart + 1000);
}

TEST(SimEnvTest, TimedWaitReturnsTrueWhenNotifiedEarlier) {
  SimEnv env;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;  // guarded by mu
  std::atomic<int> bare{-1}, with_pred{-1};
  Worker waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    // The clock never moves in this test, so any wake-up is "before the
    // deadline": the bare wait returns true.
    bare = env.wait_until_ns(lock, cv, kStart + 1000) ? 1 : 0;
    with_pred = env.wait_until_ns(lock, cv, kStart + 1000, [&] { return ready; }) ? 1 : 0;
  });
  ASSERT_TRUE(env.wait_for_waiters(1, kRealTimeout));
  { std::lock_guard<std::mutex> g(mu); }  // the waiter is inside cv.wait
  cv.notify_all();
  const auto until = std::chrono::steady_clock::now() + kRealTimeout;
  while (bare == -1) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the notify did not wake the timed wait";
    std::this_thread::yield();
  }
  // The second wait registers anew (the first one left and stopped counting).
  ASSERT_TRUE(env.wait_for_waiters(1, kRealTimeout));
  {
    std::lock_guard<std::mutex> g(mu);
    ready = true;
  }
  cv.notify_all();
  ASSERT_TRUE(waiter.finished_within(kRealTimeout));
  EXPECT_EQ(bare, 1);
  EXPECT_EQ(with_pred, 1);
  EXPECT_EQ(env.now_ns(), kStart);
  EXPECT_EQ(env.waiters(), 0);
}

TEST(SimEnvTest, PredicateWaitReturnsPredicateAtTheDeadline) {
  SimEnv env;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> result{-1};
  Worker waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    result = env.wait_until_ns(lock, cv, kStart + 50, [] { return false; }) ? 1 : 0;
  });
  ASSERT_TRUE(env.wait_for_waiters(1, kRealTimeout));
  env.advance(50);
  ASSERT_TRUE(waiter.finished_within(kRealTimeout));
  EXPECT_EQ(result, 0);
}

TEST(SimEnvTest, AdvanceToNextWakesThreadsInDeadlineOrder) {
  SimEnv env;
  std::mutex mu;  // guards woken; also the timed waiters' mutex
  std::condition_variable cv, woken_cv;
  std::vector<std::pair<int64_t, int64_t>> woken;  // (deadline, now when it ran)
  auto record = [&](int64_t deadline) {
    // Called with mu held.
    woken.emplace_back(deadline, env.now_ns());
    woken_cv.notify_all();
  };
  const int64_t deadlines[] = {400, 100, 300, 200, 250};
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < 5; ++i) {
    const int64_t d = kStart + deadlines[i];
    if (i % 2 == 0) {
      workers.push_back(std::make_unique<Worker>([&, d] {
        std::unique_lock<std::mutex> lock(mu);
        while (env.wait_until_ns(lock, cv, d)) {
        }
        record(d);
      }));
    } else {
      workers.push_back(std::make_unique<Worker>([&, d] {
        env.sleep_for_ns(d - env.now_ns());
        std::lock_guard<std::mutex> lock(mu);
        record(d);
      }));
    }
  }
  ASSERT_TRUE(env.wait_for_waiters(5, kRealTimeout));
  const int64_t expected[] = {100, 200, 250, 300, 400};
  for (size_t k = 0; k < 5; ++k) {
    // Waiters share cv, so a deadline's notify_all also wakes the later ones,
    // which re-register: wait until they have before reading the next deadline.
    ASSERT_TRUE(env.wait_for_waiters(static_cast<int>(5 - k), kRealTimeout));
    EXPECT_EQ(env.next_deadline_ns(), kStart + expected[k]);
    ASSERT_TRUE(env.advance_to_next());
    EXPECT_EQ(env.now_ns(), kStart + expected[k]);
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(woken_cv.wait_for(lock, kRealTimeout, [&] { return woken.size() == k + 1; }));
    EXPECT_EQ(woken[k].first, kStart + expected[k]);
    EXPECT_EQ(woken[k].second, kStart + expected[k]);
  }
  EXPECT_FALSE(env.advance_to_next());
  EXPECT_EQ(env.next_deadline_ns(), -1);
}

// A waiter, a notifier and an advance race; the waiter owns its mutex and cv
// and destroys them as soon as it is done, so an advance that used them after
// the wait returned would be a use-after-free (TSan reports it). Whichever
// comes first, the waiter must return.
TEST(SimEnvTest, NotifyRacingWithAdvanceNeverLosesAWakeUp) {
  SimEnv env;
  int by_notify = 0, by_deadline = 0;
  for (int i = 0; i < 1000; ++i) {
    struct Box {
      std::mutex mu;
      std::condition_variable cv;
      bool flag = false;
    };
    auto* box = new Box;  // freed by the waiter, once neither other thread may touch it
    const int64_t deadline = env.now_ns() + 10;
    std::atomic<int> outcome{-1};
    {
      Worker waiter([&, box] {
        {
          std::unique_lock<std::mutex> lock(box->mu);
          bool woke = env.wait_until_ns(lock, box->cv, deadline, [&] { return box->flag; });
          outcome = woke ? 1 : 0;
          // Timed out first: the notifier may still be about to lock box->mu,
          // so wait for it before freeing the box.
          box->cv.wait(lock, [&] { return box->flag; });
        }
        delete box;
      });
      Worker notifier([box] {
        // Its last touch of box is this unlock, which the waiter's final
        // check of flag comes after.
        std::lock_guard<std::mutex> g(box->mu);
        box->flag = true;
        box->cv.notify_all();
      });
      if (i % 2 == 0) std::this_thread::yield();
      env.advance(10);
      ASSERT_TRUE(waiter.finished_within(kRealTimeout)) << "iteration " << i;
      ASSERT_TRUE(notifier.finished_within(kRealTimeout)) << "iteration " << i;
    }
    (outcome == 1 ? by_notify : by_deadline)++;
  }
  EXPECT_EQ(by_notify + by_deadline, 1000);
  EXPECT_EQ(env.waiters(), 0);
  std::printf("notify first: %d, deadline first: %d\n", by_notify, by_deadline);
}

TEST(SimEnvTest, WaitForWaitersTimesOutInRealTime) {
  SimEnv env;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(env.wait_for_waiters(1, 20ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
  EXPECT_TRUE(env.wait_for_waiters(0, 0ms));
}

TEST(EnvWaitTest, DefaultEnvTimesOutAfterARealDeadline) {
  Env& env = Env::default_env();
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  const int64_t t0 = env.now_ns();
  const int64_t deadline = t0 + 20'000'000;
  // Loop: a spurious wake-up returns true before the deadline.
  while (env.wait_until_ns(lock, cv, deadline)) {
  }
  EXPECT_TRUE(lock.owns_lock());
  EXPECT_GE(env.now_ns(), deadline);
  EXPECT_LT(env.now_ns() - t0, 5'000'000'000);
  EXPECT_FALSE(env.wait_until_ns(lock, cv, t0));  // already past: at once
  EXPECT_TRUE(env.wait_until_ns(lock, cv, deadline, [] { return true; }));  // predicate already holds
}

TEST(EnvWaitTest, DefaultEnvReturnsTrueWhenNotified) {
  Env& env = Env::default_env();
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  const int64_t t0 = env.now_ns();
  const int64_t deadline = t0 + 30'000'000'000;
  std::atomic<int> result{-1};
  Worker waiter([&] {
    std::unique_lock<std::mutex> lock(mu);
    result = env.wait_until_ns(lock, cv, deadline, [&] { return ready; }) ? 1 : 0;
  });
  std::this_thread::sleep_for(5ms);  // usually lets the waiter block first; either order must work
  {
    std::lock_guard<std::mutex> g(mu);
    ready = true;
  }
  cv.notify_all();
  ASSERT_TRUE(waiter.finished_within(kRealTimeout));
  EXPECT_EQ(result, 1);
  EXPECT_LT(env.now_ns(), deadline);
}

}  // namespace
}  // namespace spw
