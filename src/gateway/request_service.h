// RequestService: the one owner of a request's life between a front end
// (the HTTP server; the drill's simulation, which drives this same code on
// its simulated clock) and the Gateway.
//
// Contract:
//   submit()   idempotency (a key of this owner that names a finished
//              request replays it, one in flight is a conflict), the early
//              refusal that needs no tokenizer (Gateway::precheck), the
//              journal row (accept, or a refusal summary), Gateway::submit,
//              the admission decision journaled before the caller answers,
//              a refusal finished in the journal. One outcome: accepted (a
//              ticket), replay (the finished record), or refused (a typed
//              Status, the gateway's decision when it made one, and the
//              journal row the refusal was recorded as).
//   resume()   POST /v1/requests/{id}/resume: the record (the caller's own),
//              its checkpoint (or its prompt's, for a run killed before its
//              first checkpoint), the row reopened (a second resume is a
//              conflict from then on), Gateway::resume, the decision
//              journaled; a refused resume leaves the row resumable.
//   find_record(), cancel(), in_flight(): a request by the id clients see,
//              only the caller's own (NotFound otherwise, so another
//              client's ids do not even show they exist).
//   record_decision(): a request that failed over since it was accepted
//              runs under a new decision; the front end notices (it reads
//              the ticket for its response) and the journal gets it.
// Every journal write a front end caused is here, in this order; the
// scheduler's JournalObserver writes what happens on the worker
// (transitions, checkpoints, the outcome).
// Errors are typed (FailureReason), so that one table (core/failure.h
// classify) gives the HTTP status and code: kIdempotencyConflict (field
// "Idempotency-Key"), kJournalFull, kJournalUnavailable, kNotResumable,
// NotFound, and the gateway's own refusals.
// Without a journal the public ids are made here (random 53-bit, so one
// client cannot enumerate another's), cancel finds tickets by them, and
// nothing resumes (FailedPrecondition).
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "gateway/gateway.h"
#include "journal/journal.h"

namespace spw::gateway {

// Who asks: the owner label of an API key ("" without keys); an admin sees
// every request.
struct Caller {
  std::string owner;
  bool admin = false;
};

// What the front end reads back from a journaled body (its own wire format):
// the generation it asked for and what a resume needs to know of it.
struct StoredRequest {
  serve::GenerationRequest generation;
  // The route model its body named (RouteRequest::model: a fallback or
  // catalogue model's id; "" the service's model), so that a restart from
  // its prompt runs that model.
  std::string model;
  bool seed_given = false;  // the client sent a seed (else the server chose one, not kept)
  int32_t n = 1;
  std::optional<int32_t> max_tokens_requested;
};

struct RequestServiceOptions {
  std::shared_ptr<journal::Journal> journal;  // null: no journal
  // Records belong to their owners; false: every client is one user (no
  // API keys), so any caller sees every record.
  bool separate_owners = false;
  // The journal's admission column: a decision as the front end shows it
  // back (GET /v1/requests/{id}, a replay's route). Required with a journal.
  std::function<std::string(const admission::Decision&)> encode_decision;
  // A stored body parsed again (resume: the limits it asked for, and the
  // start checkpoint of a run killed before its first one). Required with
  // a journal.
  std::function<Result<StoredRequest>(const journal::Record&)> parse_stored;
};

struct Submission {
  Caller caller;
  std::string endpoint;  // "/v1/completions" or "/v1/chat/completions"
  std::string body;      // as received: the journal keeps it for a resume or a replay
  std::string idempotency_key;
  bool chat = false;
  RouteRequest route;
  // Gateway::precheck's bound: the prompt's bytes (0: unknown, a token-id prompt).
  size_t prompt_bytes = 0;
};

struct SubmitOutcome {
  enum class Kind { kAccepted, kReplay, kRefused };
  Kind kind = Kind::kRefused;
  int64_t public_id = 0;                  // the id clients see; refused: the row it was recorded as (0: none)
  int64_t record_id = 0;                  // the journal's row (0: not journaled)
  std::shared_ptr<serve::Ticket> ticket;  // kAccepted
  int32_t recorded_attempts = 0;          // kAccepted: the attempt whose decision was journaled
  std::optional<journal::Record> record;  // kReplay: the finished request
  Status status;                          // kRefused: why
  Refusal refusal;                        // kRefused by the gateway: its decision
};

struct ResumeCommand {
  Caller caller;
  int64_t public_id = 0;
  std::string received_text;
  bool allow_migration = true;
};

struct ResumeOutcome {
  std::shared_ptr<serve::Ticket> ticket;
  std::string unsent;  // checkpoint text the client lacks: sent before the ticket's
  int32_t resumed_at_token = 0;
  int64_t record_id = 0;
  std::string endpoint;  // the original request's
};

struct CancelOutcome {
  bool cancelled = false;  // false: it was finishing anyway
  serve::RequestState state = serve::RequestState::kQueued;
};

// A request in flight as a client may list it.
struct InFlightRequest {
  int64_t public_id = 0;
  bool chat = false;
  int64_t accepted_ns = 0;
  std::shared_ptr<serve::Ticket> ticket;
};

class RequestService {
 public:
  RequestService(Env& env, Gateway& gateway, RequestServiceOptions options);
  RequestService(const RequestService&) = delete;
  RequestService& operator=(const RequestService&) = delete;

  bool has_journal() const { return options_.journal != nullptr; }

  SubmitOutcome submit(Submission s);
  // refusal: the gateway's decision when it refused the resume.
  Result<ResumeOutcome> resume(const ResumeCommand& c, Refusal* refusal = nullptr);
  Result<journal::Record> find_record(int64_t public_id, const Caller& caller);
  Result<CancelOutcome> cancel(int64_t public_id, const Caller& caller);
  // The caller's requests still in flight, oldest first.
  std::vector<InFlightRequest> in_flight(const Caller& caller) const;
  // The request's response is complete: it leaves the in-flight list.
  void finished(int64_t public_id);
  // A decision a journaled request runs under (logged, not fatal, when the
  // write fails: the request's own record is already safe).
  void record_decision(int64_t record_id, const admission::Decision& d);

  // The journal's row counts and size (metrics); nullopt without a journal
  // or when SQLite cannot answer now.
  std::optional<journal::JournalStats> journal_stats();

  // A journal failure as the service reports it (typed; see the contract).
  static Status journal_failure(const Status& st);

 private:
  struct Entry {
    uint64_t ticket = 0;  // 0: id reserved, not submitted yet
    std::string owner;
    bool chat = false;
    int64_t accepted_ns = 0;
  };

  bool visible(const std::string& owner, const Caller& c) const {
    return c.admin || !options_.separate_owners || owner == c.owner;
  }
  int64_t reserve_id();
  void bind(int64_t public_id, Entry e);
  void remove(int64_t public_id);
  int64_t record_refusal(const Submission& s, const Status& st, const admission::Decision& d);
  Result<Checkpoint> start_checkpoint_of(const Result<StoredRequest>& stored, const std::string& received_text);

  Env& env_;
  Gateway& gateway_;
  RequestServiceOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, Entry> in_flight_;
};

}  // namespace spw::gateway
