#include "gateway/gateway.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

namespace spw::gateway {

std::string_view rates_source(const admission::PathRates& rates, const admission::RatePrior& prior) {
  if (rates.measured) return "measured";
  return prior.computed ? "prior" : "default";
}

std::string_view overflow_name(Overflow o) {
  switch (o) {
    case Overflow::kPlanned:
      return "planned";
    case Overflow::kNone:
      return "none";
    case Overflow::kNaive:
      return "naive";
  }
  return "planned";
}

Result<Overflow> parse_overflow(std::string_view name) {
  for (Overflow o : {Overflow::kPlanned, Overflow::kNone, Overflow::kNaive}) {
    if (name == overflow_name(o)) return o;
  }
  return Status(StatusCode::kInvalidArgument,
                "unknown overflow mode '" + std::string(name) + "' (planned, none or naive)",
                FailureReason::kInvalidField);
}

DecisionCounter decision_counter(admission::DecisionKind k) {
  switch (k) {
    case admission::DecisionKind::kAdmit: return DecisionCounter::kAdmit;
    case admission::DecisionKind::kDelay: return DecisionCounter::kDelay;
    case admission::DecisionKind::kShrink: return DecisionCounter::kShrink;
    case admission::DecisionKind::kOffload: return DecisionCounter::kOffload;
    case admission::DecisionKind::kRedirect: return DecisionCounter::kRedirect;
    case admission::DecisionKind::kReject: break;
  }
  return DecisionCounter::kReject;
}

std::string_view decision_counter_name(DecisionCounter c) {
  switch (c) {
    case DecisionCounter::kFailover: return "failover";
    case DecisionCounter::kMigrate: return "migrate";
    case DecisionCounter::kAdmit: return admission::decision_kind_name(admission::DecisionKind::kAdmit);
    case DecisionCounter::kDelay: return admission::decision_kind_name(admission::DecisionKind::kDelay);
    case DecisionCounter::kShrink: return admission::decision_kind_name(admission::DecisionKind::kShrink);
    case DecisionCounter::kOffload: return admission::decision_kind_name(admission::DecisionKind::kOffload);
    case DecisionCounter::kRedirect: return admission::decision_kind_name(admission::DecisionKind::kRedirect);
    case DecisionCounter::kReject: break;
  }
  return admission::decision_kind_name(admission::DecisionKind::kReject);
}

namespace {

admission::RequestShape shape_of(const RouteRequest& r, int32_t prompt_tokens) {
  admission::RequestShape s;
  s.prompt_tokens = prompt_tokens;
  s.max_tokens = r.generation.max_tokens;
  s.allow_shrink = r.allow_shrink;
  s.n = r.generation.n;
  // An embeddings request generates nothing: its longest input's KV and one
  // position (the controller's smallest request).
  if (r.generation.pooling != Pooling::kNone) s.max_tokens = 1;
  return s;
}

// What a decision sets in the request a path runs: its limits, its KV need
// and the decision itself (submit fills the job's prompt, sampler and stops;
// a failover keeps the ticket's).
serve::PreparedRequest prepared_for(admission::Decision d, int32_t prompt_tokens,
                                    std::optional<int32_t> max_tokens_requested) {
  serve::PreparedRequest p;
  p.job.max_tokens = d.max_tokens;
  p.limits.n_ctx = d.n_ctx;
  p.limits.prompt_tokens = prompt_tokens;
  p.limits.max_tokens = d.max_tokens;
  p.limits.max_tokens_requested = max_tokens_requested;
  p.limits.max_tokens_clamped = d.max_tokens_clamped;
  p.kv_blocks = d.kv_blocks;
  p.decision = std::move(d);
  return p;
}

}  // namespace

Result<std::unique_ptr<Gateway>> Gateway::create(Env& env, std::vector<ExecutionPath> paths,
                                                 std::vector<PathNotBuilt> not_built, GatewayPolicy policy) {
  if (paths.empty()) return Status::invalid_argument("gateway: no execution path");
  std::set<std::string> names;
  for (const ExecutionPath& p : paths) {
    if (!p.scheduler || !p.tokenizer || !p.replica) {
      return Status::invalid_argument("gateway: path '" + p.name + "' has no scheduler, tokenizer or replica");
    }
    if (!names.insert(p.name).second) return Status::invalid_argument("gateway: two paths named '" + p.name + "'");
  }
  if (policy.observe_interval_s < 0) return Status::invalid_argument("gateway: observe_interval_s must be >= 0");
  if (!(policy.reservation_max_share > 0) || policy.reservation_max_share > 1) {
    return invalid_field("reservation_max_share", "gateway: reservation_max_share must be in (0, 1]");
  }
  if (!(policy.health_interval_s >= 0) || !(policy.health_timeout_s > 0)) {
    return invalid_field("health_interval_s",
                         "gateway: health_interval_s must be >= 0 (0: off) and health_timeout_s > 0");
  }
  if (std::any_of(paths.begin(), paths.end(), [](const ExecutionPath& p) { return p.breaker != nullptr; })) {
    if (policy.probe_prompt.empty() || policy.probe_tokens < 1 || !(policy.probe_timeout_s > 0) ||
        !(policy.probe_retry_s > 0)) {
      return Status::invalid_argument(
          "gateway: breaker probes need a prompt, probe_tokens >= 1, probe_timeout_s > 0 and probe_retry_s > 0");
    }
  }
  return std::unique_ptr<Gateway>(new Gateway(env, std::move(paths), std::move(not_built), std::move(policy)));
}

Gateway::Gateway(Env& env, std::vector<ExecutionPath> paths, std::vector<PathNotBuilt> not_built, GatewayPolicy policy)
    : env_(env), paths_(std::move(paths)), not_built_(std::move(not_built)), policy_(std::move(policy)) {
  std::set<const CircuitBreaker*> seen;
  for (const ExecutionPath& p : paths_) {
    if (!p.breaker || !seen.insert(p.breaker.get()).second) continue;
    has_prober_ = true;
    // Wakes the prober on a trip or a close (it waits for those off the
    // clock); captures no Gateway pointer, as the breaker may outlive it.
    std::weak_ptr<CircuitBreaker> weak = p.breaker;
    p.breaker->set_listener(
        [sync = prober_sync_, log = policy_.log, on_event = policy_.on_event, weak](BreakerState s) {
          {
            std::lock_guard<std::mutex> lk(sync->mu);
            sync->kick = true;
          }
          sync->cv.notify_all();
          auto b = weak.lock();
          if ((log || on_event) && b) {
            const BreakerSnapshot snap = b->snapshot();
            std::string line = "circuit breaker " + snap.name + ": " + std::string(breaker_state_name(s));
            if (s != BreakerState::kClosed && !snap.recent_trips.empty()) {
              const BreakerTrip& t = snap.recent_trips.back();
              char cd[32];
              std::snprintf(cd, sizeof cd, "%.1f", t.cooldown_s);
              line += " after " + t.reason + " (" + t.failure + ": " + t.detail + "), next probe in " + cd + " s";
            }
            if (log) log(line);
            if (on_event) on_event(GatewayEvent{GatewayEventKind::kBreakerTransition, snap.name, s, line});
          }
        });
  }
  if (has_prober_) prober_ = std::thread([this] { prober_loop(); });
  // The health prober: one runner per device that has a check and a breaker
  // to tell.
  std::set<const DeviceControl*> devices;
  for (const ExecutionPath& p : paths_) {
    if (!p.device || !p.breaker || !p.device->has_health_check() || !devices.insert(p.device.get()).second) continue;
    HealthRunner r;
    r.device = p.device;
    r.breaker = p.breaker;
    health_runners_.push_back(std::move(r));
  }
  has_health_ = !health_runners_.empty() && policy_.health_interval_s > 0;
  if (has_health_) health_ = std::thread([this] { health_loop(); });
  // Failover before the first token: a path's scheduler hands a request that
  // failed on its device back here to be placed on another path.
  for (size_t i = 0; i < paths_.size(); ++i) {
    paths_[i].scheduler->set_failover(
        [this, i](const std::shared_ptr<serve::Ticket>& t, const Status& failure) { return failover(i, t, failure); });
  }
}

Status Gateway::failover(size_t from, const std::shared_ptr<serve::Ticket>& t, const Status& failure) {
  // Without an overflow path the failure is the request's end (baseline).
  if (policy_.overflow == Overflow::kNone) return failure;
  if (t->job().resume) return migrate(from, t, failure);
  const std::string failure_name(failure_reason_name(failure.reason()));
  // Never back to the path that just failed it, whatever its breaker says.
  auto snapshots_without_from = [&] {
    std::vector<admission::PathSnapshot> snaps = snapshots_for(t->model());
    snaps[from].usable = false;
    snaps[from].unusable_reason = "failed this request before its first token (" + failure_name + ")";
    if (t->job().pooling != Pooling::kNone) embeddings_only(snaps, t->job().pooling);
    return snaps;
  };
  const serve::AppliedLimits was = t->limits();
  admission::RequestShape shape;
  shape.prompt_tokens = was.prompt_tokens;
  shape.max_tokens = t->job().pooling != Pooling::kNone ? std::optional<int32_t>(1) : was.max_tokens_requested;
  shape.n = t->job().n;
  for (int attempt = 0; attempt < 3; ++attempt) {
    admission::Decision d = decide(shape, snapshots_without_from());
    if (d.kind == admission::DecisionKind::kReject) return Status(StatusCode::kUnavailable, d.reason, d.failure);
    d.reason = "failover from " + paths_[from].name + " after " + failure_name + " before the first token: " + d.reason;
    const size_t to = static_cast<size_t>(d.path_index);
    const admission::Decision shown = d;
    const serve::PreparedRequest p = prepared_for(std::move(d), was.prompt_tokens, was.max_tokens_requested);
    const Status st = paths_[to].scheduler->adopt(t, p);
    if (st.ok()) {
      count_decision(DecisionCounter::kFailover, shown);
      return st;
    }
    if (st.reason() != FailureReason::kQueueFull) return st;  // else that queue filled meanwhile: again
  }
  return Status(StatusCode::kResourceExhausted, "every other path's queue filled meanwhile", FailureReason::kQueueFull);
}

admission::Decision Gateway::decide(const admission::RequestShape& shape,
                                    std::vector<admission::PathSnapshot> snaps) const {
  if (policy_.overflow == Overflow::kPlanned) return admission::decide(shape, snaps, policy_.admission);
  // The baselines keep the true figures to record the pressure the request
  // was really admitted under (the drill's reserve-line gate reads it).
  const std::vector<admission::PathSnapshot> planned = snaps;
  for (size_t i = 0; i < snaps.size(); ++i) {
    admission::PathSnapshot& s = snaps[i];
    if (policy_.overflow == Overflow::kNone) {
      // Everything goes to the first path, whatever its memory says.
      s.ledger_limit = 0;
      if (i > 0 && s.usable) {
        s.usable = false;
        s.unusable_reason = "no overflow path (--overflow none)";
      }
    } else if (s.ledger_limit > 0) {
      // A free-memory check: the reading against the whole capacity.
      s.ledger_limit = s.ledger_capacity;
      s.ledger_used = s.ledger_reading_used;
      s.ledger_cotenants = 0;
    }
  }
  admission::Decision d = admission::decide(shape, snaps, policy_.admission);
  if (d.path_index >= 0) d.pressure = admission::pressure_of(planned[static_cast<size_t>(d.path_index)]);
  return d;
}

admission::Decision Gateway::decide_resume(const Checkpoint& cp, std::vector<admission::PathSnapshot> snaps) {
  for (size_t i = 0; i < paths_.size(); ++i) {
    if (!snaps[i].usable) continue;
    if (paths_[i].fingerprint.empty() || paths_[i].fingerprint != cp.model_fingerprint) {
      snaps[i].usable = false;
      snaps[i].unusable_reason = "serves another model (" +
                                 (paths_[i].model.empty() ? std::string("fingerprint unknown") : paths_[i].model) +
                                 ") than the checkpoint's";
    }
  }
  admission::RequestShape shape;
  shape.prompt_tokens = static_cast<int32_t>(cp.tokens.size());
  // What is left of the request's own limit (at least the next token).
  shape.max_tokens = std::max(1, cp.options.max_tokens - cp.n_generated);
  return decide(shape, std::move(snaps));
}

namespace {

// The request that continues `cp` under decision `d` (which decided the
// remaining tokens): the limits count the whole generation.
serve::PreparedRequest resume_prepared(admission::Decision d, const Checkpoint& cp,
                                       std::optional<int32_t> max_tokens_requested) {
  const int32_t total = cp.n_generated + d.max_tokens;
  serve::PreparedRequest p = prepared_for(std::move(d), cp.n_prompt, max_tokens_requested);
  p.job.max_tokens = total;
  p.limits.max_tokens = total;
  return p;
}

}  // namespace

Status Gateway::migrate(size_t from, const std::shared_ptr<serve::Ticket>& t, const Status& failure) {
  const std::shared_ptr<const Checkpoint> cp = t->job().resume;
  const std::string failure_name(failure_reason_name(failure.reason()));
  if (!t->allow_migration()) {
    return Status(StatusCode::kFailedPrecondition, "the client asked not to be migrated (X-Spillway-Migrate: never)");
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<admission::PathSnapshot> snaps = snapshots();
    snaps[from].usable = false;
    snaps[from].unusable_reason =
        "failed this request at token " + std::to_string(cp->n_generated) + " (" + failure_name + ")";
    for (size_t i = 0; i < paths_.size(); ++i) {
      if (i == from || !snaps[i].usable) continue;
      if (Status ok = migration_allowed(from, i); !ok.ok()) {
        snaps[i].usable = false;
        snaps[i].unusable_reason = ok.message();
      }
    }
    admission::Decision d = decide_resume(*cp, std::move(snaps));
    if (d.kind == admission::DecisionKind::kReject) return Status(StatusCode::kUnavailable, d.reason, d.failure);
    d.reason = "migrated from " + paths_[from].name + " after " + failure_name + " at token " +
               std::to_string(cp->n_generated) + ": " + d.reason;
    const size_t to = static_cast<size_t>(d.path_index);
    const admission::Decision shown = d;
    const serve::PreparedRequest p = resume_prepared(std::move(d), *cp, t->limits().max_tokens_requested);
    const Status st = paths_[to].scheduler->adopt(t, p);
    if (st.ok()) {
      count_decision(DecisionCounter::kMigrate, shown);
      return st;
    }
    if (st.reason() != FailureReason::kQueueFull) return st;
  }
  return Status(StatusCode::kResourceExhausted, "every other path's queue filled meanwhile", FailureReason::kQueueFull);
}

Result<Checkpoint> Gateway::start_checkpoint(const serve::GenerationRequest& g, const std::string& model) {
  SPW_ASSIGN_OR_RETURN(std::vector<TokenId> prompt, prepare(g, model));
  const ExecutionPath* path = &paths_[0];
  for (const ExecutionPath& p : paths_) {
    if (!model.empty() && p.model == model) {
      path = &p;
      break;
    }
  }
  GenerateOptions o;
  const int32_t room = path->scheduler->n_ctx() - static_cast<int32_t>(prompt.size());
  o.max_tokens = g.max_tokens.value_or(std::max(1, room));
  o.sampler = g.sampler;
  o.stop = g.stop;
  o.ignore_eos = g.ignore_eos;
  o.min_tokens = g.min_tokens;
  o.constraint = g.constraint;
  o.stop_token_ids = g.stop_token_ids;
  return spw::start_checkpoint(path->fingerprint, std::move(prompt), std::move(o));
}

Result<Resumed> Gateway::resume(const ResumeRequest& request, Refusal* refusal) {
  auto refuse = [&](Status st, admission::Decision d) -> Result<Resumed> {
    if (refusal) refusal->decision = std::move(d);
    if (refusal) refusal->status = st;
    return st;
  };
  if (!request.checkpoint) return refuse(Status::invalid_argument("resume: no checkpoint"), {});
  const Checkpoint& cp = *request.checkpoint;
  const std::string& have = request.received_text;
  const size_t common = std::min(have.size(), cp.text.size());
  size_t k = 0;
  while (k < common && have[k] == cp.text[k]) ++k;
  if (k < common) {
    return refuse(Status(StatusCode::kFailedPrecondition,
                         "received_text differs from the request's text at byte " + std::to_string(k),
                         FailureReason::kReplayMismatch, "received_text"),
                  {});
  }
  refresh();
  for (int attempt = 0; attempt < 3; ++attempt) {
    admission::Decision d = decide_resume(cp, snapshots());
    count_decision(decision_counter(d.kind), d);
    if (d.kind == admission::DecisionKind::kReject) {
      const StatusCode code =
          d.failure == FailureReason::kQueueFull ? StatusCode::kResourceExhausted : StatusCode::kUnavailable;
      Status st(code, d.reason, d.failure);
      return refuse(std::move(st), std::move(d));
    }
    d.reason = "resumed at token " + std::to_string(cp.n_generated) + ": " + d.reason;
    const ExecutionPath& path = paths_[static_cast<size_t>(d.path_index)];
    serve::PreparedRequest p = resume_prepared(d, cp, request.max_tokens_requested);
    p.id = next_ticket_id_.fetch_add(1);
    p.record_id = request.record_id;
    p.allow_migration = request.allow_migration;
    p.job.prompt.assign(cp.tokens.begin(), cp.tokens.begin() + cp.n_prompt);
    p.job.sampler = cp.options.sampler;
    p.job.stop = cp.options.stop;
    p.job.ignore_eos = cp.options.ignore_eos;
    p.job.min_tokens = cp.options.min_tokens;
    p.job.constraint = cp.options.constraint;
    p.job.stop_token_ids = cp.options.stop_token_ids;
    p.job.request_safe_points = request.safe_points;
    p.job.resume = request.checkpoint;
    Resumed out;
    if (have.size() > cp.text.size()) {
      p.job.replay = have.substr(cp.text.size());
      p.text_before = have;
    } else {
      out.unsent = cp.text.substr(have.size());
      p.text_before = cp.text;
    }
    Result<std::shared_ptr<serve::Ticket>> t = path.scheduler->submit_prepared(std::move(p));
    if (t.ok()) {
      track(*t);
      out.admitted = Admitted{*t, &path};
      return out;
    }
    if (t.status().reason() != FailureReason::kQueueFull) return refuse(t.status(), std::move(d));
  }
  return refuse(Status(StatusCode::kResourceExhausted, "every path's queue filled while the request was being placed",
                       FailureReason::kQueueFull),
                {});
}

Gateway::~Gateway() {
  shutdown(std::chrono::milliseconds(0));
  for (const ExecutionPath& p : paths_)
    if (p.breaker) p.breaker->set_listener(nullptr);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [id, l] : leases_) (void)l.ledger->release(l.ticket);
  leases_.clear();
}

void Gateway::shutdown(std::chrono::milliseconds grace) {
  stop_health();
  stop_prober();
  // Paths drain side by side: each gets the whole grace.
  std::vector<std::thread> drains;
  for (ExecutionPath& p : paths_) {
    serve::Scheduler* s = p.scheduler.get();
    drains.emplace_back([s, grace] { s->shutdown(grace); });
  }
  for (auto& t : drains) t.join();
}

void Gateway::expire_locked(int64_t now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires_ns <= now) {
      (void)it->second.ledger->release(it->second.ticket);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
}

void Gateway::refresh() {
  const int64_t now = env_.now_ns();
  bool observe = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    expire_locked(now);
    const auto interval = static_cast<int64_t>(policy_.observe_interval_s * 1e9);
    if (last_observe_ns_ == 0 || now - last_observe_ns_ >= interval) {
      last_observe_ns_ = now;
      observe = true;
    }
  }
  if (observe && policy_.observe) policy_.observe();
  if (policy_.residency) policy_.residency->expire();
}

admission::PathSnapshot Gateway::snapshot_of(const ExecutionPath& p) const {
  const serve::Scheduler& s = *p.scheduler;
  admission::PathSnapshot snap;
  snap.name = p.name;
  snap.placement = p.placement;
  snap.model = p.model;
  snap.fallback_model = p.fallback_model;
  snap.role = p.role;
  snap.n_ctx = s.n_ctx();
  if (s.stopping()) {
    snap.usable = false;
    snap.unusable_reason = "shutting down";
  } else if (p.breaker) {
    const BreakerSnapshot b = p.breaker->snapshot();
    if (b.state != BreakerState::kClosed) {
      snap.usable = false;
      snap.unusable_reason = breaker_unavailable_reason(b);
    }
  }
  snap.workers = s.n_workers();
  snap.queue_capacity = s.queue_capacity();
  serve::LoadSnapshot load = s.load();
  snap.kv_block_tokens = s.kv_block_tokens();
  snap.kv_blocks_total = load.kv_blocks_total;
  snap.kv_blocks_free = load.kv_blocks_free;
  snap.running = std::move(load.running);
  snap.queued = std::move(load.queued);
  snap.rates = load.rates;
  snap.startup_s = p.replica->startup_s();
  if (p.ledger) {
    const admission::LedgerSnapshot l = p.ledger->snapshot();
    snap.ledger = l.name;
    snap.ledger_limit = l.limit;
    snap.ledger_used = l.used;
    snap.ledger_cotenants = l.reserved[static_cast<int>(admission::OwnerKind::kCoTenant)];
    snap.ledger_capacity = l.capacity;
    snap.ledger_reading_used = l.reserved_ours + l.others;
    if (policy_.residency) {
      // A catalogue model that is not resident: its load is part of the
      // request (its plan's bytes against the ledger, less what the models
      // that may be evicted for it hold; the wait for their minimum
      // residency before the load time).
      const LoadPlan lp = policy_.residency->plan(p.name, p.ledger.get());
      if (!lp.resident) {
        snap.request_extra_bytes = lp.extra_bytes;
        const uint64_t reclaim = std::min(lp.reclaim_bytes, snap.ledger_used);
        snap.ledger_used -= reclaim;
        snap.ledger_reading_used -= std::min(reclaim, snap.ledger_reading_used);
        snap.startup_s += lp.wait_s;
        if (snap.usable && lp.extra_bytes > l.limit - std::min(l.limit, snap.ledger_used)) {
          snap.usable = false;
          snap.unusable_reason = "model " + p.model + " is not loaded and its plan needs " +
                                 admission::format_bytes(lp.extra_bytes) + " on " + l.name + ", more than the " +
                                 admission::format_bytes(l.limit - std::min(l.limit, snap.ledger_used)) +
                                 " left with every other unpinned model evicted";
        }
      }
    }
  }
  return snap;
}

std::vector<admission::PathSnapshot> Gateway::snapshots() const {
  std::vector<admission::PathSnapshot> out;
  out.reserve(paths_.size());
  for (const ExecutionPath& p : paths_) out.push_back(snapshot_of(p));
  return out;
}

std::vector<admission::PathSnapshot> Gateway::snapshots_for(const std::string& model) const {
  std::vector<admission::PathSnapshot> out = snapshots();
  if (model.empty()) {
    // The service's model: a catalogue model's paths serve only requests
    // that name it.
    if (!policy_.residency) return out;
    for (admission::PathSnapshot& s : out) {
      if (!s.usable || !policy_.residency->manages_model(s.model)) continue;
      s.usable = false;
      s.unusable_reason = "serves model " + s.model + ", which a request must name";
    }
    return out;
  }
  for (admission::PathSnapshot& s : out) {
    if (s.model == model || !s.usable) continue;
    s.usable = false;
    s.unusable_reason = "serves model " + s.model + ", not " + model + " (the request's model)";
  }
  return out;
}

Result<std::vector<TokenId>> Gateway::prepare(const serve::GenerationRequest& g, const std::string& model,
                                              std::vector<std::vector<TokenId>>* embed_inputs) {
  SPW_RETURN_IF_ERROR(serve::validate_generation_request(g));
  refresh();
  if (g.pooling == Pooling::kNone) return serve::encode_prompt(tokenizer_for(model), g);
  // An embeddings request: every input tokenized as a prompt would be; the
  // longest stands for the request in admission (its KV, its context).
  const Tokenizer& tok = tokenizer_for(model);
  std::vector<std::vector<TokenId>> inputs;
  serve::GenerationRequest one = g;
  for (const std::string& text : g.embed_texts) {
    one.prompt = text;
    one.prompt_tokens.reset();
    SPW_ASSIGN_OR_RETURN(std::vector<TokenId> ids, serve::encode_prompt(tok, one));
    inputs.push_back(std::move(ids));
  }
  for (const std::vector<TokenId>& ids : g.embed_token_ids) {
    one.prompt_tokens = ids;
    SPW_ASSIGN_OR_RETURN(std::vector<TokenId> checked, serve::encode_prompt(tok, one));
    inputs.push_back(std::move(checked));
  }
  // Validation refused an empty list, so there is a longest.
  std::vector<TokenId> longest = *std::max_element(
      inputs.begin(), inputs.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
  if (embed_inputs) *embed_inputs = std::move(inputs);
  return longest;
}

void Gateway::embeddings_only(std::vector<admission::PathSnapshot>& snaps, Pooling pooling) const {
  for (size_t i = 0; i < snaps.size(); ++i) {
    if (!snaps[i].usable || paths_[i].pooling == pooling) continue;
    snaps[i].usable = false;
    snaps[i].unusable_reason = "its model (" + paths_[i].model + ") does not pool " + std::string(pooling_name(pooling)) +
                               " embeddings";
  }
}

void Gateway::note_load(admission::Decision& d) const {
  if (!policy_.residency || d.path_index < 0) return;
  const ExecutionPath& path = paths_[static_cast<size_t>(d.path_index)];
  if (!path.ledger) return;
  const LoadPlan lp = policy_.residency->plan(path.name, path.ledger.get());
  if (!lp.resident) d.reason += "; " + lp.note;
}

const Tokenizer& Gateway::tokenizer_for(const std::string& model) const {
  if (!model.empty()) {
    for (const ExecutionPath& p : paths_)
      if (p.model == model) return *p.tokenizer;
  }
  return tokenizer();
}

Status Gateway::reject_status(const admission::Decision& d, const std::vector<admission::PathSnapshot>& snaps) const {
  // Every path unusable and one of them stopping: the server stops. (A
  // breaker alone leaves decide()'s 503 kNoPath with its reason.)
  if (std::none_of(snaps.begin(), snaps.end(), [](const admission::PathSnapshot& p) { return p.usable; }) &&
      std::any_of(paths_.begin(), paths_.end(), [](const ExecutionPath& p) { return p.scheduler->stopping(); })) {
    return Status(StatusCode::kUnavailable, "server is shutting down", FailureReason::kShuttingDown);
  }
  if (d.failure == FailureReason::kContextFull)
    return Status(StatusCode::kInvalidArgument, d.reason, d.failure, "prompt");
  const StatusCode code =
      d.failure == FailureReason::kQueueFull ? StatusCode::kResourceExhausted : StatusCode::kUnavailable;
  return Status(code, d.reason, d.failure);
}

Status Gateway::precheck(const RouteRequest& request, size_t prompt_bytes, Refusal* refusal) {
  // The smallest lower bound over the paths' vocabularies (a fallback model
  // may have another): computed once, the vocabularies never change.
  std::call_once(longest_token_once_, [&] {
    for (const ExecutionPath& p : paths_) {
      size_t longest = 0;
      for (int32_t t = 0; t < p.tokenizer->n_vocab(); ++t)
        longest = std::max(longest, p.tokenizer->token_text(t).size());
      longest_token_bytes_ = std::max(longest_token_bytes_, std::max<size_t>(longest, 4));
    }
  });
  const size_t lower = longest_token_bytes_ == 0 ? 0 : (prompt_bytes + longest_token_bytes_ - 1) / longest_token_bytes_;
  const auto n_prompt = static_cast<int32_t>(std::min<size_t>(lower, INT32_MAX));
  std::vector<admission::PathSnapshot> snaps = snapshots_for(request.model);
  admission::Decision d = decide(shape_of(request, n_prompt), snaps);
  if (d.kind != admission::DecisionKind::kReject) return Status::ok_status();
  count_decision(decision_counter(d.kind), d);
  if (d.failure == FailureReason::kContextFull) {
    // Say what is known: a lower bound, not the count a tokenizer would give.
    int32_t max_ctx = 0;
    for (const admission::PathSnapshot& p : snaps) max_ctx = std::max(max_ctx, p.n_ctx);
    d.reason = "prompt: at least " + std::to_string(n_prompt) + " tokens (" + std::to_string(prompt_bytes) +
               " bytes, and no token stands for more than " + std::to_string(longest_token_bytes_) +
               ") does not fit the context of " + std::to_string(max_ctx) + " tokens of any path (at most " +
               std::to_string(max_ctx - 1) + " prompt tokens; the server's --ctx sets the limit)";
  }
  Status st = reject_status(d, snaps);
  if (refusal) {
    refusal->decision = std::move(d);
    refusal->status = st;
  }
  return st;
}

Result<Admitted> Gateway::submit(const RouteRequest& request, Refusal* refusal) {
  const serve::GenerationRequest& g = request.generation;
  auto refuse = [&](Status st, admission::Decision d) -> Result<Admitted> {
    if (refusal) refusal->decision = std::move(d);
    if (refusal) refusal->status = st;
    return st;
  };
  std::vector<std::vector<TokenId>> embed_inputs;
  Result<std::vector<TokenId>> prepared = prepare(g, request.model, &embed_inputs);
  if (prepared.ok() && request.keep_alive_s && policy_.residency) {
    policy_.residency->set_keep_alive(request.model, *request.keep_alive_s);
  }
  if (!prepared.ok()) return refuse(prepared.status(), {});
  const std::vector<TokenId>& prompt = *prepared;
  const auto n_prompt = static_cast<int32_t>(std::min<size_t>(prompt.size(), INT32_MAX));

  // A path can fill between the decision and the submit (other threads):
  // decide again with fresh snapshots, a bounded number of times.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<admission::PathSnapshot> snaps = snapshots_for(request.model);
    if (g.pooling != Pooling::kNone) embeddings_only(snaps, g.pooling);
    admission::Decision d = decide(shape_of(request, n_prompt), snaps);
    note_load(d);
    count_decision(decision_counter(d.kind), d);
    if (d.kind == admission::DecisionKind::kReject) {
      Status st = reject_status(d, snaps);  // built before d is moved from
      return refuse(std::move(st), std::move(d));
    }
    const ExecutionPath& path = paths_[static_cast<size_t>(d.path_index)];
    serve::PreparedRequest p = prepared_for(d, n_prompt, g.max_tokens);
    p.id = next_ticket_id_.fetch_add(1);
    p.record_id = g.record_id;
    p.allow_migration = request.allow_migration;
    p.model = request.model;
    p.job.prompt = prompt;
    p.job.sampler = g.sampler;
    p.job.stop = g.stop;
    p.job.ignore_eos = g.ignore_eos;
    p.job.min_tokens = g.min_tokens;
    p.job.constraint = g.constraint;
    p.job.stop_token_ids = g.stop_token_ids;
    p.job.logprobs = g.logprobs;
    p.job.prompt_logprobs = g.prompt_logprobs;
    p.job.request_safe_points = g.safe_points;
    p.job.n = g.n;
    p.job.pooling = g.pooling;
    p.job.embed_inputs = embed_inputs;
    Result<std::shared_ptr<serve::Ticket>> t = path.scheduler->submit_prepared(std::move(p));
    if (t.ok()) {
      track(*t);
      return Admitted{*t, &path};
    }
    if (t.status().reason() != FailureReason::kQueueFull) {
      Status st = t.status();
      return refuse(std::move(st), std::move(d));
    }
  }
  return refuse(Status(StatusCode::kResourceExhausted, "every path's queue filled while the request was being placed",
                       FailureReason::kQueueFull),
                {});
}

void Gateway::track(const std::shared_ptr<serve::Ticket>& t) {
  std::lock_guard<std::mutex> lk(mu_);
  // Forget finished tickets as new ones come (bounded by what is in flight).
  for (auto it = live_.begin(); it != live_.end();) {
    auto sp = it->second.lock();
    if (!sp || serve::is_terminal(sp->state()))
      it = live_.erase(it);
    else
      ++it;
  }
  live_[t->id()] = t;
}

std::shared_ptr<serve::Ticket> Gateway::find(uint64_t ticket_id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(ticket_id);
  return it == live_.end() ? nullptr : it->second.lock();
}

bool Gateway::cancel(uint64_t ticket_id) {
  for (ExecutionPath& p : paths_) {
    if (p.scheduler->cancel(ticket_id)) return true;
  }
  return false;
}

void Gateway::count_decision(DecisionCounter kind, const admission::Decision& d) {
  RecentDecision r;
  r.wall_ms = env_.wall_time_ms();
  r.kind = kind;
  r.path = d.path_index >= 0 && static_cast<size_t>(d.path_index) < paths_.size()
               ? paths_[static_cast<size_t>(d.path_index)].name
               : "";
  r.reason = d.reason;
  r.degraded = d.degraded();
  std::lock_guard<std::mutex> lk(mu_);
  ++decisions_[static_cast<size_t>(kind)];
  recent_decisions_.push_back(std::move(r));
  if (recent_decisions_.size() > kRecentDecisions) recent_decisions_.pop_front();
}

std::vector<std::shared_ptr<serve::Ticket>> Gateway::live() const {
  std::vector<std::shared_ptr<serve::Ticket>> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [id, w] : live_) {
    auto t = w.lock();
    if (t && !serve::is_terminal(t->state())) out.push_back(std::move(t));
  }
  return out;
}

std::shared_ptr<serve::Ticket> Gateway::find_by_record(int64_t record_id) const {
  if (record_id <= 0) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [id, w] : live_) {
    auto t = w.lock();
    if (t && t->record_id() == record_id) return t;
  }
  return nullptr;
}

Progress Gateway::progress(const serve::Ticket& t) {
  Progress out;
  for (const ExecutionPath& p : paths_) {
    if (p.name != t.path()) continue;
    out.queue_position = p.scheduler->queue_position(t.id());
    if (out.queue_position == 0) return out;
    // Only its own path matters (this runs every second per queued stream).
    admission::PathSnapshot s = snapshot_of(p);
    // Only the work ahead of it counts.
    if (static_cast<size_t>(out.queue_position - 1) < s.queued.size())
      s.queued.resize(static_cast<size_t>(out.queue_position - 1));
    out.estimated_delay_s = admission::estimate_start_delay(s, t.kv_blocks());
    return out;
  }
  return out;
}

int32_t Gateway::in_flight() const {
  int32_t n = 0;
  for (const ExecutionPath& p : paths_) {
    const serve::SchedulerStats st = p.scheduler->stats();
    n += st.running + st.queue_depth;
  }
  return n;
}

Result<Quote> Gateway::quote(const RouteRequest& request) {
  const serve::GenerationRequest& g = request.generation;
  SPW_ASSIGN_OR_RETURN(const std::vector<TokenId> prompt, prepare(g, request.model));
  const auto n_prompt = static_cast<int32_t>(std::min<size_t>(prompt.size(), INT32_MAX));
  std::vector<admission::PathSnapshot> snaps = snapshots_for(request.model);
  Quote q;
  q.decision = decide(shape_of(request, n_prompt), snaps);
  note_load(q.decision);
  if (q.decision.path_index >= 0) {
    const ExecutionPath& p = paths_[static_cast<size_t>(q.decision.path_index)];
    q.placement = p.placement;
    q.model = p.model;
    q.fallback_model = p.fallback_model;
  }
  // Each path on its own: what it would predict if the request went there.
  for (size_t i = 0; i < snaps.size(); ++i) {
    const admission::PathSnapshot& s = snaps[i];
    std::vector<admission::PathSnapshot> one{s};
    one[0].role = admission::PathRole::kPrimary;
    admission::AdmissionPolicy pol = policy_.admission;
    pol.max_delay_s = std::numeric_limits<double>::infinity();
    const admission::Decision alone = admission::decide(shape_of(request, n_prompt), one, pol);
    PathQuote pq;
    pq.path = s.name;
    pq.placement = s.placement;
    pq.model = s.model;
    pq.eligible = alone.path_index == 0;
    pq.reason = alone.verdicts.empty() ? alone.reason : alone.verdicts.back().reason;
    pq.timing = alone.timing;
    pq.decode_tps = s.rates.decode_tps;
    pq.prefill_tps = s.rates.prefill_tps;
    pq.rates_measured = s.rates.measured;
    pq.rates_source = rates_source(s.rates, paths_[i].prior);
    q.paths.push_back(std::move(pq));
  }
  return q;
}

bool Gateway::ready() const {
  // Ready while some path is accepting (not shutting down, queue not full).
  for (const ExecutionPath& p : paths_) {
    if (p.breaker && !p.breaker->closed()) continue;
    const serve::SchedulerStats st = p.scheduler->stats();
    if (!p.scheduler->stopping() && st.queue_depth < st.queue_capacity) return true;
  }
  return false;
}

GatewayStatus Gateway::status() {
  GatewayStatus out;
  out.overflow = std::string(overflow_name(policy_.overflow));
  out.host_cpu = policy_.host_cpu;
  out.reservations = reservations(ReservationCaller{"", /*admin=*/true});  // the HTTP layer filters per caller
  std::set<const admission::MemoryLedger*> seen;
  for (const ExecutionPath& p : paths_) {
    const serve::Scheduler& s = *p.scheduler;
    PathStatus ps;
    ps.name = p.name;
    ps.placement = p.placement;
    ps.model = p.model;
    ps.fingerprint = p.fingerprint;
    ps.cpu_kernels = p.cpu_kernels;
    ps.replica = p.replica->info();
    ps.fallback_model = p.fallback_model;
    ps.role = std::string(admission::path_role_name(p.role));
    ps.startup_ms = p.startup_ms;
    ps.prior = p.prior;
    ps.stats = s.stats();
    ps.workers = ps.stats.n_workers;
    ps.running = ps.stats.running;
    ps.queue_depth = ps.stats.queue_depth;
    ps.queue_capacity = ps.stats.queue_capacity;
    ps.n_ctx = s.n_ctx();
    const serve::LoadSnapshot load = s.load();
    ps.oldest_queued_s = load.oldest_queued_s;
    ps.kv_block_tokens = s.kv_block_tokens();
    ps.kv_blocks_total = load.kv_blocks_total;
    ps.kv_blocks_free = load.kv_blocks_free;
    ps.kv_type = p.kv_type;
    ps.rates = load.rates;
    if (p.breaker) ps.breaker = p.breaker->snapshot();
    if (p.device) ps.device = p.device->status();
    if (p.batcher) ps.batching = p.batcher->stats();
    out.paths.push_back(std::move(ps));
    if (p.ledger && seen.insert(p.ledger.get()).second) out.ledgers.push_back(p.ledger->snapshot());
  }
  out.not_built = not_built_;
  if (policy_.residency) {
    policy_.residency->expire();
    out.models = policy_.residency->list();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    out.decisions = decisions_;
    out.recent_decisions.assign(recent_decisions_.rbegin(), recent_decisions_.rend());
  }
  out.ready = ready();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [k, v] : equivalence_) out.equivalence.push_back(v);
  }
  return out;
}

}  // namespace spw::gateway
