// StatementCache against a real SQLite connection (an in-memory database):
// statements are reused, come back unbound and reset, nested uses of the same
// SQL get their own, the capacity bounds the cache, and a failed prepare is
// reported and not kept.
#include "journal/statement_cache.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

namespace spw::journal {
namespace {

class StatementCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db_, "CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)", nullptr, nullptr, nullptr),
              SQLITE_OK);
  }
  void TearDown() override {
    cache_.clear();
    // SQLITE_OK only when no statement is left: the cache finalized them all.
    EXPECT_EQ(sqlite3_close(db_), SQLITE_OK);
  }
  sqlite3* db_ = nullptr;
  StatementCache cache_{4};
};

TEST_F(StatementCacheTest, ReusesAStatementResetAndUnbound) {
  const char* ins = "INSERT INTO t (k, v) VALUES (?1, ?2)";
  StatementCache::Lease a = cache_.acquire(db_, ins);
  ASSERT_NE(a.stmt, nullptr);
  sqlite3_bind_int64(a.stmt, 1, 1);
  sqlite3_bind_text(a.stmt, 2, "one", -1, SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(a.stmt), SQLITE_DONE);
  cache_.release(a);

  StatementCache::Lease b = cache_.acquire(db_, ins);
  EXPECT_EQ(b.stmt, a.stmt) << "the second use must not prepare again";
  EXPECT_EQ(cache_.size(), 1u);
  // Unbound: ?2 is NULL now, not the previous "one".
  sqlite3_bind_int64(b.stmt, 1, 2);
  ASSERT_EQ(sqlite3_step(b.stmt), SQLITE_DONE);
  cache_.release(b);

  StatementCache::Lease q = cache_.acquire(db_, "SELECT v IS NULL FROM t WHERE k = 2");
  ASSERT_EQ(sqlite3_step(q.stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q.stmt, 0), 1);
  cache_.release(q);
}

TEST_F(StatementCacheTest, ReleaseEndsAReadLeftOpen) {
  ASSERT_EQ(sqlite3_exec(db_, "INSERT INTO t VALUES (1,'a'),(2,'b')", nullptr, nullptr, nullptr), SQLITE_OK);
  const char* all = "SELECT k FROM t ORDER BY k";
  StatementCache::Lease a = cache_.acquire(db_, all);
  ASSERT_EQ(sqlite3_step(a.stmt), SQLITE_ROW);  // one row read, one left
  cache_.release(a);
  EXPECT_EQ(sqlite3_next_stmt(db_, nullptr), a.stmt);
  EXPECT_EQ(sqlite3_stmt_busy(a.stmt), 0) << "a released statement holds no read open";
  StatementCache::Lease b = cache_.acquire(db_, all);
  ASSERT_EQ(sqlite3_step(b.stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(b.stmt, 0), 1) << "the next use starts from the first row";
  cache_.release(b);
}

TEST_F(StatementCacheTest, ANestedUseOfTheSameSqlGetsItsOwnStatement) {
  const char* sql = "SELECT 1";
  StatementCache::Lease outer = cache_.acquire(db_, sql);
  StatementCache::Lease inner = cache_.acquire(db_, sql);
  ASSERT_NE(outer.stmt, nullptr);
  ASSERT_NE(inner.stmt, nullptr);
  EXPECT_NE(inner.stmt, outer.stmt);
  EXPECT_EQ(inner.in_use, nullptr) << "the nested one is not cached";
  cache_.release(inner);  // finalized
  cache_.release(outer);
  EXPECT_EQ(cache_.size(), 1u);
  StatementCache::Lease again = cache_.acquire(db_, sql);
  EXPECT_EQ(again.stmt, outer.stmt) << "the cached one is free again";
  cache_.release(again);
}

TEST_F(StatementCacheTest, CapacityBoundsTheCache) {
  for (int i = 0; i < 10; ++i) {
    StatementCache::Lease l = cache_.acquire(db_, "SELECT " + std::to_string(i));
    ASSERT_NE(l.stmt, nullptr);
    ASSERT_EQ(sqlite3_step(l.stmt), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(l.stmt, 0), i);
    EXPECT_EQ(l.in_use == nullptr, i >= 4) << i;
    cache_.release(l);
  }
  EXPECT_EQ(cache_.size(), 4u);
}

TEST_F(StatementCacheTest, AFailedPrepareIsReportedAndNotKept) {
  StatementCache::Lease l = cache_.acquire(db_, "SELECT nope FROM missing");
  EXPECT_EQ(l.stmt, nullptr);
  EXPECT_EQ(l.rc, SQLITE_ERROR);
  EXPECT_NE(std::string(sqlite3_errmsg(db_)).find("missing"), std::string::npos) << sqlite3_errmsg(db_);
  cache_.release(l);
  EXPECT_EQ(cache_.size(), 0u);
  StatementCache::Lease empty = cache_.acquire(db_, "  ");
  EXPECT_EQ(empty.stmt, nullptr) << "blank SQL has no statement to run";
  EXPECT_NE(empty.rc, SQLITE_OK);
}

}  // namespace
}  // namespace spw::journal
