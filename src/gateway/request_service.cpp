#include "gateway/request_service.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/digest.h"
#include "serve/journal_observer.h"

namespace spw::gateway {

namespace {

// What the journal records for a request refused before it ran (its
// checkpoint-less failure; `text` what it had generated before, if any).
journal::Outcome refused_outcome(const Status& st, const std::string& text = {}) {
  serve::RequestEvent fin;
  fin.kind = serve::RequestEvent::Kind::kFinished;
  fin.state = serve::RequestState::kFailed;
  fin.status = st;
  return serve::JournalObserver::outcome_of(fin, text, 0);
}

Status not_resumable(int64_t public_id, const std::string& why) {
  return Status(StatusCode::kFailedPrecondition, "request " + std::to_string(public_id) + " cannot be resumed: " + why,
                FailureReason::kNotResumable);
}

}  // namespace

RequestService::RequestService(Env& env, Gateway& gateway, RequestServiceOptions options)
    : env_(env), gateway_(gateway), options_(std::move(options)) {}

Status RequestService::journal_failure(const Status& st) {
  if (st.reason() == FailureReason::kIdempotencyConflict) return st;
  if (st.reason() == FailureReason::kJournalFull) {
    // Room comes back as requests in flight finish.
    return Status(StatusCode::kUnavailable,
                  "the request journal is full of requests still in flight, so this one is not accepted; retry "
                  "shortly: " +
                      st.message(),
                  FailureReason::kJournalFull);
  }
  return Status(StatusCode::kUnavailable,
                "the request journal cannot record the request, so it is not accepted: " + st.to_string(),
                FailureReason::kJournalUnavailable);
}

int64_t RequestService::reserve_id() {
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    const auto id = static_cast<int64_t>(env_.random_u64() & ((uint64_t{1} << 53) - 1));
    if (id != 0 && in_flight_.emplace(id, Entry{}).second) return id;
  }
}

void RequestService::bind(int64_t public_id, Entry e) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_[public_id] = std::move(e);
}

void RequestService::remove(int64_t public_id) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(public_id);
}

void RequestService::finished(int64_t public_id) {
  if (public_id != 0) remove(public_id);
}

void RequestService::record_decision(int64_t record_id, const admission::Decision& d) {
  if (!options_.journal || record_id == 0) return;
  const Status st = options_.journal->set_admission(record_id, options_.encode_decision(d));
  if (!st.ok()) {
    std::fprintf(stderr, "spillway: journal: recording the admission of request %lld: %s\n",
                 static_cast<long long>(record_id), st.to_string().c_str());
  }
}

// A refusal before the request was recorded: a summary row (size, digest,
// reason), so that a flood of refused requests costs a few bytes each.
// Returns its public id (0 when it could not be written: logged; the
// client still gets its refusal).
int64_t RequestService::record_refusal(const Submission& s, const Status& st, const admission::Decision& d) {
  journal::RefusalSummary summary;
  summary.owner = s.caller.owner;
  summary.endpoint = s.endpoint;
  summary.body_bytes = static_cast<int64_t>(s.body.size());
  summary.body_sha256 = sha256_hex(s.body);
  summary.reason = st.message().substr(0, 300);
  summary.idempotency_key = s.idempotency_key;
  Result<journal::Record> r = options_.journal->record_refusal(summary, refused_outcome(st));
  if (!r.ok()) {
    std::fprintf(stderr, "spillway: journal: recording a refusal: %s\n", r.status().to_string().c_str());
    return 0;
  }
  if (!d.verdicts.empty()) record_decision(r->id, d);
  return r->public_id;
}

SubmitOutcome RequestService::submit(Submission s) {
  SubmitOutcome out;
  auto refused = [&out](Status st, int64_t public_id = 0) {
    out.kind = SubmitOutcome::Kind::kRefused;
    out.status = std::move(st);
    out.public_id = public_id;
    return std::move(out);
  };
  journal::Journal* const journal = options_.journal.get();
  // A retry of a request this client already made is answered from the
  // journal whatever the load (a finished one replays, one in flight is a
  // conflict): only new work is refused early.
  std::optional<journal::Record> known;
  if (journal && !s.idempotency_key.empty()) {
    Result<std::optional<journal::Record>> k = journal->find_key(s.caller.owner, s.idempotency_key);
    if (!k.ok()) return refused(journal_failure(k.status()));
    known = std::move(*k);
    if (known && !journal::is_terminal(known->state)) {
      // Still running: the client learns which request its key names, so
      // that it can poll or cancel it (a non-streaming client has no other
      // way to learn the id before the answer).
      return refused(
          Status(StatusCode::kFailedPrecondition,
                 "Idempotency-Key '" + s.idempotency_key + "' names request " + std::to_string(known->public_id) +
                     ", still in progress (" + std::string(journal::state_name(known->state)) +
                     "); poll GET /v1/requests/" + std::to_string(known->public_id),
                 FailureReason::kIdempotencyConflict, "Idempotency-Key"),
          known->public_id);
    }
  }
  // Refusals that need no tokenizer: a prompt whose bytes cannot fit any
  // context, or every queue full. Journaled as a summary, never the body.
  if (!known || known->state != journal::RequestState::kDone) {
    Status pre = gateway_.precheck(s.route, s.prompt_bytes, &out.refusal);
    if (!pre.ok()) {
      const int64_t public_id = journal ? record_refusal(s, pre, out.refusal.decision) : 0;
      return refused(std::move(pre), public_id);
    }
  }
  if (journal) {
    Result<journal::AcceptResult> acc = journal->accept({s.idempotency_key, s.endpoint, s.body, s.caller.owner});
    if (!acc.ok()) {
      int64_t public_id = 0;
      // Its budget is held by requests in flight: refused, and recorded as
      // a summary when finished rows can make room for one (the journal
      // refuses that too when not: logged).
      if (acc.status().reason() == FailureReason::kJournalFull) {
        public_id = record_refusal(s, acc.status(), admission::Decision{});
      }
      return refused(journal_failure(acc.status()), public_id);
    }
    out.record_id = acc->record.id;
    out.public_id = acc->record.public_id;
    if (acc->replay) {
      out.kind = SubmitOutcome::Kind::kReplay;
      out.record = std::move(acc->record);
      return out;
    }
    s.route.generation.record_id = out.record_id;
  } else {
    out.public_id = reserve_id();
  }
  Result<Admitted> admitted = gateway_.submit(s.route, &out.refusal);
  // The decision goes into the journal before the caller answers, so that a
  // lookup after the response sees why it went where it went (or was
  // refused). No verdicts: refused before any decision (a field or the
  // tokenizer), nothing to record.
  out.recorded_attempts = admitted.ok() ? admitted->ticket->attempts() : 0;
  if (out.record_id != 0) {
    const admission::Decision d = admitted.ok() ? admitted->ticket->decision() : out.refusal.decision;
    if (!d.verdicts.empty()) record_decision(out.record_id, d);
  }
  if (!admitted.ok()) {
    if (out.record_id != 0) {
      // Refused before it queued: the journal says so, why, and whether a
      // retry may succeed; the body is dropped (its size and digest stay).
      (void)journal->finish_refused(out.record_id, refused_outcome(admitted.status()));
      return refused(admitted.status(), out.public_id);
    }
    remove(out.public_id);
    return refused(admitted.status());
  }
  out.kind = SubmitOutcome::Kind::kAccepted;
  out.ticket = admitted->ticket;
  bind(out.public_id, {out.ticket->id(), s.caller.owner, s.chat, env_.now_ns()});
  return out;
}

// The checkpoint a journaled request had at its start, from its stored
// body. The seed of a sampled request that did not send one was the
// server's and is not kept: such a run can restart only when the client
// has none of its text (another seed would contradict it).
Result<Checkpoint> RequestService::start_checkpoint_of(const Result<StoredRequest>& stored,
                                                       const std::string& received_text) {
  if (!stored.ok())
    return Status::failed_precondition("its stored body no longer parses: " + stored.status().message());
  if (stored->n > 1) {
    return Status::failed_precondition("it asked for n = " + std::to_string(stored->n) +
                                       " choices, and a request with n > 1 is not resumed (send it again)");
  }
  if (!stored->seed_given && stored->generation.sampler.temperature > 0 && !received_text.empty()) {
    return Status::failed_precondition(
        "it was interrupted before its first checkpoint and sampled with a seed the server chose and did not "
        "keep, so the text already received cannot be continued; send the request again (with a seed to make "
        "it repeatable)");
  }
  return gateway_.start_checkpoint(stored->generation, stored->model);
}

Result<ResumeOutcome> RequestService::resume(const ResumeCommand& c, Refusal* refusal) {
  if (!options_.journal) return Status::failed_precondition("this server keeps no request journal");
  Result<journal::Record> r = find_record(c.public_id, c.caller);
  if (!r.ok()) return r.status();
  const int64_t id = r->id;
  if (!journal::can_resume(*r)) {
    return not_resumable(c.public_id, r->checkpoint.empty() ? "it has no checkpoint (state " +
                                                                  std::string(journal::state_name(r->state)) + ")"
                                                            : "it is " + std::string(journal::state_name(r->state)));
  }
  // A run the server died in before its first checkpoint (a kill during the
  // prefill or the first tokens) continues from its prompt: the checkpoint
  // it would have had at its start.
  const bool from_prompt = r->checkpoint.empty();
  // The stored body, parsed once: the start checkpoint and the limits it asked for.
  const Result<StoredRequest> stored = options_.parse_stored(*r);
  Result<Checkpoint> cp = from_prompt ? start_checkpoint_of(stored, c.received_text) : parse_checkpoint(r->checkpoint);
  if (!cp.ok()) {
    return not_resumable(
        c.public_id, from_prompt ? cp.status().message() : "its checkpoint is unreadable: " + cp.status().message());
  }
  // Taken back to running before anything runs: a second resume of the
  // same id is a conflict from here on.
  if (Status st = options_.journal->reopen(id, "", /*require_checkpoint=*/!from_prompt); !st.ok()) {
    if (st.code() == StatusCode::kFailedPrecondition) return not_resumable(c.public_id, st.message());
    return journal_failure(st);
  }
  ResumeRequest rr;
  rr.record_id = id;
  // What the original request asked for, reported in the limits again.
  if (stored.ok()) rr.max_tokens_requested = stored->max_tokens_requested;
  rr.checkpoint = std::make_shared<const Checkpoint>(std::move(*cp));
  rr.received_text = c.received_text;
  rr.allow_migration = c.allow_migration;
  Refusal local;
  Refusal& why = refusal ? *refusal : local;
  Result<Resumed> resumed = gateway_.resume(rr, &why);
  if (!why.decision.verdicts.empty() || resumed.ok()) {
    record_decision(id, resumed.ok() ? resumed->admitted.ticket->decision() : why.decision);
  }
  if (!resumed.ok()) {
    // Still resumable from the same checkpoint (the journal keeps it),
    // unless the client's text disagrees with it.
    const Status& st = resumed.status();
    journal::Outcome o = refused_outcome(st, r->outcome.text);
    o.error_code = r->outcome.error_code;
    o.error_message = r->outcome.error_message + " (resume refused: " + st.message() + ")";
    o.resumable = true;
    (void)options_.journal->finish(id, o);
    return st;
  }
  ResumeOutcome out;
  out.ticket = resumed->admitted.ticket;
  out.unsent = std::move(resumed->unsent);
  out.resumed_at_token = rr.checkpoint->n_generated;
  out.record_id = id;
  out.endpoint = r->endpoint;
  bind(c.public_id, {out.ticket->id(), c.caller.owner, r->endpoint == "/v1/chat/completions", env_.now_ns()});
  return out;
}

std::optional<journal::JournalStats> RequestService::journal_stats() {
  if (!options_.journal) return std::nullopt;
  Result<journal::JournalStats> r = options_.journal->stats();
  if (!r.ok()) return std::nullopt;
  return std::move(*r);
}

Result<journal::Record> RequestService::find_record(int64_t public_id, const Caller& caller) {
  if (!options_.journal) return Status::not_found("request " + std::to_string(public_id));
  Result<journal::Record> r = options_.journal->get_public(public_id);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kNotFound) return r.status();
    return journal_failure(r.status());
  }
  if (!visible(r->owner, caller)) return Status::not_found("request " + std::to_string(public_id));
  return r;
}

Result<CancelOutcome> RequestService::cancel(int64_t public_id, const Caller& caller) {
  std::shared_ptr<serve::Ticket> t;
  if (options_.journal) {
    Result<journal::Record> r = find_record(public_id, caller);
    if (r.ok()) t = gateway_.find_by_record(r->id);
  } else {
    std::optional<uint64_t> ticket;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_flight_.find(public_id);
      if (it != in_flight_.end() && it->second.ticket != 0 && visible(it->second.owner, caller)) {
        ticket = it->second.ticket;
      }
    }
    if (ticket) t = gateway_.find(*ticket);
  }
  if (!t || serve::is_terminal(t->state())) {
    return Status::not_found("request " + std::to_string(public_id) + " is not in flight");
  }
  CancelOutcome out;
  out.cancelled = gateway_.cancel(t->id());
  out.state = t->state();
  return out;
}

std::vector<InFlightRequest> RequestService::in_flight(const Caller& caller) const {
  std::vector<InFlightRequest> out;
  std::vector<std::pair<int64_t, Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : in_flight_) {
      if (e.ticket != 0 && visible(e.owner, caller)) entries.emplace_back(id, e);
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.second.accepted_ns < b.second.accepted_ns; });
  for (const auto& [id, e] : entries) {
    std::shared_ptr<serve::Ticket> t = gateway_.find(e.ticket);
    if (!t || serve::is_terminal(t->state())) continue;
    out.push_back({id, e.chat, e.accepted_ns, std::move(t)});
  }
  return out;
}

}  // namespace spw::gateway
