// ModelResidency over a real DeviceLedger (100 MB, no headroom) with models
// whose "unload" records the call: loads that fit, LRU eviction of idle
// models, pinned and running models kept, the minimum residency turning
// alternation into runs, keep-alive expiry, cancellation while waiting, and
// what admission is told (plan). Real clock; every wait is bounded.
#include "gateway/residency.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace spw::gateway {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMB = 1'000'000;

struct Fixture {
  explicit Fixture(ResidencyOptions o = {}) {
    auto l = admission::DeviceLedger::create("dev", 100 * kMB);
    ledger = std::shared_ptr<admission::DeviceLedger>(std::move(l).value());
    residency = std::make_shared<ModelResidency>(Env::default_env(), std::move(o));
  }
  void add(const std::string& name, uint64_t mb, bool pinned = false, std::optional<double> keep_alive = {}) {
    ASSERT_TRUE(residency->add(name, name, {{ledger, mb * kMB}}, pinned, keep_alive, 10).ok());
    residency->bind(name, [this, name] {
      std::lock_guard<std::mutex> lk(mu);
      unloads.push_back(name);
      return true;
    }, nullptr);
  }
  // One whole run of `name` (begin, loaded, end).
  Status run(const std::string& name) {
    Status st = residency->begin_run(name, no_cancel);
    if (!st.ok()) return st;
    residency->loaded(name, 5);
    residency->end_run(name, true);
    return st;
  }
  ResidentModelInfo info(const std::string& name) const {
    for (const ResidentModelInfo& i : residency->list())
      if (i.name == name) return i;
    return {};
  }
  std::vector<std::string> unloaded() {
    std::lock_guard<std::mutex> lk(mu);
    return unloads;
  }

  std::shared_ptr<admission::DeviceLedger> ledger;
  std::shared_ptr<ModelResidency> residency;
  std::atomic<bool> no_cancel{false};
  std::mutex mu;
  std::vector<std::string> unloads;
};

ResidencyOptions no_minimum() {
  ResidencyOptions o;
  o.min_residency_s = 0;
  return o;
}

TEST(Residency, LoadsWhatFitsWithoutEvicting) {
  Fixture f(no_minimum());
  f.add("a", 40);
  f.add("b", 40);
  EXPECT_EQ(f.info("a").state, "unloaded");
  ASSERT_TRUE(f.run("a").ok());
  ASSERT_TRUE(f.run("b").ok());
  EXPECT_EQ(f.info("a").state, "loaded");
  EXPECT_EQ(f.info("b").state, "loaded");
  EXPECT_EQ(f.ledger->snapshot().reserved_ours, 80 * kMB);
  EXPECT_TRUE(f.unloaded().empty());
  EXPECT_EQ(f.info("a").loads, 1u);
  EXPECT_DOUBLE_EQ(f.info("a").last_load_ms, 5);
}

TEST(Residency, EvictsTheLeastRecentlyUsedIdleModel) {
  Fixture f(no_minimum());
  f.add("a", 40);
  f.add("b", 40);
  f.add("c", 40);
  ASSERT_TRUE(f.run("a").ok());
  ASSERT_TRUE(f.run("b").ok());
  std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(f.run("a").ok());  // a is now the more recent
  // What admission is told before c's load.
  const LoadPlan p = f.residency->plan("c", f.ledger.get());
  EXPECT_FALSE(p.resident);
  EXPECT_EQ(p.extra_bytes, 40 * kMB);
  EXPECT_EQ(p.reclaim_bytes, 80 * kMB);
  EXPECT_NE(p.note.find("evicting b"), std::string::npos) << p.note;
  ASSERT_TRUE(f.run("c").ok());
  EXPECT_EQ(f.unloaded(), std::vector<std::string>{"b"});
  EXPECT_EQ(f.info("b").state, "unloaded");
  EXPECT_EQ(f.info("b").evictions, 1u);
  EXPECT_EQ(f.info("b").last_evicted_for, "c");
  EXPECT_EQ(f.info("a").state, "loaded");
  EXPECT_EQ(f.ledger->snapshot().reserved_ours, 80 * kMB);
  EXPECT_TRUE(f.residency->plan("a", f.ledger.get()).resident);
}

TEST(Residency, NeverEvictsAPinnedOrARunningModel) {
  Fixture f(no_minimum());
  f.add("pinned", 40, /*pinned=*/true);
  f.add("b", 40);
  f.add("c", 40);
  ASSERT_TRUE(f.run("pinned").ok());
  ASSERT_TRUE(f.residency->begin_run("b", f.no_cancel).ok());  // b runs
  auto c = std::async(std::launch::async, [&] { return f.residency->begin_run("c", f.no_cancel); });
  EXPECT_EQ(c.wait_for(150ms), std::future_status::timeout) << "c must wait for b's run";
  EXPECT_EQ(f.info("c").waiting, 1);
  EXPECT_TRUE(f.unloaded().empty());
  f.residency->end_run("b", true);
  ASSERT_EQ(c.wait_for(5s), std::future_status::ready);
  ASSERT_TRUE(c.get().ok());
  f.residency->end_run("c", true);
  EXPECT_EQ(f.unloaded(), std::vector<std::string>{"b"});
  EXPECT_EQ(f.info("pinned").state, "loaded");  // never given back
}

TEST(Residency, AnIdleModelGoesBeforeAnOlderRunningOne) {
  Fixture f(no_minimum());
  f.add("a", 40);
  f.add("b", 40);
  f.add("c", 40);
  ASSERT_TRUE(f.residency->begin_run("a", f.no_cancel).ok());  // a runs, and is the least recently used
  std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(f.run("b").ok());
  EXPECT_NE(f.residency->plan("c", f.ledger.get()).note.find("evicting b"), std::string::npos);
  ASSERT_TRUE(f.run("c").ok());
  EXPECT_EQ(f.unloaded(), std::vector<std::string>{"b"});
  f.residency->end_run("a", true);
}

TEST(Residency, APlanThatCanNeverFitIsRefusedNamingTheFigures) {
  Fixture f(no_minimum());
  f.add("pinned", 60, /*pinned=*/true);
  f.add("big", 60);
  ASSERT_TRUE(f.run("pinned").ok());
  Status st = f.residency->begin_run("big", f.no_cancel);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.reason(), FailureReason::kNoPath);
  EXPECT_NE(st.message().find("model big needs"), std::string::npos) << st.message();
  EXPECT_EQ(f.info("big").state, "unloaded");
  EXPECT_EQ(f.info("big").waiting, 0);
}

TEST(Residency, MinimumResidencyServesTwoModelsInRuns) {
  ResidencyOptions o;
  o.min_residency_s = 0.3;
  Fixture f(o);
  f.add("a", 60);
  f.add("b", 60);
  ASSERT_TRUE(f.run("a").ok());
  auto b = std::async(std::launch::async, [&] { return f.run("b"); });
  // Within a's minimum residency b waits and a keeps serving.
  EXPECT_EQ(b.wait_for(100ms), std::future_status::timeout);
  ASSERT_TRUE(f.run("a").ok());
  EXPECT_EQ(f.info("a").loads, 1u);
  // Once it has passed, a is given up for b, and a's next run waits for b's
  // minimum residency in turn: one load each, not one per request.
  ASSERT_EQ(b.wait_for(5s), std::future_status::ready);
  ASSERT_TRUE(b.get().ok());
  EXPECT_EQ(f.unloaded(), std::vector<std::string>{"a"});
  const auto t0 = std::chrono::steady_clock::now();
  auto a = std::async(std::launch::async, [&] { return f.run("a"); });
  ASSERT_TRUE(f.run("b").ok());  // b's run goes on while a waits
  ASSERT_EQ(a.wait_for(5s), std::future_status::ready);
  ASSERT_TRUE(a.get().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms) << "a must wait out most of b's residency";
  EXPECT_EQ(f.info("a").loads, 2u);
  EXPECT_EQ(f.info("b").loads, 1u);
}

TEST(Residency, WithoutTheMinimumAlternationLoadsEveryTime) {
  Fixture f(no_minimum());
  f.add("a", 60);
  f.add("b", 60);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(f.run("a").ok());
    ASSERT_TRUE(f.run("b").ok());
  }
  EXPECT_EQ(f.info("a").loads + f.info("b").loads, 6u);
}

TEST(Residency, KeepAliveLapsesAndZeroGivesBackAtOnce) {
  ResidencyOptions o = no_minimum();
  o.keep_alive_s = 0.1;
  Fixture f(o);
  f.add("a", 30);
  f.add("b", 30);
  f.add("forever", 30, false, -1.0);
  ASSERT_TRUE(f.run("a").ok());
  ASSERT_TRUE(f.run("forever").ok());
  EXPECT_GT(f.info("a").keep_alive_left_s, 0);
  f.residency->start_expiry();  // the thread gives a back without any call
  for (int i = 0; i < 100 && f.info("a").state != "unloaded"; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(f.info("a").state, "unloaded");
  EXPECT_EQ(f.info("forever").state, "loaded");
  f.residency->set_keep_alive("b", 0);
  ASSERT_TRUE(f.run("b").ok());
  EXPECT_EQ(f.info("b").state, "unloaded");
  EXPECT_EQ(f.ledger->snapshot().reserved_ours, 30 * kMB);
}

TEST(Residency, AWaitingRunEndsWhenCancelled) {
  Fixture f(no_minimum());
  f.add("a", 60);
  f.add("b", 60);
  ASSERT_TRUE(f.residency->begin_run("a", f.no_cancel).ok());
  std::atomic<bool> cancel{false};
  auto b = std::async(std::launch::async, [&] { return f.residency->begin_run("b", cancel); });
  EXPECT_EQ(b.wait_for(100ms), std::future_status::timeout);
  cancel = true;
  ASSERT_EQ(b.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(b.get().code(), StatusCode::kCancelled);
  f.residency->end_run("a", true);
  EXPECT_EQ(f.info("b").waiting, 0);
  EXPECT_FALSE(f.info("a").draining);
}

TEST(Residency, AnUnknownUnitFailsItsRun) {
  Fixture f(no_minimum());
  std::atomic<bool> no{false};
  EXPECT_EQ(f.residency->begin_run("nope", no).code(), StatusCode::kInternal);
}

TEST(Residency, AFailedLoadGivesTheReservationBack) {
  Fixture f(no_minimum());
  f.add("a", 60);
  ASSERT_TRUE(f.residency->begin_run("a", f.no_cancel).ok());
  EXPECT_EQ(f.ledger->snapshot().reserved_ours, 60 * kMB);
  f.residency->end_run("a", /*loaded=*/false);
  EXPECT_EQ(f.ledger->snapshot().reserved_ours, 0u);
  EXPECT_EQ(f.info("a").state, "unloaded");
}

}  // namespace
}  // namespace spw::gateway
