#include "journal/statement_cache.h"

#include <sqlite3.h>

namespace spw::journal {

StatementCache::Lease StatementCache::acquire(sqlite3* db, std::string_view sql) {
  Lease lease;
  auto it = by_sql_.find(sql);
  if (it != by_sql_.end() && !it->second.in_use) {
    it->second.in_use = true;
    lease.stmt = it->second.stmt;
    lease.rc = SQLITE_OK;
    lease.in_use = &it->second.in_use;
    return lease;
  }
  const bool keep = it == by_sql_.end() && by_sql_.size() < capacity_;
  // PERSISTENT tells SQLite the statement lives long (it then allocates it
  // outside the lookaside buffers meant for short-lived ones).
  lease.rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), keep ? SQLITE_PREPARE_PERSISTENT : 0,
                                &lease.stmt, nullptr);
  if (lease.rc != SQLITE_OK || lease.stmt == nullptr) {
    // A failed prepare is not cached: the next use reports the error again.
    sqlite3_finalize(lease.stmt);
    lease.stmt = nullptr;
    if (lease.rc == SQLITE_OK) lease.rc = SQLITE_ERROR;  // empty SQL: no statement to run
    return lease;
  }
  if (keep) {
    Entry& e = by_sql_.emplace(std::string(sql), Entry{}).first->second;
    e.stmt = lease.stmt;
    e.in_use = true;
    lease.in_use = &e.in_use;
  }
  return lease;
}

void StatementCache::release(const Lease& lease) {
  if (lease.stmt == nullptr) return;
  if (lease.in_use == nullptr) {
    sqlite3_finalize(lease.stmt);
    return;
  }
  sqlite3_reset(lease.stmt);
  sqlite3_clear_bindings(lease.stmt);
  *lease.in_use = false;
}

void StatementCache::clear() {
  for (auto& [sql, e] : by_sql_) sqlite3_finalize(e.stmt);
  by_sql_.clear();
}

}  // namespace spw::journal
