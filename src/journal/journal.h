// Journal: the durable record of every request the gateway accepted, in one
// SQLite file, so that an accepted request always reaches a terminal state a
// client can read (GET /v1/requests/{id}), across crashes and restarts
// (invariant 1), and so that a retry carrying the same Idempotency-Key never
// runs a finished generation twice.
//
// Identity: every row has two ids. `id` is the AUTOINCREMENT key every
// method but get_public() takes: dense and predictable, for the gateway's own
// use only. `public_id` is what a client is shown and reads back with
// get_public(): a random integer in [1, 2^53 - 1] (exact in a JSON number),
// drawn from Env::random_u64(), unique (drawn again on the rare collision;
// Internal, and nothing written, should 64 draws in a row collide: an Env
// whose numbers repeat), fixed for the row's life, so that one client cannot
// read another's request by counting. Messages meant for clients name it,
// never `id`. Under a simulated Env the draws are deterministic, as the
// drill's simulation needs.
// Owners: a request belongs to an owner (the API key it came with, as the
// HTTP layer names it; empty: no key in use). Idempotency keys are scoped to
// their owner: the same key under two owners names two requests, so a client
// can neither replay nor block another's request by guessing its key.
//
// Contract:
//   open(env, path)  locks the database file itself, not its name: the file
//       is created when missing (parent folder must exist; O_CREAT, then the
//       lock, so two processes creating one new journal cannot both win) and
//       flock()ed exclusively through a descriptor held for the Journal's
//       life. The lock belongs to the file (its inode), so a symlink or a
//       hard link to a live journal is refused as the path itself is:
//       Unavailable naming the path when another process holds it, or when
//       another Journal in this process has the same file open (checked by
//       device and inode before any descriptor is opened: closing a
//       descriptor of a file drops every POSIX lock this process holds on it,
//       SQLite's included). Recovery below would fail the other owner's
//       requests, and a resume would run them twice. flock and SQLite's own
//       fcntl locks are independent on Linux (not on NFS, where flock is
//       emulated with fcntl locks: a journal on NFS is not supported, as
//       SQLite's WAL is not). SQLite opens the file by its resolved path
//       (symlinks followed), so every symlink to it shares one -wal file.
//       Creates the schema when missing, WAL mode, synchronous=FULL: a row
//       written by accept() or
//       finish() survives a crash of the process or of the machine once the
//       call returned. Rows left non-terminal by a previous process (it
//       crashed or was killed mid-request) become kFailed with resumable =
//       true and an error naming the interruption, keeping their checkpoint
//       (see reopen()); recovered() says how many.
//       Terminal rows older than options.retention_ms are deleted then (and
//       on every options.prune_every-th accept() or record_refusal()), and,
//       with a size budget, rows are pruned down to it (see Size budget).
//       InvalidArgument for options out of range (see JournalOptions).
//       IOError naming the path when
//       the file cannot be opened or is not a journal. A journal of an older
//       schema version is migrated in place (one transaction: it keeps every
//       row, its id, idempotency key and the id counter, or the file stays as
//       it was and open() fails); rows from before version 4 get a random
//       public id, owner "" (no key) and their body's size and digest.
//       Corruption when its schema version is newer than ours or unknown.
//   accept(req)      records a new request as kAccepted with id > 0 (ids are
//       never reused, also across restarts), a fresh public_id, the body with
//       its size and SHA-256 (body_kept = true). With an idempotency key
//       already in the journal under the same owner (see find_key()):
//         - a different body or endpoint: FailedPrecondition ("reused ...
//           with a different body"); nothing changes. Bodies are compared by
//           SHA-256 digest, not byte for byte: a refused row no longer holds
//           its body (finish_refused()), only its digest;
//         - kDone: the stored record, replay = true (serve it, do not run);
//         - kAccepted / kRunning: FailedPrecondition naming the public id
//           ("still in progress"): the client should poll it;
//         - kFailed / kCancelled: a new attempt under the same id and public
//           id (attempts + 1, result, error, admission and checkpoint
//           cleared, the body stored again, state kAccepted: it runs from the
//           start), replay = false.
//       With a size budget (options.max_bytes > 0) a write that stores a body
//       first makes room for it (see Size budget): ResourceExhausted with
//       FailureReason::kJournalFull, naming the budget and the size in use,
//       and nothing changes, when even pruning every prunable row cannot. A
//       replay and a conflict write nothing and are never refused for space.
//   find_key(owner, key)  the row the owner's idempotency key names, if any
//       (an empty key names none: std::nullopt).
//   mark_running(id, placement)  kAccepted -> kRunning; on a kRunning row it
//       records the new placement (a failover before the first token moved
//       the request to another path). FailedPrecondition when terminal.
//   finish(id, outcome)  -> kDone / kCancelled / kFailed with the result or
//       the error, and the response's other fields (seed, queue_ms, run_ms,
//       max_tokens_requested: what a replay answers with);
//       FailedPrecondition when the row is already terminal (a
//       terminal state is written once per attempt). kDone clears the
//       checkpoint (nothing resumes a finished request); kFailed / kCancelled
//       keep it for reopen(). A body over options.max_body_bytes_kept is
//       dropped as finish_refused() drops it (body empty, body_kept = false,
//       size and digest kept) when the row ends kDone, or any terminal state
//       that is not resumable: nothing can run it from its body any more (a
//       replay serves the stored result; a retry under its key is a new
//       attempt that stores the body again). A resumable failure or
//       cancellation keeps it: a resume rebuilds the prompt from it. Never
//       refused for space (an accepted request must reach its terminal
//       state): what it adds is made up for at the next accept().
//   finish_refused(id, outcome)  finish() for a request the gateway refused
//       after accept() recorded it (admission, a full queue): the same
//       preconditions and errors, and it also drops the stored body and any
//       checkpoint (body empty, body_kept = false; body_bytes and
//       body_sha256 kept, so a retry under the key is still compared), so
//       that a flood of refused requests does not fill the disk with their
//       bodies. Such a row cannot be resumed (nothing to rebuild the prompt
//       from); a retry with the same key is a new attempt as above and
//       stores its body again.
//   record_refusal(summary, outcome)  one new terminal row (state from
//       outcome, normally kFailed) for a request refused before it was
//       recorded (queue full, a prompt too long for any context): owner,
//       endpoint, the body's size and digest and the reason (refusal_reason)
//       from the summary, no body (body_kept = false), a fresh id and
//       public_id. With an idempotency key it is an attempt under that key,
//       as accept() would have made it: a new row holding the key, or, when
//       the owner's key names a failed or cancelled row, that row as its
//       next attempt (attempts + 1, its result, admission and checkpoint
//       cleared), so that a retry after the refusal runs under the same id;
//       the same FailedPrecondition (kIdempotencyConflict) as accept() for a
//       different digest or endpoint, or a row in progress; and for a done
//       row (the caller replays it instead of refusing). InvalidArgument for
//       a non-terminal state, negative body_bytes, or a body_sha256 that is
//       neither empty nor 64 lowercase hex characters.
//   save_checkpoint(id, bytes, generated_tokens)  replaces the row's
//       checkpoint: opaque bytes (NUL bytes included) from which generation
//       can continue, holding generated_tokens generated tokens. Only while
//       the row is kRunning (never refused for space, as finish()):
//       FailedPrecondition naming the state otherwise (a
//       worker's late write after finish() or after a recovery must not
//       resurrect the request or replace what a resume reads). Updates
//       updated_ms (a checkpoint is progress). Empty bytes clear it
//       (generated_tokens must then be 0); InvalidArgument for negative
//       tokens or bytes over SQLite's length limit (1e9 by default); NotFound
//       for an unknown id. It cannot tell a stale worker of an earlier run
//       from the current one once reopen() made the row kRunning again: stop
//       the old worker before resuming.
//   reopen(id, placement)  resumes an interrupted request: a kFailed or
//       kCancelled row with resumable = true, its body kept and a checkpoint
//       goes back to kRunning on placement, as the same attempt (attempts unchanged; the
//       error and resumable cleared; checkpoint, admission and the partial
//       result kept until save_checkpoint() / finish() replace them). One
//       conditional UPDATE: of concurrent reopens of one id exactly one
//       succeeds. FailedPrecondition saying why otherwise ("not resumable:
//       state done", "it is running", "not resumable: state failed (code)",
//       "its body was not kept", "it has no checkpoint"); NotFound for an
//       unknown id. mark_running()
//       never does this: it moves only kAccepted / kRunning rows.
//   set_admission(id, json)  records the admission decision the request was
//       admitted or refused under (a JSON object, as the HTTP layer renders
//       it; written before the client's response, so a GET after it sees
//       it), replacing the previous one: each attempt under an idempotency
//       key is decided anew. Allowed in any state, since a request may
//       already have finished when it is written; updated_ms is unchanged.
//       Empty json clears it. NotFound for an unknown id; InvalidArgument
//       when the text is not a JSON object.
//   get(id)          the record (checkpoint included), or NotFound.
//   get_public(public_id)  the same by public id, or NotFound naming the
//       public id (also for ids out of range: every miss looks the same).
// Size budget (options.max_bytes > 0; 0: none, as before). The journal's
//   size is the database's pages in use ((page_count - freelist_count) x
//   page_size: SQLite reuses free pages, so the file stops growing once rows
//   are deleted, and never shrinks; VACUUM it offline to return the space)
//   plus its -wal file, which the budget bounds too: the WAL is checkpointed
//   every max_bytes / 16 (16 to 1000 pages, SQLite's default) and truncated
//   to that after a checkpoint (journal_size_limit), and a write that would
//   take it past max_bytes / 8 checkpoints and truncates it first. Before a
//   write that stores a body (accept(), record_refusal()), if the size after
//   it (estimated from the body's size: pages for the row and the WAL
//   frames it writes) would pass max_bytes, terminal rows are deleted, in
//   one transaction with the write, until it fits with max_bytes / 32 to
//   spare (pruning in chunks keeps the scan for candidates rare), in this
//   order: rows nothing can resume (done, refused, failed or cancelled
//   without resumable, or whose body was dropped) oldest first (by
//   updated_ms, then id), then resumable failures and cancellations oldest
//   first; accepted and running rows never. So the database and WAL
//   together stay within about max_bytes; a single write larger than the
//   WAL's share (max_bytes / 8) passes it by its own size while the WAL holds
//   it, until the next write checkpoints and truncates the WAL. With a
//   budget, secure_delete is FAST: freed pages are not zeroed (which would
//   write each again, through the WAL) but reused by later writes. open()
//   prunes an over-budget journal (a lowered budget) the same way. finish(),
//   save_checkpoint() and the other updates are not checked (see finish()).
// Times are Env::wall_time_ms(). Every write is one transaction.
// Thread safety: all methods may be called from any thread (one connection,
// serialised by a mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "journal/statement_cache.h"

struct sqlite3;

namespace spw::journal {

enum class RequestState { kAccepted, kRunning, kDone, kCancelled, kFailed };
std::string_view state_name(RequestState s);  // "accepted", "running", "done", "cancelled", "failed"
inline bool is_terminal(RequestState s) {
  return s == RequestState::kDone || s == RequestState::kCancelled || s == RequestState::kFailed;
}

struct NewRequest {
  std::string idempotency_key;  // empty: none
  std::string endpoint;         // "/v1/completions", "/v1/chat/completions"
  std::string body;             // the request body as received
  std::string owner;            // who sent it (the API key's name); empty: no key in use
};

struct Outcome {
  RequestState state = RequestState::kDone;  // kDone, kCancelled or kFailed
  bool resumable = false;        // a retry with the same key may run it again with the same result
  std::string finish_reason;     // kDone: "stop" | "length"
  std::string text;              // what was generated (all of it for kDone)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  std::string error_code;        // kFailed / kCancelled: e.g. "queue_full", "cancelled"
  std::string error_message;
  // The original response's other fields, so that a replay answers with
  // them. The seed the generation sampled with (the client's, or the one the
  // server chose); every uint64_t value round-trips (stored as the int64_t
  // with the same bits). nullopt: none known.
  std::optional<uint64_t> seed;
  double queue_ms = 0;  // milliseconds spent queued
  double run_ms = 0;    // milliseconds spent running
  std::optional<int32_t> max_tokens_requested;  // the client's max_tokens; nullopt: not sent
  // A request with n > 1 (OpenAI's n): choices 1..n-1 as encode_choices
  // writes them (text and finish_reason above are choice 0's); empty: n = 1.
  std::string choices;
};

// One stored choice of a request with n > 1.
struct StoredChoice {
  std::string finish_reason;
  std::string text;
};
// Length-prefixed ("<bytes>:<finish_reason><bytes>:<text>" per choice), so
// any bytes round-trip; decode_choices is Corruption for anything else.
std::string encode_choices(const std::vector<StoredChoice>& choices);
Result<std::vector<StoredChoice>> decode_choices(std::string_view encoded);

struct Record {
  int64_t id = 0;
  std::string idempotency_key;
  std::string endpoint;
  std::string body;
  RequestState state = RequestState::kAccepted;
  int32_t attempts = 1;
  std::string placement;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  Outcome outcome;  // meaningful once terminal
  std::string admission;  // the admission decision, a JSON object; empty: none recorded
  std::string checkpoint;  // opaque bytes a resume continues from (may hold NULs); empty: none
  int32_t checkpoint_tokens = 0;  // generated tokens the checkpoint holds
  int64_t public_id = 0;  // what clients see (see Identity above); 0 only in a Record not read from a journal
  std::string owner;      // empty: no API key in use
  int64_t body_bytes = 0;    // the body's size as received, also when not kept
  std::string body_sha256;   // its SHA-256, 64 lowercase hex (empty: a refusal recorded without one)
  bool body_kept = true;     // false: only the size and digest are stored (body empty): a refusal, or a
                             // body over max_body_bytes_kept that nothing can run from any more
  std::string refusal_reason;  // record_refusal()'s reason; empty for every other row
};

struct AcceptResult {
  Record record;
  bool replay = false;  // a finished request for this key: serve record, run nothing
};

// The error code recovery gives a request its process died under (a crash
// or kill -9 while it ran: see Journal::open).
inline constexpr std::string_view kInterruptedCode = "interrupted";

// Whether a resume (POST /v1/requests/{id}/resume) may continue `r`: a
// terminal, resumable row with a checkpoint, or one interrupted before its
// first checkpoint (continued from its prompt; reopen() it with
// require_checkpoint = false). Never a row whose body was dropped (a
// refusal): the prompt is rebuilt from the body.
inline bool can_resume(const Record& r) {
  return is_terminal(r.state) && r.outcome.resumable && r.body_kept &&
         (!r.checkpoint.empty() || r.outcome.error_code == kInterruptedCode);
}

// What record_refusal() keeps of a request refused before it was recorded:
// enough to count and explain it, not the body.
struct RefusalSummary {
  std::string owner;        // empty: no API key in use
  std::string endpoint;
  int64_t body_bytes = 0;
  std::string body_sha256;  // core/digest.h's sha256_hex of the body; empty: not computed
  std::string reason;       // why it was refused, e.g. "queue_full", "context_full"
  std::string idempotency_key;  // empty: none
};

// What /metrics shows of the journal: rows by state and the file's size.
struct JournalStats {
  std::map<std::string, int64_t> rows_by_state;  // state_name -> rows (every state present, 0 included)
  int64_t file_bytes = 0;  // the database (page_count x page_size), not its write-ahead log
  int64_t wal_bytes = 0;   // the -wal file beside it (0: none)
  int64_t used_bytes = 0;  // the database's pages in use ((page_count - freelist_count) x page_size)
  int64_t max_bytes = 0;   // the size budget (0: none)
  int64_t pruned_for_space = 0;  // rows deleted to keep to the budget since open()
};

// A kept equivalence verdict (see Journal::load_equivalence).
struct EquivalenceVerdict {
  bool passed = false;
  std::string detail;   // what was compared, or where the texts differed
  double ms = 0;        // how long the check took
  int64_t checked_ms = 0;  // when (the Env's wall clock)
};

struct JournalOptions {
  int64_t retention_ms = 7LL * 24 * 3600 * 1000;  // terminal rows kept this long
  int64_t prune_every = 1000;                     // accepts between prunes
  // The size budget (see Size budget), bytes; 0: none. Otherwise at least
  // kMinJournalBytes (the schema and a few rows).
  int64_t max_bytes = 0;
  // Bodies larger than this (bytes) are kept only while the request may
  // still run from them (see finish()); 0: every body is kept.
  int64_t max_body_bytes_kept = 0;
};

// The smallest size budget open() accepts.
inline constexpr int64_t kMinJournalBytes = 256 * 1024;

class Journal {
 public:
  static Result<std::unique_ptr<Journal>> open(Env& env, const std::string& path, JournalOptions options = {});
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  Result<AcceptResult> accept(const NewRequest& request);
  Result<std::optional<Record>> find_key(const std::string& owner, const std::string& key);
  Status mark_running(int64_t id, const std::string& placement);
  Status finish(int64_t id, const Outcome& outcome);
  Status finish_refused(int64_t id, const Outcome& outcome);
  Result<Record> record_refusal(const RefusalSummary& summary, const Outcome& outcome);
  Status set_admission(int64_t id, std::string_view admission_json);
  Status save_checkpoint(int64_t id, std::string_view bytes, int32_t generated_tokens);
  // require_checkpoint = false also reopens a resumable row without one (the
  // caller resumes it from its prompt: see Gateway::start_checkpoint).
  Status reopen(int64_t id, const std::string& placement, bool require_checkpoint = true);
  Result<Record> get(int64_t id);
  Result<Record> get_public(int64_t public_id);

  // Rows by state and bytes on disk. IoError when SQLite cannot answer.
  Result<JournalStats> stats();

  // The verdict of an equivalence check between two execution paths (the
  // gateway's verify_equivalence), kept under `key` so that a restart with
  // the same model, placements, devices and binary does not run it again.
  // load: nullopt when none is kept. save replaces an earlier one. Not
  // subject to retention or the size budget (a few rows, one per pair).
  Result<std::optional<EquivalenceVerdict>> load_equivalence(const std::string& key);
  Status save_equivalence(const std::string& key, const EquivalenceVerdict& verdict);

  int64_t recovered() const { return recovered_; }
  const std::string& path() const { return path_; }

 private:
  Journal(Env& env, std::string path, JournalOptions options);
  // sqlite3_exec: parsed on every call, for open()'s one-off SQL.
  Status exec_locked(const char* sql);
  // One statement from stmts_ (transaction control on the request paths).
  Status step_locked(const char* sql);
  Status prune_locked();
  // One row by a WHERE clause over ?1 = n, ?2 = owner, ?3 = key (any subset).
  Result<std::optional<Record>> find_locked(const char* where_sql, int64_t n, const std::string& owner = {},
                                            const std::string& key = {});
  // A public id no row has yet (see Identity).
  Result<int64_t> new_public_id_locked();
  // Gives rows the 3 -> 4 migration copied their public id, size and digest.
  Status complete_migrated_rows_locked();
  // finish() and finish_refused(); takes mu_.
  Status finish_row(int64_t id, const Outcome& outcome, bool drop_body);
  Status count_accept_locked();
  Status error_locked(const std::string& what) const;
  // Creates the file when missing and locks it (see open()); sets lock_fd_,
  // file_dev_, file_ino_ and db_path_.
  Status lock_file();
  // The database's pages in use, in bytes (see Size budget).
  Result<int64_t> used_bytes_locked();
  // The -wal file's size (0: none).
  int64_t wal_bytes_locked() const;
  // Outside a transaction: checkpoints and truncates the WAL when writing a
  // body of body_bytes would take it past its share of the budget.
  void bound_wal_locked(int64_t body_bytes);
  // Inside the write's transaction: prunes rows (never keep_id) until a
  // write storing body_bytes fits the budget; ResourceExhausted
  // (kJournalFull) when it cannot. A no-op without a budget.
  Status make_room_locked(int64_t body_bytes, int64_t keep_id);

  Env& env_;
  const std::string path_;
  const JournalOptions options_;
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  StatementCache stmts_;  // every statement the request paths run, prepared once (statement_cache.h)
  std::string db_path_;    // the file SQLite opened: path_ with symlinks resolved
  int lock_fd_ = -1;       // the database file, flock()ed
  uint64_t file_dev_ = 0;  // its identity, registered while this Journal lives
  uint64_t file_ino_ = 0;
  int64_t page_size_ = 4096;
  int64_t recovered_ = 0;
  int64_t accepts_since_prune_ = 0;
  int64_t pruned_for_space_ = 0;
};

}  // namespace spw::journal
