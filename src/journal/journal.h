// Journal: the durable record of every request the gateway accepted, in one
// SQLite file, so that an accepted request always reaches a terminal state a
// client can read (GET /v1/requests/{id}), across crashes and restarts
// (invariant 1), and so that a retry carrying the same Idempotency-Key never
// runs a finished generation twice.
//
// Contract:
//   open(env, path)  takes PATH.lock (flock, exclusive, for the Journal's
//       life: Unavailable when another process holds it, since recovery below
//       would fail that process's requests), creates the file and schema when
//       missing (parent folder must exist), WAL mode, synchronous=FULL: a row written by accept() or
//       finish() survives a crash of the process or of the machine once the
//       call returned. Rows left non-terminal by a previous process (it
//       crashed or was killed mid-request) become kFailed with resumable =
//       true and an error naming the interruption, keeping their checkpoint
//       (see reopen()); recovered() says how many.
//       Terminal rows older than options.retention_ms are deleted then (and
//       on every options.prune_every-th accept). IOError naming the path when
//       the file cannot be opened or is not a journal. A journal of an older
//       schema version is migrated in place (one transaction: it keeps every
//       row, or the file stays as it was and open() fails); Corruption when
//       its schema version is newer than ours or unknown.
//   accept(req)      records a new request as kAccepted with id > 0 (ids are
//       never reused, also across restarts). With an idempotency key already
//       in the journal:
//         - a different body (compared byte for byte): FailedPrecondition
//           ("reused ... with a different body"); nothing changes;
//         - kDone: the stored record, replay = true (serve it, do not run);
//         - kAccepted / kRunning: FailedPrecondition naming the id ("still in
//           progress"): the client should poll it;
//         - kFailed / kCancelled: a new attempt under the same id (attempts +
//           1, result, error, admission and checkpoint cleared, state
//           kAccepted: it runs from the start), replay = false.
//   mark_running(id, placement)  kAccepted -> kRunning; on a kRunning row it
//       records the new placement (a failover before the first token moved
//       the request to another path). FailedPrecondition when terminal.
//   finish(id, outcome)  -> kDone / kCancelled / kFailed with the result or
//       the error; FailedPrecondition when the row is already terminal (a
//       terminal state is written once per attempt). kDone clears the
//       checkpoint (nothing resumes a finished request); kFailed / kCancelled
//       keep it for reopen().
//   save_checkpoint(id, bytes, generated_tokens)  replaces the row's
//       checkpoint: opaque bytes (NUL bytes included) from which generation
//       can continue, holding generated_tokens generated tokens. Only while
//       the row is kRunning: FailedPrecondition naming the state otherwise (a
//       worker's late write after finish() or after a recovery must not
//       resurrect the request or replace what a resume reads). Updates
//       updated_ms (a checkpoint is progress). Empty bytes clear it
//       (generated_tokens must then be 0); InvalidArgument for negative
//       tokens or bytes over SQLite's length limit (1e9 by default); NotFound
//       for an unknown id. It cannot tell a stale worker of an earlier run
//       from the current one once reopen() made the row kRunning again: stop
//       the old worker before resuming.
//   reopen(id, placement)  resumes an interrupted request: a kFailed or
//       kCancelled row with resumable = true and a checkpoint goes back to
//       kRunning on placement, as the same attempt (attempts unchanged; the
//       error and resumable cleared; checkpoint, admission and the partial
//       result kept until save_checkpoint() / finish() replace them). One
//       conditional UPDATE: of concurrent reopens of one id exactly one
//       succeeds. FailedPrecondition saying why otherwise ("not resumable:
//       state done", "it is running", "not resumable: state failed (code)",
//       "it has no checkpoint"); NotFound for an unknown id. mark_running()
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
// Times are Env::wall_time_ms(). Every write is one transaction.
// Thread safety: all methods may be called from any thread (one connection,
// serialised by a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/env.h"
#include "core/status.h"

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
};

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
// require_checkpoint = false).
inline bool can_resume(const Record& r) {
  return is_terminal(r.state) && r.outcome.resumable &&
         (!r.checkpoint.empty() || r.outcome.error_code == kInterruptedCode);
}

struct JournalOptions {
  int64_t retention_ms = 7LL * 24 * 3600 * 1000;  // terminal rows kept this long
  int64_t prune_every = 1000;                     // accepts between prunes
};

class Journal {
 public:
  static Result<std::unique_ptr<Journal>> open(Env& env, const std::string& path, JournalOptions options = {});
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  Result<AcceptResult> accept(const NewRequest& request);
  Status mark_running(int64_t id, const std::string& placement);
  Status finish(int64_t id, const Outcome& outcome);
  Status set_admission(int64_t id, std::string_view admission_json);
  Status save_checkpoint(int64_t id, std::string_view bytes, int32_t generated_tokens);
  // require_checkpoint = false also reopens a resumable row without one (the
  // caller resumes it from its prompt: see Gateway::start_checkpoint).
  Status reopen(int64_t id, const std::string& placement, bool require_checkpoint = true);
  Result<Record> get(int64_t id);

  int64_t recovered() const { return recovered_; }
  const std::string& path() const { return path_; }

 private:
  Journal(Env& env, std::string path, JournalOptions options);
  Status exec_locked(const char* sql);
  Status prune_locked();
  Result<std::optional<Record>> find_locked(const char* where_sql, const std::string& key, int64_t id);
  Status error_locked(const std::string& what) const;

  Env& env_;
  const std::string path_;
  const JournalOptions options_;
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  int lock_fd_ = -1;
  int64_t recovered_ = 0;
  int64_t accepts_since_prune_ = 0;
};

}  // namespace spw::journal
