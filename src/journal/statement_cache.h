// Prepared SQLite statements kept for a connection's life, by SQL text.
//
// Why: the journal writes a row at every step of a request (accept, running,
// each checkpoint, finish), and preparing a statement parses and plans its
// SQL every time. That parse was about 15% of a simulated drill's CPU and a
// third of a 1 KiB checkpoint save on tmpfs (bench/journal_bench, numbers in
// docs/PERFORMANCE.md). The statements are few and fixed (the journal's SQL
// is literals), so they are prepared once and reset between uses.
//
// Contract:
// - Not thread-safe: the owner serialises every call (the journal holds its
//   mutex around every use).
// - acquire(sql) returns a statement ready to bind and step, with no
//   parameters bound; release() resets it and clears its bindings (which
//   also ends a read it left open), so whatever a use leaves behind never
//   reaches the next. Every acquire is paired with one release.
// - The same SQL acquired again before its release (a nested use) gets a
//   statement of its own, prepared then and finalized at release; so does any
//   SQL once `capacity` texts are cached, which bounds the cache if a caller
//   ever builds SQL from data.
// - clear() finalizes every cached statement; it must come before the
//   connection closes (a statement left unfinalized keeps a closed
//   connection alive as a zombie). No statement may be acquired then.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

struct sqlite3;
struct sqlite3_stmt;

namespace spw::journal {

class StatementCache {
 public:
  explicit StatementCache(size_t capacity = 64) : capacity_(capacity) {}
  ~StatementCache() { clear(); }
  StatementCache(const StatementCache&) = delete;
  StatementCache& operator=(const StatementCache&) = delete;

  // One acquired statement: `stmt` is null when the SQL did not prepare
  // (`rc` is SQLite's code, its message in sqlite3_errmsg of the connection).
  struct Lease {
    sqlite3_stmt* stmt = nullptr;
    int rc = 0;
    bool* in_use = nullptr;  // the cache entry's flag; null: not cached
  };
  Lease acquire(sqlite3* db, std::string_view sql);
  void release(const Lease& lease);
  void clear();

  size_t size() const { return by_sql_.size(); }

 private:
  struct Entry {
    sqlite3_stmt* stmt = nullptr;
    bool in_use = false;
  };
  // Looked up by the caller's string_view without building a std::string
  // (every statement of a request's writes goes through acquire).
  struct SqlHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  size_t capacity_;
  std::unordered_map<std::string, Entry, SqlHash, std::equal_to<>> by_sql_;  // node-based: &Entry::in_use stays valid
};

}  // namespace spw::journal
