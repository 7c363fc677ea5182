#include "serve/journal_observer.h"

#include <cstdio>

#include "core/failure.h"

namespace spw::serve {

journal::Outcome JournalObserver::outcome_of(const RequestEvent& fin, const std::string& text, int32_t prompt_tokens) {
  journal::Outcome o;
  o.text = text;
  o.prompt_tokens = prompt_tokens;
  o.completion_tokens = fin.completion_tokens;
  switch (fin.state) {
    case RequestState::kDone:
      o.state = journal::RequestState::kDone;
      o.finish_reason = std::string(finish_reason_name(fin.finish));
      return o;
    case RequestState::kCancelled: o.state = journal::RequestState::kCancelled; break;
    default: o.state = journal::RequestState::kFailed; break;
  }
  const FailureClass fc = classify(fin.status);
  o.resumable = fc.resumable;
  o.error_code = std::string(fc.code);
  o.error_message = fin.status.message();
  return o;
}

void JournalObserver::check(const Status& st, const Ticket& t, const char* what) {
  if (st.ok()) return;
  write_errors_.fetch_add(1);
  std::fprintf(stderr, "spillway: journal: %s request %lld: %s\n", what, static_cast<long long>(t.record_id()),
               st.to_string().c_str());
}

void JournalObserver::on_start(const Ticket& t, const std::string& placement) {
  if (t.record_id() == 0) return;
  check(journal_->mark_running(t.record_id(), placement), t, "marking running");
}

void JournalObserver::on_checkpoint(const Ticket& t, const Checkpoint& cp) {
  if (t.record_id() == 0) return;
  check(journal_->save_checkpoint(t.record_id(), serialize_checkpoint(cp), cp.n_generated), t, "checkpointing");
}

void JournalObserver::on_finish(const Ticket& t, const RequestEvent& fin, const std::string& text) {
  if (t.record_id() == 0) return;
  const AppliedLimits limits = t.limits();
  journal::Outcome o = outcome_of(fin, text, limits.prompt_tokens);
  // What the response reports besides the text, so that a replay says the
  // same: the seed it sampled with (the client's or the one the server
  // chose), the times (the scheduler stamps the end before on_finish, so
  // they are the response's) and the max_tokens the client asked for.
  o.seed = t.seed();
  o.queue_ms = static_cast<double>(t.queue_ns()) / 1e6;
  o.run_ms = static_cast<double>(t.run_ns()) / 1e6;
  o.max_tokens_requested = limits.max_tokens_requested;
  // n > 1: `text` is choice 0's (the scheduler's); the others go with it.
  const std::vector<std::string>& texts = t.choice_texts();
  if (texts.size() > 1) {
    std::vector<journal::StoredChoice> more;
    for (size_t i = 1; i < texts.size(); ++i) {
      const FinishReason f = i < fin.choice_finish.size() ? fin.choice_finish[i] : FinishReason::kNone;
      more.push_back({std::string(finish_reason_name(f)), texts[i]});
    }
    o.choices = journal::encode_choices(more);
  }
  check(journal_->finish(t.record_id(), o), t, "finishing");
}

}  // namespace spw::serve
