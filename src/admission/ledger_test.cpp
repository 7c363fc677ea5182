// DeviceLedger / HostLedger: contract examples, then property tests against a
// model of the accounting (single-threaded) and invariants under threads.
#include "admission/ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace spw::admission {
namespace {

bool has(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

std::unique_ptr<DeviceLedger> device(uint64_t cap, HeadroomPolicy h = {}) {
  auto l = DeviceLedger::create("gpu0", cap, h);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? std::move(*l) : nullptr;
}

TEST(DeviceLedger, ReserveCommitRelease) {
  auto l = device(1000, {100, 0.10});  // headroom 100 + 100 -> limit 800
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->snapshot().limit, 800u);
  EXPECT_EQ(l->available(), 800u);
  auto w = l->reserve({OwnerKind::kModelWeights, "stories"}, 500);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(l->available(), 300u);
  auto big = l->reserve({OwnerKind::kRequest, "r1"}, 301);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(has(big.status(), "cannot reserve 301 B for request 'r1'")) << big.status().to_string();
  EXPECT_TRUE(has(big.status(), "available 300 B")) << big.status().to_string();
  EXPECT_TRUE(has(big.status(), "headroom 200 B"));
  auto r = l->reserve({OwnerKind::kRequest, "r1"}, 300);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(l->available(), 0u);
  // Shrinking commit frees the difference.
  ASSERT_TRUE(l->commit(*w, 450).ok());
  EXPECT_EQ(l->available(), 50u);
  EXPECT_EQ(l->snapshot().committed_ours, 450u);
  // Growing within what is available succeeds; beyond it rolls back.
  ASSERT_TRUE(l->commit(*r, 340).ok());
  EXPECT_EQ(l->available(), 10u);
  Status st = l->commit(*r, 400);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(has(st, "rolled back")) << st.to_string();
  EXPECT_EQ(l->snapshot().reserved_ours, 450u);
  EXPECT_EQ(l->snapshot().committed_ours, 450u);
  EXPECT_EQ(l->release(*r).code(), StatusCode::kNotFound);  // gone with the rollback
  ASSERT_TRUE(l->release(*w).ok());
  EXPECT_EQ(l->release(*w).code(), StatusCode::kNotFound);
  EXPECT_EQ(l->snapshot().reserved_total, 0u);
  EXPECT_EQ(l->available(), 800u);
  EXPECT_EQ(l->reserve({OwnerKind::kRequest, "z"}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceLedger, CreateValidates) {
  EXPECT_FALSE(DeviceLedger::create("g", 0).ok());
  EXPECT_FALSE(DeviceLedger::create("g", 100, {0, 1.0}).ok());
  EXPECT_FALSE(DeviceLedger::create("g", 100, {0, -0.1}).ok());
  EXPECT_FALSE(DeviceLedger::create("g", 100, {100, 0.0}).ok());
  EXPECT_TRUE(DeviceLedger::create("g", 100, {99, 0.0}).ok());
}

TEST(DeviceLedger, ObservedUsageIsTakenPessimistically) {
  auto l = device(1000);
  ASSERT_NE(l, nullptr);
  auto w = l->reserve({OwnerKind::kModelWeights, "m"}, 400);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(l->commit(*w, 400).ok());
  // The probe sees our 400 plus 250 of someone else.
  l->observe(650);
  EXPECT_EQ(l->snapshot().others, 250u);
  EXPECT_EQ(l->available(), 350u);
  // A pending (uncommitted) reservation counts on top of the reading.
  auto r = l->reserve({OwnerKind::kRequest, "r"}, 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(l->available(), 250u);
  // Releasing does not free memory until a reading shows it (caching
  // allocators keep freed blocks): the stale 650 is now all "others".
  ASSERT_TRUE(l->release(*w).ok());
  EXPECT_EQ(l->snapshot().others, 650u);
  EXPECT_EQ(l->available(), 1000u - 650u - 100u);
  l->observe(250);
  EXPECT_EQ(l->available(), 1000u - 250u - 100u);
  // A commit after the reading: the reading may not include it, so it is not
  // subtracted from the reading until the next observe.
  ASSERT_TRUE(l->commit(*r, 100).ok());
  EXPECT_EQ(l->snapshot().others, 250u);
  l->observe(350);  // now it shows
  EXPECT_EQ(l->snapshot().others, 250u);
  EXPECT_EQ(l->available(), 1000u - 250u - 100u);
  // Others grew past the limit: nothing is available, never negative.
  l->observe(5000);
  EXPECT_EQ(l->available(), 0u);
  auto no = l->reserve({OwnerKind::kRequest, "x"}, 1);
  EXPECT_TRUE(has(no.status(), "others observed")) << no.status().to_string();
}

TEST(DeviceLedger, CoTenantReservationOverlapsItsObservedUse) {
  auto l = device(1000);
  ASSERT_NE(l, nullptr);
  auto c = l->reserve({OwnerKind::kCoTenant, "whisper"}, 300);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(l->available(), 700u);
  l->observe(200);  // whisper uses 200 of its 300
  EXPECT_EQ(l->available(), 700u);
  l->observe(450);  // and then more than it declared
  EXPECT_EQ(l->available(), 550u);
  ASSERT_TRUE(l->release(*c).ok());
  EXPECT_EQ(l->available(), 550u);
}

// A budget (`--device-memory 1000`) on a larger heap (4000): others only
// count for what they take out of our share of the heap.
TEST(DeviceLedger, HeapReadingAgainstASmallerBudget) {
  auto l = device(1000);
  ASSERT_NE(l, nullptr);
  auto w = l->reserve({OwnerKind::kModelWeights, "m"}, 400);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(l->commit(*w, 400).ok());
  l->observe_heap(4000, 400 + 2500);  // others use 2500 of the 3000 outside our budget
  EXPECT_EQ(l->snapshot().others, 0u);
  EXPECT_EQ(l->available(), 600u);
  l->observe_heap(4000, 400 + 3300);  // 300 of them now in our share
  EXPECT_EQ(l->snapshot().others, 300u);
  EXPECT_EQ(l->available(), 300u) << "heap free 300, budget left 600: the smaller";
  l->observe_heap(4000, 4000);
  EXPECT_EQ(l->available(), 0u);
  // Budget == heap: the same as observe().
  auto whole = device(4000);
  ASSERT_NE(whole, nullptr);
  whole->observe_heap(4000, 1500);
  EXPECT_EQ(whole->snapshot().others, 1500u);
  EXPECT_EQ(whole->available(), 2500u);
}

TEST(HostLedger, CapBoundsTheBudget) {
  HostBudgetPolicy pol;
  pol.cap_bytes = 300;
  auto l = HostLedger::create("host", pol, HostReadings{1000, std::nullopt, 0});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ((*l)->available(), 300u);
  EXPECT_EQ((*l)->binding_limit(), "cap");
  auto no = (*l)->reserve({OwnerKind::kModelWeights, "m"}, 301);
  ASSERT_FALSE(no.ok());
  EXPECT_TRUE(has(no.status(), "bound by cap")) << no.status().to_string();
  // What we commit counts against the cap (it is a total), while the shares
  // see it in the readings instead.
  auto t = (*l)->reserve({OwnerKind::kModelWeights, "m"}, 100);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*l)->commit(*t, 100).ok());
  (*l)->update({900, std::nullopt, 0});  // MemAvailable fell by our 100: 450 + 100 free by share
  EXPECT_EQ((*l)->binding_limit(), "cap");
  EXPECT_EQ((*l)->available(), 200u) << "cap 300 - our 100";
  (*l)->update({200, std::nullopt, 0});  // 0.5 * 200 + 100 = 200 < 300: MemAvailable binds again
  EXPECT_EQ((*l)->binding_limit(), "MemAvailable");
  EXPECT_EQ((*l)->available(), 100u);
}

TEST(HostLedger, BudgetIsTheSmallerShareAndNamesIt) {
  HostBudgetPolicy pol;
  pol.mem_available_share = 0.5;
  pol.cgroup_share = 0.8;
  HostReadings r{1000, std::nullopt, 0};
  auto l = HostLedger::create("host", pol, r);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ((*l)->available(), 500u);
  EXPECT_EQ((*l)->binding_limit(), "MemAvailable");
  auto no = (*l)->reserve({OwnerKind::kRequest, "cpu-req"}, 501);
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(has(no.status(), "bound by MemAvailable")) << no.status().to_string();

  (*l)->update({1000, 700, 400});  // cgroup room 300 * 0.8 = 240 < 500
  EXPECT_EQ((*l)->binding_limit(), "cgroup");
  EXPECT_EQ((*l)->available(), 240u);
  auto no2 = (*l)->reserve({OwnerKind::kRequest, "cpu-req"}, 241);
  EXPECT_TRUE(has(no2.status(), "bound by cgroup")) << no2.status().to_string();
  EXPECT_TRUE(has(no2.status(), "memory.max 700 B")) << no2.status().to_string();

  // What we commit is already inside later readings: the budget does not
  // shrink twice for it.
  auto t = (*l)->reserve({OwnerKind::kRequest, "a"}, 200);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*l)->available(), 40u);
  ASSERT_TRUE((*l)->commit(*t, 200).ok());
  (*l)->update({1000, 700, 600});  // memory.current rose by our 200; room 100 * 0.8 = 80
  EXPECT_EQ((*l)->available(), 80u);
  ASSERT_TRUE((*l)->release(*t).ok());
  // Until a reading shows the release, the freed bytes are not counted again.
  EXPECT_EQ((*l)->available(), 80u);
  (*l)->update({1000, 700, 400});
  EXPECT_EQ((*l)->available(), 240u);
  (*l)->update({1000, 700, 900});  // over the cgroup limit: no room, not negative
  EXPECT_EQ((*l)->available(), 0u);

  HostBudgetPolicy zero_share;
  zero_share.mem_available_share = 0.0;
  EXPECT_FALSE(HostLedger::create("h", zero_share, r).ok());
  HostBudgetPolicy over_one;
  over_one.cgroup_share = 1.5;
  EXPECT_FALSE(HostLedger::create("h", over_one, r).ok());
}

// ------------------------------------------------------------------ model

// Independent model of the device-ledger accounting.
struct Model {
  uint64_t limit;
  struct T {
    OwnerKind kind;
    uint64_t bytes;
    bool committed;
  };
  std::map<uint64_t, T> tickets;
  uint64_t observed = 0;
  uint64_t a_min = 0;

  uint64_t sum(bool ours) const {
    uint64_t s = 0;
    for (const auto& [id, t] : tickets)
      if ((t.kind != OwnerKind::kCoTenant) == ours) s += t.bytes;
    return s;
  }
  uint64_t committed_ours() const {
    uint64_t s = 0;
    for (const auto& [id, t] : tickets)
      if (t.kind != OwnerKind::kCoTenant && t.committed) s += t.bytes;
    return s;
  }
  uint64_t others() const { return observed > a_min ? observed - a_min : 0; }
  uint64_t used() const { return sum(true) + std::max(sum(false), others()); }
  uint64_t available() const { return used() >= limit ? 0 : limit - used(); }
  void after_change() { a_min = std::min(a_min, committed_ours()); }
};

void check_invariants(const LedgerSnapshot& s) {
  ASSERT_LE(s.reserved_total, s.limit) << "reservations over capacity - headroom";
  ASSERT_EQ(s.reserved_total, s.reserved[0] + s.reserved[1] + s.reserved[2]);
  ASSERT_LE(s.committed_ours, s.reserved_ours);
  ASSERT_LE(s.committed_ours_min, s.committed_ours);
  ASSERT_LE(s.reserved_total, uint64_t{1} << 62) << "underflow";
  ASSERT_EQ(s.available, s.used >= s.limit ? 0 : s.limit - s.used);
}

TEST(DeviceLedgerProperty, MatchesModelSingleThreaded) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t cap = 1000 + rng() % 100000;
    auto l = device(cap, {rng() % 200, static_cast<double>(rng() % 20) / 100.0});
    ASSERT_NE(l, nullptr);
    Model m{l->snapshot().limit, {}, 0, 0};
    std::vector<Ticket> live;
    uint64_t n_ok = 0, n_fail = 0;
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      const uint64_t scale = std::max<uint64_t>(1, m.limit / (1 + rng() % 8));
      if (op < 40) {  // reserve
        const OwnerKind kind = static_cast<OwnerKind>(rng() % 3);
        const uint64_t bytes = 1 + rng() % scale;
        const bool ours = kind != OwnerKind::kCoTenant;
        const uint64_t used_after = ours ? m.sum(true) + bytes + std::max(m.sum(false), m.others())
                                         : m.sum(true) + std::max(m.sum(false) + bytes, m.others());
        const bool fits = used_after <= m.limit;
        auto t = l->reserve({kind, std::to_string(step)}, bytes);
        ASSERT_EQ(t.ok(), fits) << "seed " << seed << " step " << step << " " << t.status().to_string();
        if (t.ok()) {
          m.tickets[t->id] = {kind, bytes, false};
          live.push_back(*t);
          ++n_ok;
        } else {
          EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
          ++n_fail;
        }
      } else if (op < 65 && !live.empty()) {  // commit (shrink or grow)
        const size_t i = rng() % live.size();
        auto& mt = m.tickets.at(live[i].id);
        const uint64_t actual = rng() % 2 ? 1 + rng() % std::max<uint64_t>(1, mt.bytes)
                                          : mt.bytes + 1 + rng() % scale;
        bool fits = true;
        if (actual > mt.bytes) {
          const uint64_t extra = actual - mt.bytes;
          const bool ours = mt.kind != OwnerKind::kCoTenant;
          const uint64_t used_after = ours ? m.sum(true) + extra + std::max(m.sum(false), m.others())
                                           : m.sum(true) + std::max(m.sum(false) + extra, m.others());
          fits = used_after <= m.limit;
        }
        Status st = l->commit(live[i], actual);
        ASSERT_EQ(st.ok(), fits) << "seed " << seed << " step " << step << " " << st.to_string();
        if (fits) {
          mt.bytes = actual;
          mt.committed = true;
        } else {
          m.tickets.erase(live[i].id);  // rolled back
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
        m.after_change();
      } else if (op < 85 && !live.empty()) {  // release
        const size_t i = rng() % live.size();
        ASSERT_TRUE(l->release(live[i]).ok());
        m.tickets.erase(live[i].id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        m.after_change();
      } else if (op < 95) {  // observe
        const uint64_t obs = m.committed_ours() + rng() % (cap / 2 + 1);
        l->observe(rng() % 4 == 0 ? rng() % (cap + 1) : obs);
        m.observed = l->snapshot().observed;
        m.a_min = m.committed_ours();
      } else {  // bogus ticket
        EXPECT_EQ(l->release(Ticket{999999999}).code(), StatusCode::kNotFound);
        EXPECT_EQ(l->commit(Ticket{999999999}, 1).code(), StatusCode::kNotFound);
      }
      const LedgerSnapshot s = l->snapshot();
      ASSERT_NO_FATAL_FAILURE(check_invariants(s)) << "seed " << seed << " step " << step;
      ASSERT_EQ(s.available, m.available()) << "seed " << seed << " step " << step;
      ASSERT_EQ(s.reserved_ours, m.sum(true));
      ASSERT_EQ(s.reserved[2], m.sum(false));
      ASSERT_EQ(s.committed_ours, m.committed_ours());
      ASSERT_EQ(s.n_tickets, live.size());
    }
    EXPECT_GT(n_ok, 100u) << "seed " << seed;
    EXPECT_GT(n_fail, 10u) << "seed " << seed << ": exhaustion never exercised";
    for (Ticket t : live) ASSERT_TRUE(l->release(t).ok());
    const LedgerSnapshot s = l->snapshot();
    EXPECT_EQ(s.reserved_total, 0u);
    EXPECT_EQ(s.committed_ours, 0u);
    EXPECT_EQ(s.n_tickets, 0u);
  }
}

TEST(DeviceLedgerProperty, ThreadsNeverOverfillOrLeak) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    auto l = device(1 << 20, {4096, 0.05});
    ASSERT_NE(l, nullptr);
    const uint64_t limit = l->snapshot().limit;
    std::atomic<bool> stop{false};
    std::atomic<int> violations{0};
    std::atomic<uint64_t> ok_reserves{0}, failed{0};
    // Checker + observer: readings and invariant checks while others work.
    std::thread checker([&] {
      std::mt19937_64 rng(seed * 977);
      while (!stop.load()) {
        const LedgerSnapshot s = l->snapshot();
        if (s.reserved_total > limit || s.committed_ours > s.reserved_ours ||
            s.available != (s.used >= s.limit ? 0 : s.limit - s.used))
          violations.fetch_add(1);
        if (rng() % 4 == 0) l->observe(s.committed_ours + rng() % (limit / 4));
        std::this_thread::yield();
      }
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        std::mt19937_64 rng(seed * 131 + static_cast<uint64_t>(w));
        std::vector<Ticket> mine;
        for (int step = 0; step < 3000; ++step) {
          const int op = static_cast<int>(rng() % 10);
          if (op < 4) {
            auto t = l->reserve({static_cast<OwnerKind>(rng() % 3), "w"}, 1 + rng() % (limit / 8));
            if (t.ok()) {
              mine.push_back(*t);
              ok_reserves.fetch_add(1);
            } else {
              failed.fetch_add(1);
            }
          } else if (op < 7 && !mine.empty()) {
            const size_t i = rng() % mine.size();
            Status st = l->commit(mine[i], 1 + rng() % (limit / 6));
            if (!st.ok()) {
              if (st.code() != StatusCode::kResourceExhausted) violations.fetch_add(1);
              mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));  // rolled back
              failed.fetch_add(1);
            }
          } else if (!mine.empty()) {
            const size_t i = rng() % mine.size();
            if (!l->release(mine[i]).ok()) violations.fetch_add(1);
            mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
          }
        }
        for (Ticket t : mine)
          if (!l->release(t).ok()) violations.fetch_add(1);
      });
    }
    for (auto& t : workers) t.join();
    stop.store(true);
    checker.join();
    EXPECT_EQ(violations.load(), 0) << "seed " << seed;
    EXPECT_GT(ok_reserves.load(), 100u);
    EXPECT_GT(failed.load(), 0u);
    const LedgerSnapshot s = l->snapshot();
    EXPECT_EQ(s.reserved_total, 0u) << "leak, seed " << seed;
    EXPECT_EQ(s.committed_ours, 0u);
    EXPECT_EQ(s.n_tickets, 0u);
  }
}

TEST(HostLedgerProperty, NeverOverBudget) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng(seed);
    HostReadings r{1ull << 30, 1ull << 29, 1ull << 27};
    auto l = HostLedger::create("host", {}, r);
    ASSERT_TRUE(l.ok());
    std::vector<Ticket> live;
    for (int step = 0; step < 3000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4) {
        auto t = (*l)->reserve({OwnerKind::kRequest, "r"}, 1 + rng() % (1ull << 26));
        if (t.ok()) live.push_back(*t);
        else ASSERT_TRUE(has(t.status(), "bound by")) << t.status().to_string();
      } else if (op < 6 && !live.empty()) {
        const size_t i = rng() % live.size();
        if (!(*l)->commit(live[i], 1 + rng() % (1ull << 26)).ok()) live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op < 8 && !live.empty()) {
        const size_t i = rng() % live.size();
        ASSERT_TRUE((*l)->release(live[i]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        const LedgerSnapshot s = (*l)->snapshot();
        // A reading: the machine's other use moves, ours is included.
        const uint64_t other = rng() % (1ull << 29);
        HostReadings nr;
        nr.mem_available = (3ull << 29) - std::min<uint64_t>(3ull << 29, other + s.committed_ours);
        nr.cgroup_max = 1ull << 30;
        nr.cgroup_current = std::min<uint64_t>(1ull << 30, (other / 2) + s.committed_ours);
        (*l)->update(nr);
      }
      const LedgerSnapshot s = (*l)->snapshot();
      ASSERT_EQ(s.others, 0u);
      ASSERT_EQ(s.available, s.used >= s.limit ? 0 : s.limit - s.used);
      ASSERT_LE(s.committed_ours_min, s.committed_ours);
    }
    for (Ticket t : live) ASSERT_TRUE((*l)->release(t).ok());
    EXPECT_EQ((*l)->snapshot().reserved_total, 0u);
  }
}

}  // namespace
}  // namespace spw::admission
