// JournalObserver: writes a Scheduler's request progress to the Journal.
//
// Contract: for a ticket with a record_id (0: not journaled, ignored),
// on_start marks the row running with the placement; on_finish writes the
// terminal state: kDone with the finish reason and all the text, kCancelled or
// kFailed with the status's code name and message, and in every case the
// ticket's seed, queue and run times (as of on_finish, a moment before the
// scheduler stamps the end) and the client's max_tokens, which a replay
// answers with; on_checkpoint stores the
// serialized checkpoint in the row (the journal keeps it for a failed or
// cancelled row: a resume continues from it, also after a restart).
// resumable is true when
// running the same request again may succeed (cancelled, resource exhausted,
// unavailable, device lost, deadline exceeded): no complete result was
// delivered, so a retry with the same Idempotency-Key runs it again. A journal
// write that fails is logged to stderr and counted (write_errors()); it never
// fails the request, whose client still gets its answer.
// Thread safety: as Journal; called from the scheduler's worker threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "journal/journal.h"
#include "serve/scheduler.h"

namespace spw::serve {

class JournalObserver final : public RequestObserver {
 public:
  explicit JournalObserver(std::shared_ptr<journal::Journal> journal) : journal_(std::move(journal)) {}
  void on_start(const Ticket& ticket, const std::string& placement) override;
  void on_finish(const Ticket& ticket, const RequestEvent& final_event, const std::string& text) override;
  void on_checkpoint(const Ticket& ticket, const Checkpoint& checkpoint) override;
  uint64_t write_errors() const { return write_errors_.load(); }

  // The journal outcome of a scheduler's final event (also used for requests
  // the scheduler refused at submit, with state kFailed). It knows no ticket:
  // seed, queue_ms, run_ms and max_tokens_requested are left for the caller.
  static journal::Outcome outcome_of(const RequestEvent& final_event, const std::string& text, int32_t prompt_tokens);

 private:
  void check(const Status& st, const Ticket& ticket, const char* what);
  std::shared_ptr<journal::Journal> journal_;
  std::atomic<uint64_t> write_errors_{0};
};

}  // namespace spw::serve
