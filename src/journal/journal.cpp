#include "journal/journal.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "core/digest.h"
#include "journal/journal_schema.h"

namespace spw::journal {
namespace {

using schema::kColumns;
using schema::kMigrations;
using schema::kSchema;
using schema::kSchemaVersion;

// Public ids are below 2^53, so that a JSON number (a double) holds them exactly.
constexpr uint64_t kMaxPublicId = (uint64_t{1} << 53) - 1;

bool is_sha256_hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::optional<RequestState> state_from(std::string_view s) {
  for (RequestState st : {RequestState::kAccepted, RequestState::kRunning, RequestState::kDone,
                          RequestState::kCancelled, RequestState::kFailed}) {
    if (state_name(st) == s) return st;
  }
  return std::nullopt;
}

// A prepared statement for one scope. One-off (the schema's and open()'s
// statements) or leased from the journal's StatementCache (every statement a
// request's writes and reads run), which resets it at the end of the scope.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  Stmt(StatementCache& cache, sqlite3* db, std::string_view sql) : cache_(&cache), lease_(cache.acquire(db, sql)) {
    s_ = lease_.stmt;
    rc_ = lease_.rc;
  }
  ~Stmt() {
    if (cache_ != nullptr) cache_->release(lease_);
    else sqlite3_finalize(s_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& text(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // Bytes, NUL included. An empty view binds a zero-length BLOB, not NULL
  // (sqlite3_bind_blob binds NULL for a null pointer).
  Stmt& blob(int i, std::string_view v) {
    if (v.empty()) sqlite3_bind_zeroblob(s_, i, 0);
    else sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& null(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  Stmt& i64(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& f64(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  // Ready to run again, with no parameters bound.
  Stmt& reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
    return *this;
  }
  int param_count() const { return sqlite3_bind_parameter_count(s_); }
  int step() { return sqlite3_step(s_); }
  std::string col_text(int i) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, i));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, i))) : std::string();
  }
  std::string col_blob(int i) const {
    const void* p = sqlite3_column_blob(s_, i);  // before _bytes, as SQLite asks
    return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s_, i)))
             : std::string();
  }
  int64_t col_i64(int i) const { return sqlite3_column_int64(s_, i); }
  double col_f64(int i) const { return sqlite3_column_double(s_, i); }
  bool col_null(int i) const { return sqlite3_column_type(s_, i) == SQLITE_NULL; }

 private:
  StatementCache* cache_ = nullptr;
  StatementCache::Lease lease_;
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

Result<Record> read_row(const Stmt& q) {
  Record r;
  r.id = q.col_i64(0);
  r.idempotency_key = q.col_text(1);
  r.endpoint = q.col_text(2);
  r.body = q.col_text(3);
  const std::string st = q.col_text(4);
  auto state = state_from(st);
  if (!state) return Status::corruption("journal row " + std::to_string(r.id) + ": unknown state '" + st + "'");
  r.state = *state;
  r.attempts = static_cast<int32_t>(q.col_i64(5));
  r.placement = q.col_text(6);
  r.created_ms = q.col_i64(7);
  r.updated_ms = q.col_i64(8);
  r.outcome.state = r.state;
  r.outcome.resumable = q.col_i64(9) != 0;
  r.outcome.finish_reason = q.col_text(10);
  r.outcome.text = q.col_text(11);
  r.outcome.prompt_tokens = static_cast<int32_t>(q.col_i64(12));
  r.outcome.completion_tokens = static_cast<int32_t>(q.col_i64(13));
  r.outcome.error_code = q.col_text(14);
  r.outcome.error_message = q.col_text(15);
  r.admission = q.col_text(16);  // NULL reads as ""
  r.checkpoint = q.col_blob(17);  // NULL reads as ""
  r.checkpoint_tokens = static_cast<int32_t>(q.col_i64(18));
  r.public_id = q.col_i64(19);
  r.owner = q.col_text(20);
  r.body_bytes = q.col_i64(21);
  r.body_sha256 = q.col_text(22);
  r.body_kept = q.col_i64(23) != 0;
  r.refusal_reason = q.col_text(24);
  // Stored as the int64_t with the same bits: back to the uint64_t it was.
  if (!q.col_null(25)) r.outcome.seed = static_cast<uint64_t>(q.col_i64(25));
  r.outcome.queue_ms = q.col_f64(26);
  r.outcome.run_ms = q.col_f64(27);
  if (!q.col_null(28)) r.outcome.max_tokens_requested = static_cast<int32_t>(q.col_i64(28));
  r.outcome.choices = q.col_text(29);
  return r;
}

// SQLite stores a NaN as NULL, which the NOT NULL columns refuse: a time that
// is not a number (never expected) is stored as 0 rather than failing the
// write, since the terminal state matters more than the timing.
double finite_or_zero(double v) { return std::isfinite(v) ? v : 0.0; }

// Binds an outcome's columns at ?first .. ?first+11, in the order finish and
// record_refusal name them: state, resumable, finish_reason, text,
// prompt_tokens, completion_tokens, error_code, error_message, seed,
// queue_ms, run_ms, max_tokens_requested.
void bind_outcome(Stmt& s, int first, const Outcome& o) {
  s.text(first, state_name(o.state))
      .i64(first + 1, o.resumable ? 1 : 0)
      .text(first + 2, o.finish_reason)
      .text(first + 3, o.text)
      .i64(first + 4, o.prompt_tokens)
      .i64(first + 5, o.completion_tokens)
      .text(first + 6, o.error_code)
      .text(first + 7, o.error_message);
  // Two's complement: every uint64_t seed fits an INTEGER column and reads back.
  if (o.seed) s.i64(first + 8, static_cast<int64_t>(*o.seed));
  else s.null(first + 8);
  s.f64(first + 9, finite_or_zero(o.queue_ms)).f64(first + 10, finite_or_zero(o.run_ms));
  if (o.max_tokens_requested) s.i64(first + 11, *o.max_tokens_requested);
  else s.null(first + 11);
}

// The database files Journals of this process have open, by (device,
// inode), each with the descriptors of that file that open() could not close
// (see Journal::lock_file). Never destroyed: a Journal may outlive statics.
struct OpenFiles {
  std::mutex mu;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<int>> parked;  // present: open here
};

OpenFiles& open_files() {
  static OpenFiles* files = new OpenFiles;
  return *files;
}

// What a write adds to the journal's size (see Size budget in journal.h): the
// database pages its row takes (the body in overflow pages of page_size - 4
// bytes, plus its other columns) and the WAL frames its transaction writes
// (those pages and the pages it changes besides: the table's and the three
// indexes' leaves, the header page, sqlite_sequence), each a page and a
// 24-byte header. An estimate: the budget check measures again after pruning.
struct WriteCost {
  int64_t db = 0;
  int64_t wal = 0;
};

WriteCost write_cost(int64_t body_bytes, int64_t page_size) {
  constexpr int64_t kRowBytes = 512;    // a row's columns other than the body
  constexpr int64_t kPagesChanged = 6;  // leaves of the table and indexes, page 1, sqlite_sequence
  const int64_t pages = (body_bytes + kRowBytes + page_size - 5) / (page_size - 4);
  return {pages * page_size, (pages + kPagesChanged) * (page_size + 24)};
}

}  // namespace

std::string_view state_name(RequestState s) {
  switch (s) {
    case RequestState::kAccepted: return "accepted";
    case RequestState::kRunning: return "running";
    case RequestState::kDone: return "done";
    case RequestState::kCancelled: return "cancelled";
    case RequestState::kFailed: return "failed";
  }
  return "unknown";
}

Journal::Journal(Env& env, std::string path, JournalOptions options)
    : env_(env), path_(std::move(path)), options_(options) {}

Journal::~Journal() {
  // SQLite first: its locks go with its connection, so closing our
  // descriptors after it drops nothing of its.
  stmts_.clear();  // before the close: a statement left keeps the connection alive
  if (db_ != nullptr) sqlite3_close_v2(db_);
  if (lock_fd_ < 0) return;
  OpenFiles& files = open_files();
  std::lock_guard<std::mutex> lk(files.mu);
  close(lock_fd_);  // releases the flock
  const auto it = files.parked.find({file_dev_, file_ino_});
  if (it != files.parked.end()) {
    for (int fd : it->second) close(fd);
    files.parked.erase(it);
  }
}

Status Journal::lock_file() {
  // Held from the stat to the registration: two Journals of this process
  // opening one file at once see each other.
  OpenFiles& files = open_files();
  std::lock_guard<std::mutex> lk(files.mu);
  const Status here =
      Status::unavailable("journal " + path_ +
                          " is in use by another Journal in this process (the same file, perhaps under another "
                          "name: a symlink or a hard link to it)");
  // Before opening a descriptor: closing one (as a refusal would) drops every
  // POSIX lock this process holds on the file, which would pull the live
  // Journal's SQLite locks from under it.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 &&
      files.parked.count({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}) != 0) {
    return here;
  }
  // O_CREAT before the lock: of two processes creating one new journal,
  // both open the same new file and only one gets its lock.
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::io_error("journal " + path_ + ": " + std::strerror(errno));
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Status::io_error("journal " + path_ + ": fstat: " + std::strerror(err));
  }
  const std::pair<uint64_t, uint64_t> id{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  if (const auto it = files.parked.find(id); it != files.parked.end()) {
    // The path came to name a file open here between the stat and the open
    // (renamed or linked meanwhile): parked, to be closed with that Journal,
    // for the reason above.
    it->second.push_back(fd);
    return here;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return Status::io_error("journal " + path_ + ": not a regular file");
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);  // no Journal of this process has this file: no lock of ours goes with it
    if (err == EWOULDBLOCK) {
      return Status::unavailable("journal " + path_ +
                                 " is in use by another Spillway process (the file is locked, under this name or "
                                 "another: a symlink or a hard link to it); give this server its own --journal");
    }
    return Status::io_error("journal " + path_ + ": flock: " + std::strerror(err));
  }
  // SQLite names the -wal and -shm files after the path it opens, symlinks
  // resolved (as its unix VFS does itself): every symlink to the file shares
  // them, and stats() and the budget find the -wal there. (A hard link's
  // name would not: the lock keeps two of them from being open at once.)
  char* real = realpath(path_.c_str(), nullptr);
  db_path_ = real != nullptr ? real : path_;
  std::free(real);
  struct stat resolved {};
  if (::stat(db_path_.c_str(), &resolved) != 0 || resolved.st_dev != st.st_dev || resolved.st_ino != st.st_ino) {
    close(fd);
    return Status::io_error("journal " + path_ + ": the file changed (renamed or replaced) while it was being opened");
  }
  lock_fd_ = fd;
  file_dev_ = id.first;
  file_ino_ = id.second;
  files.parked.emplace(id, std::vector<int>());
  return Status();
}

Status Journal::error_locked(const std::string& what) const {
  return Status::io_error("journal " + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
}

Status Journal::exec_locked(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return Status::io_error("journal " + path_ + ": " + m);
  }
  return Status();
}

Status Journal::step_locked(const char* sql) {
  Stmt s(stmts_, db_, sql);
  if (!s.ok() || s.step() != SQLITE_DONE) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  return Status();
}

Result<std::unique_ptr<Journal>> Journal::open(Env& env, const std::string& path, JournalOptions options) {
  if (options.retention_ms <= 0 || options.prune_every <= 0) {
    return Status::invalid_argument("journal: retention_ms and prune_every must be > 0");
  }
  if (options.max_bytes < 0 || (options.max_bytes > 0 && options.max_bytes < kMinJournalBytes)) {
    return Status::invalid_argument("journal: a size budget of " + std::to_string(options.max_bytes) +
                                    " bytes; use 0 (none) or at least " + std::to_string(kMinJournalBytes));
  }
  if (options.max_body_bytes_kept < 0) {
    return Status::invalid_argument("journal: max_body_bytes_kept " + std::to_string(options.max_body_bytes_kept) +
                                    " is negative");
  }
  std::unique_ptr<Journal> j(new Journal(env, path, options));
  // One owner per journal: open() fails the previous owner's unfinished
  // requests, which must not happen to a live server's.
  SPW_RETURN_IF_ERROR(j->lock_file());
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
  if (sqlite3_open_v2(j->db_path_.c_str(), &j->db_, flags, nullptr) != SQLITE_OK) {
    const std::string m = j->db_ ? sqlite3_errmsg(j->db_) : "out of memory";
    return Status::io_error("journal " + path + ": cannot open: " + m);
  }
  std::lock_guard<std::mutex> lk(j->mu_);
  sqlite3_busy_timeout(j->db_, 5000);
  // WAL: readers never block the writer; FULL: a commit is on disk when it returns.
  SPW_RETURN_IF_ERROR(j->exec_locked("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
  {
    Stmt q(j->db_, "PRAGMA page_size");
    if (!q.ok() || q.step() != SQLITE_ROW) return j->error_locked("reading page_size");
    j->page_size_ = std::max<int64_t>(q.col_i64(0), 512);
  }
  if (options.max_bytes > 0) {
    // The WAL within the budget (see Size budget): checkpointed every
    // max_bytes / 16 (SQLite's default of 1000 pages at most, so a large
    // budget checkpoints as often as before), and truncated back to that
    // size once checkpointed, however far one large write took it.
    // secure_delete=FAST: pruning must not write every freed page again, as
    // zeros through the WAL (Debian builds SQLite with secure_delete on,
    // which made deleting 26 rows of 64 KiB write 1.7 MB of WAL); freed
    // pages keep their bytes until the next writes reuse them.
    const int64_t pages = std::clamp<int64_t>(options.max_bytes / 16 / j->page_size_, 16, 1000);
    SPW_RETURN_IF_ERROR(j->exec_locked(("PRAGMA wal_autocheckpoint=" + std::to_string(pages) +
                                        "; PRAGMA journal_size_limit=" + std::to_string(pages * j->page_size_) +
                                        "; PRAGMA secure_delete=FAST")
                                           .c_str()));
  }
  int64_t version = 0;
  {
    Stmt q(j->db_, "PRAGMA user_version");
    if (!q.ok() || q.step() != SQLITE_ROW) return j->error_locked("reading user_version");
    version = q.col_i64(0);
  }
  // 0: a new file. Older versions are migrated below; a newer (or foreign)
  // one is refused rather than reinterpreted.
  if (version < 0 || version > kSchemaVersion) {
    return Status::corruption("journal " + path + ": schema version " + std::to_string(version) + ", expected " +
                              std::to_string(kSchemaVersion) + " or older (written by another Spillway version)");
  }
  SPW_RETURN_IF_ERROR(j->exec_locked("BEGIN IMMEDIATE"));
  Status st;
  for (int64_t v = version; st.ok() && v >= 1 && v < kSchemaVersion; ++v) {
    st = j->exec_locked(kMigrations[static_cast<size_t>(v - 1)]);
    if (!st.ok()) {
      st = Status::io_error(st.message() + " (migrating schema version " + std::to_string(v) + " to " +
                            std::to_string(v + 1) + ")");
    }
  }
  if (st.ok()) st = j->exec_locked(kSchema);  // a new file; a migrated one gets the indexes it lacks
  if (st.ok()) st = j->complete_migrated_rows_locked();
  // Set in the same transaction as the migration: both land, or neither.
  if (st.ok()) st = j->exec_locked(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
  // Whatever a previous process left running was interrupted: it ends here,
  // resumable (no result reached the journal, so a retry cannot duplicate one).
  if (st.ok()) {
    Stmt u(j->db_,
  // error_code: kInterruptedCode (journal.h).
           "UPDATE requests SET state='failed', resumable=1, updated_ms=?1, error_code='interrupted', "
           "error_message='interrupted: the gateway stopped (crash or kill) before the request finished; "
           "POST /v1/requests/{id}/resume continues it from its last checkpoint when it has one, or retry with "
           "the same Idempotency-Key' WHERE state IN ('accepted','running')");
    if (!u.ok() || u.i64(1, env.wall_time_ms()).step() != SQLITE_DONE) st = j->error_locked("recovering");
    j->recovered_ = sqlite3_changes(j->db_);
  }
  if (st.ok()) st = j->prune_locked();
  // Down to the budget, should it have been lowered: a full journal still
  // opens (room comes as requests finish), so only real errors fail here.
  if (st.ok()) {
    st = j->make_room_locked(0, 0);
    if (st.reason() == FailureReason::kJournalFull) st = Status();
  }
  if (!st.ok()) {
    (void)j->exec_locked("ROLLBACK");
    return st;
  }
  SPW_RETURN_IF_ERROR(j->exec_locked("COMMIT"));
  return j;
}

Status Journal::prune_locked() {
  Stmt d(stmts_, db_, "DELETE FROM requests WHERE state IN ('done','cancelled','failed') AND updated_ms < ?1");
  if (!d.ok() || d.i64(1, env_.wall_time_ms() - options_.retention_ms).step() != SQLITE_DONE) {
    return error_locked("pruning");
  }
  accepts_since_prune_ = 0;
  return Status();
}

Result<std::optional<Record>> Journal::find_locked(const char* where_sql, int64_t n, const std::string& owner,
                                                   const std::string& key) {
  const std::string sql = std::string("SELECT ") + kColumns + " FROM requests WHERE " + where_sql;
  Stmt q(stmts_, db_, sql.c_str());
  if (!q.ok()) return error_locked("preparing a lookup");
  // Only the parameters the clause uses (up to the highest it names).
  const int params = q.param_count();
  if (params >= 1) q.i64(1, n);
  if (params >= 2) q.text(2, owner);
  if (params >= 3) q.text(3, key);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return std::optional<Record>();
  if (rc != SQLITE_ROW) return error_locked("reading a request");
  SPW_ASSIGN_OR_RETURN(Record r, read_row(q));
  return std::optional<Record>(std::move(r));
}

Result<int64_t> Journal::new_public_id_locked() {
  // Uniform over [1, kMaxPublicId]: the low 53 bits, 0 drawn again. A
  // collision is rare (a birthday bound of 2^26 rows) but possible: draw again.
  constexpr int kDraws = 64;
  for (int i = 0; i < kDraws; ++i) {
    const int64_t pid = static_cast<int64_t>(env_.random_u64() & kMaxPublicId);
    if (pid == 0) continue;
    Stmt q(stmts_, db_, "SELECT 1 FROM requests WHERE public_id=?1");
    if (!q.ok()) return error_locked("preparing a public id lookup");
    const int rc = q.i64(1, pid).step();
    if (rc == SQLITE_DONE) return pid;
    if (rc != SQLITE_ROW) return error_locked("looking up a public id");
  }
  return Status::internal("journal " + path_ + ": no unused public id in " + std::to_string(kDraws) +
                          " draws (does the Env's random_u64 repeat itself?)");
}

Status Journal::complete_migrated_rows_locked() {
  // The ids first, then one row at a time: updating rows while a SELECT
  // walks them is not defined, and bodies may be large.
  std::vector<int64_t> ids;
  {
    Stmt q(stmts_, db_, "SELECT id FROM requests WHERE public_id < 1");
    if (!q.ok()) return error_locked("preparing the migrated rows' lookup");
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) ids.push_back(q.col_i64(0));
    if (rc != SQLITE_DONE) return error_locked("reading the migrated rows");
  }
  for (int64_t id : ids) {
    std::string body;
    {
      Stmt q(stmts_, db_, "SELECT body FROM requests WHERE id=?1");
      if (!q.ok() || q.i64(1, id).step() != SQLITE_ROW) {
        return error_locked("reading migrated request " + std::to_string(id));
      }
      body = q.col_text(0);
    }
    SPW_ASSIGN_OR_RETURN(const int64_t pid, new_public_id_locked());
    Stmt u(stmts_, db_, "UPDATE requests SET public_id=?1, body_bytes=?2, body_sha256=?3 WHERE id=?4");
    if (!u.ok()) return error_locked("preparing the migrated rows' update");
    u.i64(1, pid).i64(2, static_cast<int64_t>(body.size())).text(3, sha256_hex(body)).i64(4, id);
    if (u.step() != SQLITE_DONE) return error_locked("completing migrated request " + std::to_string(id));
  }
  return Status();
}

Result<std::optional<EquivalenceVerdict>> Journal::load_equivalence(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(stmts_, db_, "SELECT passed, detail, ms, checked_ms FROM equivalence WHERE key = ?1");
  if (!q.ok()) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  q.text(1, key);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return std::optional<EquivalenceVerdict>();
  if (rc != SQLITE_ROW) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  EquivalenceVerdict v;
  v.passed = q.col_i64(0) != 0;
  v.detail = q.col_text(1);
  v.ms = q.col_f64(2);
  v.checked_ms = q.col_i64(3);
  return std::optional<EquivalenceVerdict>(std::move(v));
}

Status Journal::save_equivalence(const std::string& key, const EquivalenceVerdict& v) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(stmts_, db_,
         "INSERT INTO equivalence (key, passed, detail, ms, checked_ms) VALUES (?1, ?2, ?3, ?4, ?5) "
         "ON CONFLICT(key) DO UPDATE SET passed = ?2, detail = ?3, ms = ?4, checked_ms = ?5");
  if (!q.ok()) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  q.text(1, key).i64(2, v.passed ? 1 : 0).text(3, v.detail).f64(4, v.ms).i64(5, v.checked_ms);
  if (q.step() != SQLITE_DONE) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  return Status();
}

Result<JournalStats> Journal::stats() {
  JournalStats out;
  for (RequestState s : {RequestState::kAccepted, RequestState::kRunning, RequestState::kDone,
                         RequestState::kCancelled, RequestState::kFailed}) {
    out.rows_by_state[std::string(state_name(s))] = 0;
  }
  std::lock_guard<std::mutex> lk(mu_);
  {
    Stmt q(stmts_, db_, "SELECT state, COUNT(*) FROM requests GROUP BY state");
    if (!q.ok()) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) out.rows_by_state[q.col_text(0)] = q.col_i64(1);
    if (rc != SQLITE_DONE) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
  }
  {
    Stmt q(stmts_, db_, "PRAGMA page_count");
    if (!q.ok() || q.step() != SQLITE_ROW) return Status::io_error("journal " + path_ + ": " + sqlite3_errmsg(db_));
    out.file_bytes = q.col_i64(0) * page_size_;
  }
  SPW_ASSIGN_OR_RETURN(out.used_bytes, used_bytes_locked());
  out.wal_bytes = wal_bytes_locked();
  out.max_bytes = options_.max_bytes;
  out.pruned_for_space = pruned_for_space_;
  return out;
}

Status Journal::count_accept_locked() {
  if (++accepts_since_prune_ >= options_.prune_every) return prune_locked();
  return Status();
}

Result<int64_t> Journal::used_bytes_locked() {
  int64_t pages[2] = {0, 0};
  const char* pragmas[2] = {"PRAGMA page_count", "PRAGMA freelist_count"};
  for (int i = 0; i < 2; ++i) {
    Stmt q(stmts_, db_, pragmas[i]);
    if (!q.ok() || q.step() != SQLITE_ROW) return error_locked("measuring the database");
    pages[i] = q.col_i64(0);
  }
  return (pages[0] - pages[1]) * page_size_;
}

int64_t Journal::wal_bytes_locked() const {
  struct stat st {};
  return ::stat((db_path_ + "-wal").c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

void Journal::bound_wal_locked(int64_t body_bytes) {
  if (options_.max_bytes == 0) return;
  const int64_t wal = wal_bytes_locked();
  if (wal == 0 || wal + write_cost(body_bytes, page_size_).wal <= options_.max_bytes / 8) return;
  // Copies the WAL into the database and truncates it to nothing. Best
  // effort: should a reader outside this process hold it back (SQLITE_BUSY),
  // the budget check counts the WAL as it is.
  (void)sqlite3_wal_checkpoint_v2(db_, "main", SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
}

Status Journal::make_room_locked(int64_t body_bytes, int64_t keep_id) {
  if (options_.max_bytes == 0) return Status();
  const int64_t budget = options_.max_bytes;
  const WriteCost cost = write_cost(body_bytes, page_size_);
  SPW_ASSIGN_OR_RETURN(int64_t used, used_bytes_locked());
  int64_t size_after = used + wal_bytes_locked() + cost.db + cost.wal;
  auto full = [&](const std::string& why) {
    return Status(StatusCode::kResourceExhausted,
                  "journal " + path_ + " is full: a write of about " + std::to_string(cost.db + cost.wal) +
                      " bytes would take it to " + std::to_string(size_after) + " bytes, over its size budget of " +
                      std::to_string(budget) + " bytes (--journal-max-bytes; " + std::to_string(used) +
                      " bytes in use), " + why,
                  FailureReason::kJournalFull);
  };
  // The schema's pages (about 8) and the write: more than the budget holds
  // however much is pruned.
  if (8 * page_size_ + cost.db + cost.wal > budget) return full("more than the whole budget holds");
  // Each pass deletes what should free the excess and a further budget / 32,
  // so that the scan for candidates runs once per many writes, not on each.
  while (size_after > budget) {
    const int64_t excess = size_after - budget;
    const int64_t wanted = excess + budget / 32;
    std::vector<int64_t> ids;
    int64_t freed = 0;    // what the rows hold
    int64_t at_most = 0;  // the same rounded up to whole pages: never less than deleting them frees
    bool exhausted = false;
    {
      // Rows nothing can resume first, then resumable ones; oldest first in each.
      Stmt q(stmts_, db_,
             "SELECT id, (CASE WHEN body_kept = 1 THEN body_bytes ELSE 0 END) + length(text) + "
             "IFNULL(length(checkpoint), 0) + IFNULL(length(admission), 0) + length(error_message) + 100 "
             "FROM requests WHERE state IN ('done','cancelled','failed') AND id != ?1 "
             "ORDER BY (resumable = 1 AND body_kept = 1), updated_ms, id");
      if (!q.ok()) return error_locked("preparing the rows to prune");
      q.i64(1, keep_id);
      int rc = SQLITE_DONE;
      while (freed < wanted && (rc = q.step()) == SQLITE_ROW) {
        ids.push_back(q.col_i64(0));
        const int64_t n = q.col_i64(1);
        freed += n;
        at_most += (n / (page_size_ - 4) + 1) * page_size_;
      }
      if (freed < wanted) {
        if (rc != SQLITE_DONE) return error_locked("reading the rows to prune");
        exhausted = true;
      }
    }
    // Everything prunable cannot free enough: refused without deleting
    // anything (the transaction would be rolled back anyway).
    if (ids.empty() || (exhausted && at_most < excess)) {
      return full("and the rows in it are requests still running or resumable; retry when some have finished");
    }
    Stmt d(stmts_, db_, "DELETE FROM requests WHERE id = ?1");
    if (!d.ok()) return error_locked("preparing a prune");
    for (int64_t id : ids) {
      if (d.reset().i64(1, id).step() != SQLITE_DONE) return error_locked("pruning for space");
    }
    pruned_for_space_ += static_cast<int64_t>(ids.size());
    SPW_ASSIGN_OR_RETURN(used, used_bytes_locked());
    size_after = used + wal_bytes_locked() + cost.db + cost.wal;
  }
  return Status();
}

Result<AcceptResult> Journal::accept(const NewRequest& req) {
  // Hashed before the lock: a large body does not hold up other writers.
  const std::string digest = sha256_hex(req.body);
  const auto body_bytes = static_cast<int64_t>(req.body.size());
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = env_.wall_time_ms();
  bound_wal_locked(body_bytes);
  SPW_RETURN_IF_ERROR(step_locked("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<AcceptResult> {
    if (!req.idempotency_key.empty()) {
      SPW_ASSIGN_OR_RETURN(std::optional<Record> old,
                           find_locked("owner = ?2 AND idempotency_key = ?3", 0, req.owner, req.idempotency_key));
      if (old) {
        const std::string which = "Idempotency-Key '" + req.idempotency_key + "' (request " +
                                  std::to_string(old->public_id) + ")";
        // By digest: a refused row keeps only that of its body.
        if (old->body_sha256 != digest || old->body_bytes != body_bytes || old->endpoint != req.endpoint) {
          return Status(StatusCode::kFailedPrecondition,
                        which + " was already used with a different body or endpoint; use a new key for a new request",
                        FailureReason::kIdempotencyConflict, "Idempotency-Key");
        }
        if (old->state == RequestState::kDone) return AcceptResult{std::move(*old), true};
        if (!is_terminal(old->state)) {
          return Status(StatusCode::kFailedPrecondition,
                        which + " is still in progress (" + std::string(state_name(old->state)) +
                            "); poll GET /v1/requests/" + std::to_string(old->public_id),
                        FailureReason::kIdempotencyConflict, "Idempotency-Key");
        }
        // Failed or cancelled: nothing was delivered as complete; run it again,
        // from scratch (a resume from the checkpoint is reopen(), not this).
        // The body goes back in: a refusal (finish_refused) dropped it, and
        // this attempt runs from it.
        SPW_RETURN_IF_ERROR(make_room_locked(body_bytes, old->id));
        Stmt u(stmts_, db_,
               "UPDATE requests SET state='accepted', attempts=attempts+1, updated_ms=?1, resumable=0, "
               "finish_reason='', text='', prompt_tokens=0, completion_tokens=0, error_code='', error_message='', "
               "placement='', admission=NULL, checkpoint=NULL, checkpoint_tokens=0, body=?3, body_kept=1, "
               "refusal_reason='', seed=NULL, queue_ms=0, run_ms=0, max_tokens_requested=NULL WHERE id=?2");
        if (!u.ok() || u.i64(1, now).i64(2, old->id).text(3, req.body).step() != SQLITE_DONE) {
          return error_locked("retrying");
        }
        SPW_ASSIGN_OR_RETURN(std::optional<Record> again, find_locked("id = ?1", old->id));
        return AcceptResult{std::move(*again), false};
      }
    }
    SPW_RETURN_IF_ERROR(make_room_locked(body_bytes, 0));
    SPW_ASSIGN_OR_RETURN(const int64_t public_id, new_public_id_locked());
    Stmt ins(stmts_, db_,
             "INSERT INTO requests (idempotency_key, endpoint, body, state, created_ms, updated_ms, public_id, owner, "
             "body_bytes, body_sha256, body_kept) VALUES (?1, ?2, ?3, 'accepted', ?4, ?4, ?5, ?6, ?7, ?8, 1)");
    if (!ins.ok()) return error_locked("preparing insert");
    if (req.idempotency_key.empty()) ins.null(1);
    else ins.text(1, req.idempotency_key);
    ins.text(2, req.endpoint).text(3, req.body).i64(4, now).i64(5, public_id).text(6, req.owner);
    ins.i64(7, body_bytes).text(8, digest);
    if (ins.step() != SQLITE_DONE) return error_locked("recording a request");
    const int64_t id = sqlite3_last_insert_rowid(db_);
    SPW_RETURN_IF_ERROR(count_accept_locked());
    SPW_ASSIGN_OR_RETURN(std::optional<Record> rec, find_locked("id = ?1", id));
    return AcceptResult{std::move(*rec), false};
  }();
  if (!body.ok()) {
    (void)step_locked("ROLLBACK");
    return body.status();
  }
  SPW_RETURN_IF_ERROR(step_locked("COMMIT"));
  return body;
}

Status Journal::mark_running(int64_t id, const std::string& placement) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt u(stmts_, db_, "UPDATE requests SET state='running', placement=?1, updated_ms=?2 WHERE id=?3 AND state IN ('accepted','running')");
  if (!u.ok() || u.text(1, placement).i64(2, env_.wall_time_ms()).i64(3, id).step() != SQLITE_DONE) {
    return error_locked("marking request " + std::to_string(id) + " running");
  }
  if (sqlite3_changes(db_) == 0) {
    return Status::failed_precondition("journal: request " + std::to_string(id) + " is not waiting to run");
  }
  return Status();
}

Status Journal::finish(int64_t id, const Outcome& o) { return finish_row(id, o, /*drop_body=*/false); }

Status Journal::finish_refused(int64_t id, const Outcome& o) { return finish_row(id, o, /*drop_body=*/true); }

Status Journal::finish_row(int64_t id, const Outcome& o, bool drop_body) {
  if (!is_terminal(o.state)) return Status::invalid_argument("journal finish: state must be terminal");
  std::lock_guard<std::mutex> lk(mu_);
  // kDone drops the checkpoint (the result is complete; nothing resumes from
  // it, and it may be large); a failure or cancellation keeps it, since that
  // is what a resume continues from. A refusal (drop_body) drops the body
  // and with it the checkpoint, which cannot be resumed without the body;
  // the body's size and digest stay for the next attempt's comparison. A
  // body over max_body_bytes_kept (?16) goes too once nothing can run from
  // it: kDone, or an end that is not resumable (reopen() requires
  // resumable); a resumable one keeps it for the resume.
  Stmt u(stmts_, db_,
         "UPDATE requests SET state=?1, resumable=?2, finish_reason=?3, text=?4, prompt_tokens=?5, "
         "completion_tokens=?6, error_code=?7, error_message=?8, seed=?9, queue_ms=?10, run_ms=?11, "
         "max_tokens_requested=?12, updated_ms=?13, choices=?17, "
         "checkpoint=CASE WHEN ?1='done' OR ?15 THEN NULL ELSE checkpoint END, "
         "checkpoint_tokens=CASE WHEN ?1='done' OR ?15 THEN 0 ELSE checkpoint_tokens END, "
         "body=CASE WHEN ?15 OR (?16 > 0 AND body_bytes > ?16 AND (?1='done' OR ?2=0)) THEN '' ELSE body END, "
         "body_kept=CASE WHEN ?15 OR (?16 > 0 AND body_bytes > ?16 AND (?1='done' OR ?2=0)) THEN 0 "
         "ELSE body_kept END "
         "WHERE id=?14 AND state IN ('accepted','running')");
  if (!u.ok()) return error_locked("preparing finish");
  bind_outcome(u, 1, o);
  u.i64(13, env_.wall_time_ms()).i64(14, id).i64(15, drop_body ? 1 : 0).i64(16, options_.max_body_bytes_kept);
  u.text(17, o.choices);
  if (u.step() != SQLITE_DONE) return error_locked("finishing request " + std::to_string(id));
  if (sqlite3_changes(db_) == 0) {
    return Status::failed_precondition("journal: request " + std::to_string(id) +
                                       " is unknown or already terminal");
  }
  return Status();
}

Result<Record> Journal::record_refusal(const RefusalSummary& s, const Outcome& o) {
  if (!is_terminal(o.state)) return Status::invalid_argument("journal record_refusal: state must be terminal");
  if (s.body_bytes < 0) {
    return Status::invalid_argument("journal record_refusal: body_bytes " + std::to_string(s.body_bytes) +
                                    " is negative");
  }
  if (!s.body_sha256.empty() && !is_sha256_hex(s.body_sha256)) {
    return Status::invalid_argument("journal record_refusal: body_sha256 '" + s.body_sha256 +
                                    "' is not 64 lowercase hex characters");
  }
  // No body: what the row holds besides its fixed columns.
  const auto row_bytes = static_cast<int64_t>(s.reason.size() + o.text.size() + o.error_message.size());
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = env_.wall_time_ms();
  bound_wal_locked(row_bytes);
  SPW_RETURN_IF_ERROR(step_locked("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<Record> {
    if (!s.idempotency_key.empty()) {
      SPW_ASSIGN_OR_RETURN(std::optional<Record> old,
                           find_locked("owner = ?2 AND idempotency_key = ?3", 0, s.owner, s.idempotency_key));
      if (old) {
        const std::string which = "Idempotency-Key '" + s.idempotency_key + "' (request " +
                                  std::to_string(old->public_id) + ")";
        if (old->body_sha256 != s.body_sha256 || old->body_bytes != s.body_bytes || old->endpoint != s.endpoint) {
          return Status(StatusCode::kFailedPrecondition,
                        which + " was already used with a different body or endpoint; use a new key for a new request",
                        FailureReason::kIdempotencyConflict, "Idempotency-Key");
        }
        if (!is_terminal(old->state) || old->state == RequestState::kDone) {
          return Status(StatusCode::kFailedPrecondition,
                        which + " is " + std::string(state_name(old->state)) + ", not a failed attempt to refuse again",
                        FailureReason::kIdempotencyConflict, "Idempotency-Key");
        }
        // The next attempt under the key, refused: as accept() then
        // finish_refused() would leave it, without writing the body.
        SPW_RETURN_IF_ERROR(make_room_locked(row_bytes, old->id));
        Stmt u(stmts_, db_,
               "UPDATE requests SET attempts=attempts+1, state=?1, resumable=?2, finish_reason=?3, text=?4, "
               "prompt_tokens=?5, completion_tokens=?6, error_code=?7, error_message=?8, seed=?9, queue_ms=?10, "
               "run_ms=?11, max_tokens_requested=?12, updated_ms=?13, placement='', admission=NULL, "
               "checkpoint=NULL, checkpoint_tokens=0, body='', body_kept=0, refusal_reason=?15 WHERE id=?14");
        if (!u.ok()) return error_locked("preparing a refusal");
        bind_outcome(u, 1, o);
        u.i64(13, now).i64(14, old->id).text(15, s.reason);
        if (u.step() != SQLITE_DONE) return error_locked("recording a refusal");
        SPW_ASSIGN_OR_RETURN(std::optional<Record> again, find_locked("id = ?1", old->id));
        return std::move(*again);
      }
    }
    SPW_RETURN_IF_ERROR(make_room_locked(row_bytes, 0));
    SPW_ASSIGN_OR_RETURN(const int64_t public_id, new_public_id_locked());
    // No body: the row says that a request came and why it was refused, and
    // costs little.
    Stmt ins(stmts_, db_,
             "INSERT INTO requests (state, resumable, finish_reason, text, prompt_tokens, completion_tokens, "
             "error_code, error_message, seed, queue_ms, run_ms, max_tokens_requested, created_ms, updated_ms, "
             "public_id, owner, endpoint, body, body_bytes, body_sha256, body_kept, refusal_reason, "
             "idempotency_key) "
             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14, ?15, ?16, '', ?17, ?18, 0, "
             "?19, ?20)");
    if (!ins.ok()) return error_locked("preparing a refusal");
    bind_outcome(ins, 1, o);
    ins.i64(13, now).i64(14, public_id).text(15, s.owner).text(16, s.endpoint).i64(17, s.body_bytes);
    ins.text(18, s.body_sha256).text(19, s.reason);
    if (s.idempotency_key.empty()) ins.null(20);
    else ins.text(20, s.idempotency_key);
    if (ins.step() != SQLITE_DONE) return error_locked("recording a refusal");
    const int64_t id = sqlite3_last_insert_rowid(db_);
    // A flood of refusals is pruned as a flood of requests is.
    SPW_RETURN_IF_ERROR(count_accept_locked());
    SPW_ASSIGN_OR_RETURN(std::optional<Record> rec, find_locked("id = ?1", id));
    return std::move(*rec);
  }();
  if (!body.ok()) {
    (void)step_locked("ROLLBACK");
    return body.status();
  }
  SPW_RETURN_IF_ERROR(step_locked("COMMIT"));
  return body;
}

Status Journal::set_admission(int64_t id, std::string_view admission_json) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!admission_json.empty()) {
    // Readers parse it back (GET /v1/requests/{id}): only an object goes in.
    Stmt q(stmts_, db_, "SELECT CASE WHEN json_valid(?1) THEN json_type(?1) END");
    if (!q.ok() || q.text(1, admission_json).step() != SQLITE_ROW) return error_locked("checking an admission");
    if (q.col_text(0) != "object") {
      return Status::invalid_argument("journal: the admission of request " + std::to_string(id) +
                                      " must be a JSON object");
    }
  }
  // updated_ms is left alone: it dates the request's state, which this does not change.
  Stmt u(stmts_, db_, "UPDATE requests SET admission=?1 WHERE id=?2");
  if (!u.ok()) return error_locked("preparing set_admission");
  if (admission_json.empty()) u.null(1);
  else u.text(1, admission_json);
  if (u.i64(2, id).step() != SQLITE_DONE) return error_locked("recording the admission of request " + std::to_string(id));
  if (sqlite3_changes(db_) == 0) return Status::not_found("request " + std::to_string(id) + " is not in the journal");
  return Status();
}

Status Journal::save_checkpoint(int64_t id, std::string_view bytes, int32_t generated_tokens) {
  const std::string which = "journal: request " + std::to_string(id);
  if (generated_tokens < 0) {
    return Status::invalid_argument(which + ": a checkpoint cannot hold " + std::to_string(generated_tokens) +
                                    " tokens");
  }
  if (bytes.empty() && generated_tokens != 0) {
    return Status::invalid_argument(which + ": an empty checkpoint (which clears it) cannot hold " +
                                    std::to_string(generated_tokens) + " tokens");
  }
  std::lock_guard<std::mutex> lk(mu_);
  // Checked here rather than left to SQLite: a size over INT_MAX would be
  // truncated when bound.
  const int64_t max_bytes = sqlite3_limit(db_, SQLITE_LIMIT_LENGTH, -1);
  if (static_cast<int64_t>(bytes.size()) > max_bytes) {
    return Status::invalid_argument(which + ": a checkpoint of " + std::to_string(bytes.size()) +
                                    " bytes is over the journal's limit of " + std::to_string(max_bytes));
  }
  // Only while running, in the WHERE clause itself: a worker's late write
  // after finish() (or after a recovery) must neither resurrect the request
  // nor replace the checkpoint a resume reads. updated_ms moves: a checkpoint
  // is progress.
  Stmt u(stmts_, db_,
         "UPDATE requests SET checkpoint=?1, checkpoint_tokens=?2, updated_ms=?3 WHERE id=?4 AND state='running'");
  if (!u.ok()) return error_locked("preparing save_checkpoint");
  if (bytes.empty()) u.null(1);
  else u.blob(1, bytes);
  u.i64(2, generated_tokens).i64(3, env_.wall_time_ms()).i64(4, id);
  if (u.step() != SQLITE_DONE) return error_locked("saving the checkpoint of request " + std::to_string(id));
  if (sqlite3_changes(db_) > 0) return Status();
  Stmt q(stmts_, db_, "SELECT state FROM requests WHERE id=?1");
  if (!q.ok()) return error_locked("preparing a lookup");
  const int rc = q.i64(1, id).step();
  if (rc == SQLITE_DONE) return Status::not_found("request " + std::to_string(id) + " is not in the journal");
  if (rc != SQLITE_ROW) return error_locked("reading request " + std::to_string(id));
  return Status::failed_precondition(which + " is " + q.col_text(0) +
                                     ", not running: a checkpoint is saved only while the request runs");
}

Status Journal::reopen(int64_t id, const std::string& placement, bool require_checkpoint) {
  std::lock_guard<std::mutex> lk(mu_);
  // Every condition in the one UPDATE: of two resumes racing for one row (here,
  // or should the mutex ever go) exactly one sees a change. The attempt count
  // stays: this is the same attempt continuing. The partial result stays until
  // finish() overwrites it.
  Stmt u(stmts_, db_,
         "UPDATE requests SET state='running', placement=?1, updated_ms=?2, resumable=0, error_code='', "
         "error_message='' WHERE id=?3 AND state IN ('failed','cancelled') AND resumable=1 AND body_kept=1 AND "
         "(checkpoint IS NOT NULL OR ?4 = 0)");
  if (!u.ok()) return error_locked("preparing reopen");
  if (u.text(1, placement).i64(2, env_.wall_time_ms()).i64(3, id).i64(4, require_checkpoint ? 1 : 0).step() !=
      SQLITE_DONE) {
    return error_locked("reopening request " + std::to_string(id));
  }
  if (sqlite3_changes(db_) > 0) return Status();
  // Refused: say why, in the order a caller would check.
  Stmt q(stmts_, db_, "SELECT state, resumable, error_code, body_kept FROM requests WHERE id=?1");
  if (!q.ok()) return error_locked("preparing a lookup");
  const int rc = q.i64(1, id).step();
  if (rc == SQLITE_DONE) return Status::not_found("request " + std::to_string(id) + " is not in the journal");
  if (rc != SQLITE_ROW) return error_locked("reading request " + std::to_string(id));
  const std::string which = "journal: request " + std::to_string(id) + " cannot be resumed: ";
  const std::string state = q.col_text(0);
  if (state == "done") return Status::failed_precondition(which + "not resumable: state done (it finished)");
  if (state != "failed" && state != "cancelled") {
    return Status::failed_precondition(which + "it is " + state + " (still in progress)");
  }
  if (q.col_i64(1) == 0) {
    const std::string code = q.col_text(2);
    return Status::failed_precondition(which + "not resumable: state " + state +
                                       (code.empty() ? std::string() : " (" + code + ")"));
  }
  // The prompt is rebuilt from the body, which a refusal did not keep.
  if (q.col_i64(3) == 0) return Status::failed_precondition(which + "its body was not kept (it was refused)");
  return Status::failed_precondition(which + "it has no checkpoint");
}

Result<Record> Journal::get(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  SPW_ASSIGN_OR_RETURN(std::optional<Record> r, find_locked("id = ?1", id));
  if (!r) return Status::not_found("request " + std::to_string(id) + " is not in the journal");
  return std::move(*r);
}

Result<Record> Journal::get_public(int64_t public_id) {
  std::lock_guard<std::mutex> lk(mu_);
  // Out of range or unknown: the same answer, so a miss tells a prober nothing.
  SPW_ASSIGN_OR_RETURN(std::optional<Record> r, find_locked("public_id = ?1", public_id));
  if (!r) return Status::not_found("request " + std::to_string(public_id) + " is not in the journal");
  return std::move(*r);
}

Result<std::optional<Record>> Journal::find_key(const std::string& owner, const std::string& key) {
  if (key.empty()) return std::optional<Record>();  // no key names no request
  std::lock_guard<std::mutex> lk(mu_);
  return find_locked("owner = ?2 AND idempotency_key = ?3", 0, owner, key);
}

std::string encode_choices(const std::vector<StoredChoice>& choices) {
  std::string out;
  for (const StoredChoice& c : choices) {
    out += std::to_string(c.finish_reason.size()) + ":" + c.finish_reason;
    out += std::to_string(c.text.size()) + ":" + c.text;
  }
  return out;
}

Result<std::vector<StoredChoice>> decode_choices(std::string_view s) {
  std::vector<StoredChoice> out;
  auto field = [&](std::string& into) -> bool {
    const size_t colon = s.find(':');
    if (colon == 0 || colon == std::string_view::npos || colon > 19) return false;
    uint64_t n = 0;
    for (size_t i = 0; i < colon; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      n = n * 10 + static_cast<uint64_t>(s[i] - '0');
    }
    if (n > s.size() - colon - 1) return false;
    into.assign(s.substr(colon + 1, n));
    s.remove_prefix(colon + 1 + n);
    return true;
  };
  while (!s.empty()) {
    StoredChoice c;
    if (!field(c.finish_reason) || !field(c.text)) return Status::corruption("journal: malformed choices column");
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace spw::journal
