// The drill's simulation: the workload (simulation_internal.h): clients
// arrive by class and phase, send, stream, resume and retry through the
// server's RequestService, and their operations go into the history.
#include "drill/simulation_internal.h"

namespace spw::drill::sim_detail {

// ---- Workload ------------------------------------------------------------

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }

void Simulation::schedule_workload() {
  double start = 0;
  for (const Phase& ph : sc_.phases) {
    const int64_t p0 = t0_ + to_ns(start);
    const int64_t p1 = t0_ + to_ns(start + ph.duration_s);
    at(p0, [this, &ph] { set_phase(ph); });
    for (const FaultSpec& f : ph.faults) {
      at(p0 + to_ns(f.at_s), [this, &f, &ph] { fault(f, ph.name); });
    }
    for (const Phase::Load& l : ph.load) {
      size_t cls = 0;
      for (; cls < sc_.classes.size(); ++cls)
        if (sc_.classes[cls].name == l.cls) break;
      if (cls == sc_.classes.size() || !(l.rate_per_s > 0)) continue;
      const RequestClass& rc = sc_.classes[cls];
      double t = 0;
      for (;;) {
        t += -std::log(1.0 - uniform01(rng_)) / l.rate_per_s;
        if (t >= ph.duration_s) break;
        const bool greedy = rc.greedy;
        const uint64_t seed = rng_() & 0xffffffffull;
        const bool keyed = uniform01(rng_) < rc.idempotency_share;
        const bool retry = keyed && uniform01(rng_) < rc.retry_share;
        const int32_t conc = l.concurrency;
        const int64_t when = p0 + to_ns(t);
        if (when >= p1) break;
        at(when, [this, cls, &ph, greedy, seed, keyed, retry, conc] {
          auto& busy = busy_[sc_.classes[cls].name];
          if (static_cast<int32_t>(busy.size()) >= conc) return;  // every client of the class is busy
          arrive(cls, ph.name, greedy, seed, keyed, retry);
        });
      }
    }
    start += ph.duration_s;
  }
  // Samples, from the start to the end of the drain.
  const int64_t step = to_ns(opt_.sample_interval_s > 0 ? opt_.sample_interval_s : 0.25);
  for (int64_t t = t0_; t <= end_ns_; t += step) at(t, [this] { sample(); });
}

void Simulation::arrive(size_t cls, const std::string& phase, bool greedy, uint64_t seed, bool keyed, bool retry) {
  const RequestClass& rc = sc_.classes[cls];
  auto& busy = busy_[rc.name];
  int slot = 0;
  while (busy.count(slot)) ++slot;
  busy.insert(slot);
  auto c = std::make_unique<Chain>();
  c->client = static_cast<int>(cls) * 1000 + slot + 1;
  c->cls = cls;
  c->phase = phase;
  for (int i = 0; i < std::max(1, rc.prompt_repeat); ++i) c->prompt += rc.prompt;
  c->stream = rc.stream;
  c->greedy = greedy;
  c->seed = greedy ? 0 : seed;
  c->max_tokens = rc.max_tokens;
  c->model = rc.model;
  c->retry = retry;
  c->prompt_key = rc.name + (greedy ? "/greedy" : "/seed=" + std::to_string(c->seed));
  if (keyed) c->key = "drill-" + std::to_string(opt_.seed) + "-" + std::to_string(chains_.size() + 1);
  c->body = "{" + (c->model.empty() ? std::string() : "\"model\":\"" + json_escape(c->model) + "\",") +
            "\"prompt\":\"" + json_escape(c->prompt) + "\",\"max_tokens\":" + std::to_string(c->max_tokens) +
            ",\"stream\":" + (c->stream ? "true" : "false") +
            (greedy ? std::string(",\"temperature\":0") : ",\"temperature\":0.8,\"seed\":" + std::to_string(c->seed)) +
            "}";
  Chain* raw = c.get();
  chains_.push_back(std::move(c));
  send(raw, "complete");
}

Op Simulation::request_op(const Chain& c, const std::string& f) const {
  Op op;
  op.client = c.client;
  op.type = OpType::kInvoke;
  op.t_ms = ms(env_.now_ns());
  op.f = f;
  op.continues = f == "complete" ? 0 : c.first_op;
  op.phase = c.phase;
  op.cls = sc_.classes[c.cls].name;
  op.prompt_key = c.prompt_key;
  op.stream = c.stream;
  op.greedy = c.greedy;
  op.seed = c.seed;
  op.max_tokens = c.max_tokens;
  op.idempotency_key = c.key;
  return op;
}

void Simulation::fill_route(Op& op, const serve::Ticket& t) const {
  op.path = t.path();
  // "gpu" and a catalogue model's "gpu/NAME" run on the device.
  const bool gpu = op.path == "gpu" || op.path.rfind("gpu/", 0) == 0;
  op.placement = gpu ? "vulkan" : "cpu";
  op.model = model_name_;
  if (proc_ && proc_->gw) {
    for (const gateway::ExecutionPath& p : proc_->gw->paths())
      if (p.name == op.path) op.model = p.model;
  }
  const admission::Decision d = t.decision();
  op.decision = std::string(admission::decision_kind_name(d.kind));
  op.reason = d.reason;
  op.degraded = !gpu;
  // What the spillway object shows: degraded = the decision's.
  op.degraded_shown = op.degraded && d.degraded();
  op.failovers = t.attempts() - t.migrations();
  op.migrations = t.migrations();
}

// The checker's over-reserve figure: whether every decision that placed the
// request on the gpu path kept it under its reserve.
void Simulation::note_decision(int64_t record_id, const admission::Decision& d) {
  if (d.path != "gpu" && d.path.rfind("gpu/", 0) != 0) return;
  const bool under = d.pressure <= 1.0 + 1e-12;
  auto [it, fresh] = under_reserve_.emplace(record_id, under);
  if (!fresh) it->second = it->second && under;
}

// What the server reads back from a chain's stored body (the chain that
// sent it: the simulation's clients send what generation_of says).
Result<gateway::StoredRequest> Simulation::stored_request(const journal::Record& r) const {
  for (const auto& c : chains_) {
    if (c->record_id != r.id) continue;
    gateway::StoredRequest out;
    out.generation = generation_of(*c);
    out.model = c->model;
    out.seed_given = true;
    out.max_tokens_requested = c->max_tokens;
    return out;
  }
  return Status::not_found("no client sent request " + std::to_string(r.id));
}

void Simulation::complete_refused(const Op& inv, Op res, int http_status, const std::string& code,
                                  const std::string& message) {
  res.t_ms = ms(env_.now_ns());
  res.type = OpType::kFail;
  res.http_status = http_status;
  res.error_code = code;
  res.error_message = message;
  res.latency_ms = 0;
  rec_.complete(inv, res);
}

// A request through the server's own RequestService (idempotency, precheck,
// journal, decision, refusal), as the HTTP layer hands it over.
void Simulation::send(Chain* c, const std::string& f) {
  Op inv = rec_.invoke(request_op(*c, f));
  if (f == "complete") c->first_op = inv.op_id;
  Op res = inv;
  res.t_ms = inv.t_ms;
  auto fail_now = [&](int http, const std::string& code, const std::string& msg) {
    complete_refused(inv, res, http, code, msg);
    // A retry that found the server down is tried again (a client that
    // wants its answer), a second later.
    if (f == "retry" && http == 0 && ++c->retries < kMaxResumes) {
      at(env_.now_ns() + to_ns(1.0), [this, c] { send(c, "retry"); });
      return;
    }
    after_end(c);
  };
  if (!proc_ || !journal_ || !serving_) return fail_now(0, "connection_refused", "the server is down");
  gateway::Submission sub;
  sub.endpoint = "/v1/completions";
  sub.body = c->body;
  sub.idempotency_key = c->key;
  sub.route.generation = generation_of(*c);
  sub.route.model = c->model;
  sub.prompt_bytes = c->prompt.size();
  gateway::SubmitOutcome out = proc_->service->submit(std::move(sub));
  const int64_t id = out.record_id;
  if (out.kind == gateway::SubmitOutcome::Kind::kRefused) {
    const admission::Decision& d = out.refusal.decision;
    if (id != 0 && !d.verdicts.empty()) note_decision(id, d);
    const FailureClass fc = classify(out.status);
    if (id != 0 || !d.verdicts.empty()) {
      res.decision = std::string(admission::decision_kind_name(d.kind));
      res.reason = d.reason;
    }
    return fail_now(fc.http_status, std::string(fc.code), out.status.message());
  }
  c->record_id = id;
  c->public_id = out.public_id;
  if (out.kind == gateway::SubmitOutcome::Kind::kReplay) {
    const journal::Record& rec = *out.record;
    given_ids_.insert(id);
    res.t_ms = ms(env_.now_ns());
    res.type = OpType::kOk;
    res.http_status = 200;
    res.request_id = id;
    res.accepted = true;
    res.replayed = true;
    res.placement = rec.placement;
    // As the server's replay says: the path it ran on (by its placement,
    // among its model's).
    res.model = c->model.empty() ? model_name_ : c->model;
    for (const gateway::ExecutionPath& p : proc_->gw->paths()) {
      if (p.placement == res.placement && p.model == res.model) {
        res.path = p.name;
        break;
      }
    }
    res.text = rec.outcome.text;
    res.completion_tokens = rec.outcome.completion_tokens;
    res.finish_reason = rec.outcome.finish_reason;
    res.latency_ms = 0;
    res.ttft_ms = 0;
    rec_.complete(inv, res);
    c->have = res.text;
    after_end(c);
    return;
  }
  if (const admission::Decision d = out.ticket->decision(); !d.verdicts.empty()) note_decision(id, d);
  given_ids_.insert(id);
  Active a;
  a.chain = c;
  a.inv = inv;
  a.ticket = out.ticket;
  a.invoke_ns = env_.now_ns();
  active_.emplace(inv.op_id, std::move(a));
}

// What the client's body asks for, as the HTTP layer parses it.
serve::GenerationRequest Simulation::generation_of(const Chain& c) {
  serve::GenerationRequest g;
  g.prompt = c.prompt;
  g.max_tokens = c.max_tokens;
  g.sampler.temperature = c.greedy ? 0.0f : 0.8f;
  g.sampler.seed = c.seed;
  return g;
}

// POST /v1/requests/{id}/resume as the HTTP layer does it: the journal's
// checkpoint (or the prompt's), reopen, Gateway::resume with the text the
// client has.
void Simulation::resume(Chain* c) {
  Op inv = rec_.invoke(request_op(*c, "resume"));
  Op res = inv;
  res.request_id = c->record_id;
  auto fail_now = [&](int http, const std::string& code, const std::string& msg, bool again) {
    complete_refused(inv, res, http, code, msg);
    if (again && c->resumes < kMaxResumes) {
      at(env_.now_ns() + to_ns(1.0), [this, c] { resume(c); });
    } else {
      after_end(c);
    }
  };
  ++c->resumes;
  if (!proc_ || !journal_ || !serving_) return fail_now(0, "connection_refused", "the server is down", true);
  gateway::ResumeCommand cmd;
  cmd.public_id = c->public_id;
  cmd.received_text = c->have;
  gateway::Refusal refusal;
  Result<gateway::ResumeOutcome> resumed = proc_->service->resume(cmd, &refusal);
  if (!refusal.decision.verdicts.empty()) note_decision(c->record_id, refusal.decision);
  if (!resumed.ok()) {
    const Status& st = resumed.status();
    const FailureClass fc = classify(st);
    // Not found or nothing to continue: the client gives up; a refusal by
    // the gateway is tried again a second later (not a text mismatch).
    const bool again = st.code() != StatusCode::kNotFound && st.reason() != FailureReason::kNotResumable &&
                       st.reason() != FailureReason::kReplayMismatch;
    return fail_now(fc.http_status, std::string(fc.code), st.message(), again);
  }
  note_decision(c->record_id, resumed->ticket->decision());
  Active a;
  a.chain = c;
  a.inv = inv;
  a.ticket = resumed->ticket;
  a.invoke_ns = env_.now_ns();
  a.unsent = resumed->unsent;
  if (c->stream && !a.unsent.empty()) a.first_text_ns = env_.now_ns();
  active_.emplace(inv.op_id, std::move(a));
}

// An operation of the chain ended: a planned retry under the key, or done.
void Simulation::after_end(Chain* c) {
  if (c->retry) {
    c->retry = false;  // once
    at(env_.now_ns() + to_ns(0.1), [this, c] { send(c, "retry"); });
    return;
  }
  finish_chain(c);
}

void Simulation::finish_chain(Chain* c) { busy_[sc_.classes[c->cls].name].erase((c->client - 1) % 1000); }

// Reads what each ticket sent since the last look. Only after settle(): the
// workers are parked, so a ticket's text() and state are still and every
// event they describe is in its channel. Pops only events known to be
// there: an empty next_event(0 ms) still waits on a timer (~100 us here),
// which would dominate the run.
void Simulation::poll() {
  std::vector<int64_t> ended;
  for (auto& [op_id, a] : active_) {
    const int32_t generated = a.ticket->generated();
    const serve::RequestState state = a.ticket->state();
    if (a.seen_generated < 0) {
      // The first look is at the instant it was submitted: nothing streamed
      // yet (a run takes simulated time before its first token).
      a.text_base = a.ticket->text().size();
    } else if (generated == a.seen_generated && static_cast<int>(state) == a.seen_state) {
      continue;
    }
    a.seen_generated = generated;
    a.seen_state = static_cast<int>(state);
    const bool terminal = serve::is_terminal(state);
    const size_t pushed = terminal ? std::string::npos : a.ticket->text().size() - a.text_base;
    serve::RequestEvent ev;
    while (terminal || a.text.size() < pushed) {
      const serve::PopResult r = a.ticket->next_event(ev, 0ms);
      if (r != serve::PopResult::kItem) break;
      if (ev.kind == serve::RequestEvent::Kind::kText) {
        if (a.first_text_ns < 0) a.first_text_ns = env_.now_ns();
        a.text += ev.text;
        continue;
      }
      complete(a, ev);
      ended.push_back(op_id);
      break;
    }
  }
  for (int64_t id : ended) active_.erase(id);
}

void Simulation::complete(Active& a, const serve::RequestEvent& fin) {
  Chain* c = a.chain;
  Op res = a.inv;
  const int64_t now = env_.now_ns();
  res.t_ms = ms(now);
  res.request_id = c->record_id;
  res.accepted = true;
  fill_route(res, *a.ticket);
  res.latency_ms = static_cast<double>(now - a.invoke_ns) / 1e6;
  res.queue_ms = static_cast<double>(a.ticket->queue_ns()) / 1e6;
  res.completion_tokens = fin.completion_tokens;
  const std::string got = a.unsent + a.text;
  if (fin.state == serve::RequestState::kDone) {
    res.type = OpType::kOk;
    res.http_status = 200;
    res.text = got;
    res.finish_reason = std::string(finish_reason_name(fin.finish));
    res.ttft_ms = c->stream ? (a.first_text_ns >= 0 ? static_cast<double>(a.first_text_ns - a.invoke_ns) / 1e6 : -1)
                            : res.latency_ms;
    c->have += got;
    rec_.complete(a.inv, res);
    after_end(c);
    return;
  }
  const FailureClass fc = classify(fin.status);
  res.type = OpType::kFail;
  // A stream already answered 200; its error comes as an event.
  res.http_status = c->stream ? 200 : fc.http_status;
  res.error_code = std::string(fc.code);
  res.error_message = fin.status.message();
  if (c->stream) {
    res.text = got;
    res.ttft_ms = a.first_text_ns >= 0 ? static_cast<double>(a.first_text_ns - a.invoke_ns) / 1e6 : -1;
    c->have += got;
  }
  rec_.complete(a.inv, res);
  if (fin.status.reason() == FailureReason::kResumable && c->resumes < kMaxResumes) {
    at(now, [this, c] { resume(c); });
    return;
  }
  after_end(c);
}

}  // namespace spw::drill::sim_detail
