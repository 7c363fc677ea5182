// FaultInjector's counting: after N events, K firings, count 0 = until
// disarmed, slow factors, several faults of one kind, spec validation.
#include "backend/fault_injector.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace spw {
namespace {

TEST(FaultInjector, FiresKTimesAfterNEventsThenIsSpent) {
  FaultInjector f;
  auto a = f.arm({FaultKind::kDeviceLost, 2, 3, 1.0});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->id, 1u);
  EXPECT_TRUE(f.armed());
  std::vector<bool> fired;
  for (int i = 0; i < 7; ++i) fired.push_back(f.take_device_lost());
  EXPECT_EQ(fired, (std::vector<bool>{false, false, true, true, true, false, false}));
  EXPECT_FALSE(f.armed());
  const std::vector<ArmedFault> l = f.list();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].fired, 3);
  EXPECT_EQ(l[0].seen, 5);  // a spent fault stops counting
  EXPECT_TRUE(l[0].spent());
}

TEST(FaultInjector, KindsCountOnlyTheirOwnEvents) {
  FaultInjector f;
  ASSERT_TRUE(f.arm({FaultKind::kFenceTimeout, 1, 1, 1.0}).ok());
  ASSERT_TRUE(f.arm({FaultKind::kAllocFail, 0, 2, 1.0}).ok());
  ASSERT_TRUE(f.arm({FaultKind::kHealthFail, 0, 1, 1.0}).ok());
  EXPECT_FALSE(f.take_device_lost());
  EXPECT_EQ(f.take_slow_factor(), 1.0);
  EXPECT_TRUE(f.take_allocation_failure());
  EXPECT_FALSE(f.take_fence_timeout());
  EXPECT_TRUE(f.take_fence_timeout());
  EXPECT_TRUE(f.take_allocation_failure());
  EXPECT_FALSE(f.take_allocation_failure());
  EXPECT_TRUE(f.take_health_failure());
  EXPECT_FALSE(f.take_health_failure());
  EXPECT_FALSE(f.armed());
}

TEST(FaultInjector, CountZeroFiresUntilDisarmed) {
  FaultInjector f;
  ASSERT_TRUE(f.arm({FaultKind::kSlow, 1, 0, 4.0}).ok());
  EXPECT_EQ(f.take_slow_factor(), 1.0);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(f.take_slow_factor(), 4.0) << i;
  EXPECT_TRUE(f.armed());
  EXPECT_EQ(f.list().at(0).fired, 100);
  f.disarm();
  EXPECT_FALSE(f.armed());
  EXPECT_TRUE(f.list().empty());
  EXPECT_EQ(f.take_slow_factor(), 1.0);
}

TEST(FaultInjector, SeveralFaultsOfOneKindEachCountAndTheLargestFactorWins) {
  FaultInjector f;
  ASSERT_TRUE(f.arm({FaultKind::kSlow, 0, 2, 3.0}).ok());
  ASSERT_TRUE(f.arm({FaultKind::kSlow, 1, 1, 10.0}).ok());
  EXPECT_EQ(f.take_slow_factor(), 3.0);   // first fires, second passes its 1
  EXPECT_EQ(f.take_slow_factor(), 10.0);  // both fire
  EXPECT_EQ(f.take_slow_factor(), 1.0);   // both spent
  const auto l = f.list();
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].fired, 2);
  EXPECT_EQ(l[1].fired, 1);
  EXPECT_LT(l[0].id, l[1].id);
}

TEST(FaultInjector, RejectsBadSpecsNamingTheField) {
  FaultInjector f;
  auto bad = [&](FaultSpec s, const char* field) {
    auto r = f.arm(s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().reason(), FailureReason::kInvalidField);
    EXPECT_EQ(r.status().field(), field);
  };
  bad({FaultKind::kDeviceLost, -1, 1, 1.0}, "after");
  bad({FaultKind::kDeviceLost, 0, -2, 1.0}, "count");
  bad({FaultKind::kSlow, 0, 1, 1.0}, "factor");
  bad({FaultKind::kSlow, 0, 1, 0.5}, "factor");
  bad({FaultKind::kAllocFail, 0, 1, 2.0}, "factor");
  EXPECT_FALSE(f.armed());
  EXPECT_TRUE(f.list().empty());
}

TEST(FaultInjector, KindNamesRoundTrip) {
  for (int i = 0; i < kNumFaultKinds; ++i) {
    const auto k = static_cast<FaultKind>(i);
    EXPECT_EQ(fault_kind_from_name(fault_kind_name(k)), k);
  }
  EXPECT_FALSE(fault_kind_from_name("meteor").has_value());
}

TEST(FaultInjector, ConcurrentEventsFireExactlyCountTimes) {
  FaultInjector f;
  ASSERT_TRUE(f.arm({FaultKind::kAllocFail, 10, 25, 1.0}).ok());
  std::atomic<int> fired{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 100; ++i) fired += f.take_allocation_failure() ? 1 : 0;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(fired.load(), 25);
  EXPECT_FALSE(f.armed());
}

TEST(FaultInjector, KeepsABoundedListOfSpentFaults) {
  FaultInjector f;
  for (size_t i = 0; i < FaultInjector::kMaxKept + 10; ++i) {
    ASSERT_TRUE(f.arm({FaultKind::kDeviceLost, 0, 1, 1.0}).ok());
    ASSERT_TRUE(f.take_device_lost());
  }
  ASSERT_TRUE(f.arm({FaultKind::kDeviceLost, 5, 1, 1.0}).ok());
  const auto l = f.list();
  EXPECT_LE(l.size(), FaultInjector::kMaxKept + 1);
  EXPECT_FALSE(l.back().spent());
}

}  // namespace
}  // namespace spw
