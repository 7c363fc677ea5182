#include "gateway/gateway.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "core/size.h"

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
namespace {

admission::RequestShape shape_of(const RouteRequest& r, int32_t prompt_tokens) {
  admission::RequestShape s;
  s.prompt_tokens = prompt_tokens;
  s.max_tokens = r.generation.max_tokens;
  s.allow_shrink = r.allow_shrink;
  s.n = r.generation.n;
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
    return snaps;
  };
  const serve::AppliedLimits was = t->limits();
  admission::RequestShape shape;
  shape.prompt_tokens = was.prompt_tokens;
  shape.max_tokens = was.max_tokens_requested;
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
      count_decision("failover", shown);
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
      count_decision("migrate", shown);
      return st;
    }
    if (st.reason() != FailureReason::kQueueFull) return st;
  }
  return Status(StatusCode::kResourceExhausted, "every other path's queue filled meanwhile", FailureReason::kQueueFull);
}

namespace {

std::string equivalence_key(const std::string& fingerprint, std::string a, std::string b) {
  if (b < a) std::swap(a, b);
  return fingerprint + "|" + a + "|" + b;
}

}  // namespace

Status Gateway::migration_allowed(size_t from, size_t to) const {
  const ExecutionPath& a = paths_[from];
  const ExecutionPath& b = paths_[to];
  if (a.fingerprint.empty() || a.fingerprint != b.fingerprint) {
    return Status::failed_precondition("serves another model than " + a.name + " (compatibility fingerprints differ)");
  }
  if (a.placement == b.placement) return Status::ok_status();  // one backend: bitwise by its contract
  std::lock_guard<std::mutex> lk(mu_);
  auto it = equivalence_.find(equivalence_key(a.fingerprint, a.placement, b.placement));
  if (it == equivalence_.end()) {
    return Status::failed_precondition("equivalence with " + a.name + " not verified");
  }
  if (!it->second.passed) {
    return Status::failed_precondition("equivalence check with " + a.name + " failed: " + it->second.detail);
  }
  return Status::ok_status();
}

std::vector<EquivalenceInfo> Gateway::verify_equivalence() {
  std::lock_guard<std::mutex> one(verify_mu_);
  // Runs one request on a path as the server's own and returns its text (or
  // the failure): each side's run is bounded on the Env's clock.
  struct Run {
    std::shared_ptr<serve::Ticket> ticket;
    Status status;
  };
  auto start = [&](const ExecutionPath& path, const std::vector<TokenId>& prompt, const SamplerParams& sampler,
                   int32_t max_tokens) {
    serve::PreparedRequest p;
    p.id = next_ticket_id_.fetch_add(1);
    p.internal = true;
    p.job.prompt = prompt;
    p.job.sampler = sampler;
    p.job.max_tokens = max_tokens;
    const auto n_prompt = static_cast<int32_t>(prompt.size());
    p.limits.n_ctx = path.scheduler->n_ctx();
    p.limits.prompt_tokens = n_prompt;
    p.limits.max_tokens = max_tokens;
    p.kv_blocks = admission::kv_blocks_for(n_prompt + max_tokens, path.scheduler->kv_block_tokens());
    p.decision.path = path.name;
    p.decision.reason = "equivalence check";
    Result<std::shared_ptr<serve::Ticket>> t = path.scheduler->submit_prepared(std::move(p));
    return t.ok() ? Run{*t, Status()} : Run{nullptr, t.status()};
  };
  auto finish = [&](Run& r, const ExecutionPath& path, std::string& text) -> Status {
    if (!r.ticket) return r.status;
    const int64_t deadline = env_.now_ns() + static_cast<int64_t>(std::llround(policy_.equivalence_timeout_s * 1e9));
    serve::RequestEvent ev;
    for (;;) {
      const serve::PopResult pr = r.ticket->next_event(ev, std::chrono::milliseconds(20));
      if (pr == serve::PopResult::kClosed) return Status::internal("equivalence run ended without a result");
      if (pr == serve::PopResult::kTimeout) {
        if (env_.now_ns() > deadline) {
          (void)path.scheduler->cancel(r.ticket->id());
          return Status(StatusCode::kDeadlineExceeded, "the run did not finish in time", FailureReason::kTimeout);
        }
        continue;
      }
      if (ev.kind == serve::RequestEvent::Kind::kText) {
        text += ev.text;
        continue;
      }
      return ev.state == serve::RequestState::kDone ? Status() : ev.status;
    }
  };
  for (size_t i = 0; i < paths_.size(); ++i) {
    for (size_t j = i + 1; j < paths_.size(); ++j) {
      const ExecutionPath& a = paths_[i];
      const ExecutionPath& b = paths_[j];
      if (a.fingerprint.empty() || a.fingerprint != b.fingerprint || a.placement == b.placement) continue;
      const std::string key = equivalence_key(a.fingerprint, a.placement, b.placement);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (equivalence_.count(key) != 0) continue;
      }
      EquivalenceInfo info;
      info.a = a.name;
      info.b = b.name;
      info.placement_a = a.placement;
      info.placement_b = b.placement;
      info.fingerprint = a.fingerprint;
      const EquivalenceStore& store = policy_.equivalence_store;
      const std::string stored_key = key + "|" + store.scope;
      if (store.load) {
        if (std::optional<EquivalenceInfo> kept = store.load(stored_key)) {
          info.passed = kept->passed;
          info.detail = kept->detail;
          info.ms = kept->ms;
          info.checked_ms = kept->checked_ms;
          info.source = "stored";
          emit({GatewayEventKind::kEquivalence, "", std::nullopt,
                "equivalence " + a.name + " <-> " + b.name + ": " + (info.passed ? "passed" : "FAILED") +
                    " (kept from an earlier run), " + info.detail});
          std::lock_guard<std::mutex> lk(mu_);
          equivalence_[key] = info;
          continue;
        }
      }
      // An on-demand replica not loaded yet is loaded by the check's own
      // runs (its first work) and given back after, so the mode keeps its
      // promise (nothing held until a request needs it) and is still a
      // verified migration target.
      const bool unload_a = !a.replica->info().loaded && a.unload;
      const bool unload_b = !b.replica->info().loaded && b.unload;
      info.passed = true;
      info.checked_ms = env_.wall_time_ms();
      const int64_t t0 = env_.now_ns();
      int32_t runs = 0;
      bool compared = true;
      for (const std::string& prompt_text : policy_.equivalence_prompts) {
        for (bool seeded : {false, true}) {
          serve::GenerationRequest g;
          g.prompt = prompt_text;
          g.sampler.temperature = seeded ? policy_.equivalence_temperature : 0.0f;
          g.sampler.seed = policy_.equivalence_seed;
          Result<std::vector<TokenId>> prompt = serve::encode_prompt(*a.tokenizer, g);
          const int32_t room =
              prompt.ok() ? std::min(a.scheduler->n_ctx(), b.scheduler->n_ctx()) - static_cast<int32_t>(prompt->size())
                          : 0;
          const int32_t n = std::min(policy_.equivalence_tokens, room);
          if (!prompt.ok() || n < 1) continue;
          Run ra = start(a, *prompt, g.sampler, n);
          Run rb = start(b, *prompt, g.sampler, n);
          std::string ta, tb;
          const Status sa = finish(ra, a, ta);
          const Status sb = finish(rb, b, tb);
          const std::string what = std::string(seeded ? "seeded" : "greedy") + " \"" + prompt_text + "\"";
          if (!sa.ok() || !sb.ok()) {
            info.passed = false;
            compared = false;
            info.detail = what + " did not run: " + (sa.ok() ? sb : sa).to_string();
          } else if (ta != tb) {
            size_t k = 0;
            while (k < ta.size() && k < tb.size() && ta[k] == tb[k]) ++k;
            info.passed = false;
            info.detail = what + ": texts differ at byte " + std::to_string(k) + " (\"" + ta + "\" vs \"" + tb + "\")";
          }
          if (!info.passed) break;
          ++runs;
        }
        if (!info.passed) break;
      }
      if (info.passed && runs == 0) {
        info.passed = false;
        compared = false;
        info.detail = "no prompt fits both paths' contexts";
      } else if (info.passed) {
        info.detail = std::to_string(runs) + " runs (greedy and seeded) of " +
                      std::to_string(policy_.equivalence_tokens) + " tokens gave the same text";
      }
      info.ms = static_cast<double>(env_.now_ns() - t0) / 1e6;
      emit({GatewayEventKind::kEquivalence, "", std::nullopt,
            "equivalence " + a.name + " <-> " + b.name + ": " + (info.passed ? "passed, " : "FAILED, ") + info.detail});
      for (const auto& [unload, path] : {std::pair{unload_a, &a}, std::pair{unload_b, &b}}) {
        if (unload && path->unload()) path->replica->mark_unloaded();
      }
      // A verdict is kept only when texts were compared: a run that could
      // not start or finish says nothing about the paths.
      if (store.save && compared) store.save(stored_key, info);
      std::lock_guard<std::mutex> lk(mu_);
      equivalence_[key] = info;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<EquivalenceInfo> out;
  for (const auto& [k, v] : equivalence_) out.push_back(v);
  return out;
}

Result<Checkpoint> Gateway::start_checkpoint(const serve::GenerationRequest& g) {
  SPW_ASSIGN_OR_RETURN(std::vector<TokenId> prompt, prepare(g));
  GenerateOptions o;
  const int32_t room = paths_[0].scheduler->n_ctx() - static_cast<int32_t>(prompt.size());
  o.max_tokens = g.max_tokens.value_or(std::max(1, room));
  o.sampler = g.sampler;
  o.stop = g.stop;
  o.ignore_eos = g.ignore_eos;
  o.min_tokens = g.min_tokens;
  o.constraint = g.constraint;
  o.stop_token_ids = g.stop_token_ids;
  return spw::start_checkpoint(paths_[0].fingerprint, std::move(prompt), std::move(o));
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
    count_decision(admission::decision_kind_name(d.kind), d);
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

void Gateway::stop_health() {
  {
    std::lock_guard<std::mutex> lk(health_sync_->mu);
    health_sync_->stop = true;
  }
  health_sync_->cv.notify_all();
  std::lock_guard<std::mutex> j(health_join_mu_);
  if (health_.joinable()) health_.join();
  // A check still running is bounded by the device's own finite waits.
  for (HealthRunner& r : health_runners_)
    if (r.thread.joinable()) r.thread.join();
}

Gateway::HealthPark Gateway::health_park() const {
  if (!has_health_) return {};
  std::lock_guard<std::mutex> lk(health_sync_->mu);
  const bool parked = health_sync_->parked && !health_sync_->stop;
  return {parked, parked};
}

void Gateway::health_loop() {
  HealthSync& hs = *health_sync_;
  const auto interval = static_cast<int64_t>(std::llround(policy_.health_interval_s * 1e9));
  int64_t next = env_.now_ns() + interval;
  std::unique_lock<std::mutex> lk(hs.mu);
  for (;;) {
    if (hs.stop) return;
    if (env_.now_ns() < next) {
      hs.parked = true;
      (void)env_.wait_until_ns(lk, hs.cv, next);
      hs.parked = false;
      continue;
    }
    lk.unlock();
    check_health_round();
    next = env_.now_ns() + interval;
    lk.lock();
  }
}

void Gateway::check_health_round() {
  HealthSync& hs = *health_sync_;
  const auto timeout = static_cast<int64_t>(std::llround(policy_.health_timeout_s * 1e9));
  for (HealthRunner& r : health_runners_) {
    // Only a device in service: an open breaker keeps clients off it already
    // and its recovery has probes of its own.
    if (!r.breaker->closed()) continue;
    auto fail = [&](const Status& st) {
      emit({GatewayEventKind::kHealthCheck, r.device->name(), std::nullopt,
            "health check of " + r.device->name() + " failed: " + st.to_string()});
      r.breaker->record_health_failure(st);
    };
    {
      std::lock_guard<std::mutex> lk(hs.mu);
      if (r.run && !r.run->done) {
        // The last check never answered: the device is still not answering.
        char buf[96];
        std::snprintf(buf, sizeof buf, "the health check started %.1f s ago has not answered",
                      static_cast<double>(env_.now_ns() - r.run->started_ns) / 1e9);
        const Status st(StatusCode::kDeadlineExceeded, buf, FailureReason::kTimeout);
        r.device->record_health_timeout(st);
        fail(st);
        continue;
      }
    }
    if (r.thread.joinable()) r.thread.join();
    auto run = std::make_shared<HealthRun>();
    run->started_ns = env_.now_ns();
    r.run = run;
    r.thread = std::thread([run, device = r.device, sync = health_sync_] {
      Status st = device->health_check();
      {
        std::lock_guard<std::mutex> lk(sync->mu);
        run->status = std::move(st);
        run->done = true;
      }
      sync->cv.notify_all();
    });
    Status result;
    bool answered = false;
    {
      std::unique_lock<std::mutex> lk(hs.mu);
      (void)env_.wait_until_ns(lk, hs.cv, run->started_ns + timeout, [&] { return hs.stop || run->done; });
      if (hs.stop) return;
      answered = run->done;
      if (answered) result = run->status;
    }
    if (!answered) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "the health check did not answer within %.1f s", policy_.health_timeout_s);
      const Status st(StatusCode::kDeadlineExceeded, buf, FailureReason::kTimeout);
      r.device->record_health_timeout(st);
      fail(st);
    } else if (!result.ok()) {
      fail(result);
    }
  }
}

void Gateway::stop_prober() {
  {
    std::lock_guard<std::mutex> lk(prober_sync_->mu);
    prober_sync_->stop = true;
  }
  prober_sync_->cv.notify_all();
  // A second shutdown (a second signal) waits here for the first's join.
  std::lock_guard<std::mutex> j(prober_join_mu_);
  if (prober_.joinable()) prober_.join();
}

Gateway::ProberPark Gateway::prober_park() const {
  if (!has_prober_) return {};
  ProberSync& ps = *prober_sync_;
  std::lock_guard<std::mutex> lk(ps.mu);
  ProberPark out;
  out.on_clock = ps.phase == ProberSync::Phase::kClock || ps.phase == ProberSync::Phase::kProbe;
  out.parked = ps.phase != ProberSync::Phase::kBusy && !ps.stop;
  if (ps.phase != ProberSync::Phase::kProbe && ps.kick) out.parked = false;
  if (ps.phase == ProberSync::Phase::kProbe && ps.probe_settled && ps.probe_settled()) out.parked = false;
  return out;
}

void Gateway::prober_loop() {
  ProberSync& ps = *prober_sync_;
  const auto retry_ns = static_cast<int64_t>(std::llround(policy_.probe_retry_s * 1e9));
  int64_t retry_at = 0;  // a probe that could not run waits until then
  std::unique_lock<std::mutex> lk(ps.mu);
  for (;;) {
    ps.phase = ProberSync::Phase::kBusy;
    if (ps.stop) return;
    ps.kick = false;
    lk.unlock();
    // The first half-open breaker's probe is due; else wait for the earliest
    // probe time of an open one (or for a trip, off the clock).
    const int64_t now = env_.now_ns();
    int64_t wake = -1;
    auto sooner = [&](int64_t t) { wake = wake < 0 ? t : std::min(wake, t); };
    const ExecutionPath* probe_path = nullptr;
    uint64_t episode = 0;
    std::set<const CircuitBreaker*> seen;
    for (const ExecutionPath& p : paths_) {
      if (!p.breaker || !seen.insert(p.breaker.get()).second) continue;  // the device's first path probes
      const uint64_t e = p.breaker->probe_episode();
      if (e != 0) {
        if (now >= retry_at) {
          probe_path = &p;
          episode = e;
          break;
        }
        sooner(retry_at);
        continue;
      }
      const BreakerSnapshot snap = p.breaker->snapshot();
      if (snap.state == BreakerState::kOpen) sooner(snap.next_probe_ns);
    }
    if (probe_path && probe_path->device && recovered_episode_[probe_path->breaker.get()] != episode) {
      // Before the episode's first probe: bring the device back if a fault
      // left it unhealthy (re-initialised; the paths re-open their session
      // groups on their next run, which is the probe).
      recovered_episode_[probe_path->breaker.get()] = episode;
      const uint64_t before = probe_path->device->status().reinitializations;
      const Status st = probe_path->device->recover();
      const DeviceStatus ds = probe_path->device->status();
      if (!st.ok()) {
        emit({GatewayEventKind::kDevice, ds.name, std::nullopt,
              "device " + ds.name + ": re-initialisation failed: " + st.to_string()});
        probe_path->breaker->record_probe(episode, st);
        lk.lock();
        continue;
      }
      if (ds.reinitializations > before) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.1f", ds.last_recovery_ms);
        emit({GatewayEventKind::kDevice, ds.name, std::nullopt,
              "device " + ds.name + ": re-initialised in " + buf + " ms (" + std::to_string(ds.reinitializations) +
                  " so far); probing it"});
      }
    }
    if (probe_path) {
      if (!run_probe(*probe_path, episode)) retry_at = env_.now_ns() + retry_ns;
      lk.lock();
      continue;
    }
    lk.lock();
    if (ps.stop || ps.kick) continue;
    if (wake >= 0) {
      ps.phase = ProberSync::Phase::kClock;
      (void)env_.wait_until_ns(lk, ps.cv, wake);
    } else {
      ps.phase = ProberSync::Phase::kIdle;
      ps.cv.wait(lk);
    }
  }
}

void Gateway::emit(GatewayEvent e) const {
  if (policy_.log) policy_.log(e.text);
  if (policy_.on_event) policy_.on_event(e);
}

bool Gateway::run_probe(const ExecutionPath& path, uint64_t episode) {
  ProberSync& ps = *prober_sync_;
  CircuitBreaker& breaker = *path.breaker;
  auto log = [&](const std::string& line) {
    emit({GatewayEventKind::kProbe, breaker.name(), std::nullopt, "circuit breaker " + breaker.name() + ": " + line});
  };
  // The reference: the CPU path (the first path without a breaker), when it
  // serves the same model; a fallback model's text is expected to differ.
  const ExecutionPath* ref = nullptr;
  for (const ExecutionPath& p : paths_) {
    if (!p.breaker) {
      ref = &p;
      break;
    }
  }
  const bool compare = ref && !ref->fallback_model && ref->model == path.model;
  serve::GenerationRequest g;
  g.prompt = policy_.probe_prompt;
  g.sampler.temperature = 0;  // greedy: the text is a function of the model
  Result<std::vector<TokenId>> prompt = serve::encode_prompt(*path.tokenizer, g);
  if (!prompt.ok()) {
    breaker.record_probe(episode, prompt.status().with_context("probe prompt"));
    return true;
  }
  const auto n_prompt = static_cast<int32_t>(prompt->size());
  int32_t room = path.scheduler->n_ctx() - n_prompt;
  if (compare) room = std::min(room, ref->scheduler->n_ctx() - n_prompt);
  const int32_t max_tokens = std::min(policy_.probe_tokens, room);
  if (max_tokens < 1) {
    breaker.record_probe(episode, Status(StatusCode::kInvalidArgument, "the probe prompt does not fit the context",
                                         FailureReason::kContextFull));
    return true;
  }
  auto wake = [sync = prober_sync_](const serve::Ticket&) {
    {
      std::lock_guard<std::mutex> lk(sync->mu);
      sync->kick = true;
    }
    sync->cv.notify_all();
  };
  // Drains a finished ticket: its text and final event.
  auto drain = [](serve::Ticket& tk, std::string& text) {
    serve::RequestEvent fin;
    serve::RequestEvent ev;
    while (tk.next_event(ev, std::chrono::milliseconds(0)) == serve::PopResult::kItem) {
      if (ev.kind == serve::RequestEvent::Kind::kText)
        text += ev.text;
      else
        fin = ev;
    }
    return fin;
  };
  auto prepared = [&](const serve::Scheduler& s) {
    serve::PreparedRequest p;
    p.id = next_ticket_id_.fetch_add(1);
    p.internal = true;
    p.on_finished = wake;
    p.job.prompt = *prompt;
    p.job.sampler = g.sampler;
    p.job.max_tokens = max_tokens;
    p.limits.n_ctx = s.n_ctx();
    p.limits.prompt_tokens = n_prompt;
    p.limits.max_tokens = max_tokens;
    p.kv_blocks = admission::kv_blocks_for(n_prompt + max_tokens, s.kv_block_tokens());
    p.decision.path = s.path();
    p.decision.reason = "circuit breaker probe";
    return p;
  };
  // The reference run: submitted once and kept across rounds (a probe that
  // fails at once does not wait for it), until its text is cached.
  if (compare && !probe_reference_ && ref_pending_ && serve::is_terminal(ref_pending_->state())) {
    std::string ref_text;
    if (drain(*ref_pending_, ref_text).state == serve::RequestState::kDone) probe_reference_ = std::move(ref_text);
    ref_pending_.reset();
  }
  if (compare && !probe_reference_ && !ref_pending_) {
    auto t = ref->scheduler->submit_prepared(prepared(*ref->scheduler));
    if (!t.ok()) {
      log("probe postponed: the " + ref->name + " path cannot run the reference now (" + t.status().message() + ")");
      return false;
    }
    ref_pending_ = *t;
  }
  const std::shared_ptr<serve::Ticket> ref_ticket = compare && !probe_reference_ ? ref_pending_ : nullptr;
  auto t = path.scheduler->submit_prepared(prepared(*path.scheduler));
  if (!t.ok()) {
    log("probe postponed: " + t.status().message());
    return false;
  }
  const std::shared_ptr<serve::Ticket> probe = *t;
  // Done waiting: the probe ended, and either it failed or the reference
  // (when one is still needed) ended too.
  auto settled = [probe, ref_ticket] {
    if (!serve::is_terminal(probe->state())) return false;
    return !ref_ticket || probe->state() != serve::RequestState::kDone || serve::is_terminal(ref_ticket->state());
  };
  const int64_t deadline = env_.now_ns() + static_cast<int64_t>(std::llround(policy_.probe_timeout_s * 1e9));
  bool stopped = false;
  {
    std::unique_lock<std::mutex> lk(ps.mu);
    ps.phase = ProberSync::Phase::kProbe;
    ps.probe_settled = settled;
    (void)env_.wait_until_ns(lk, ps.cv, deadline, [&] { return ps.stop || settled(); });
    ps.phase = ProberSync::Phase::kBusy;
    ps.probe_settled = nullptr;
    stopped = ps.stop;
  }
  if (stopped) {
    (void)path.scheduler->cancel(probe->id());
    if (ref_pending_) (void)ref->scheduler->cancel(ref_pending_->id());
    return true;
  }
  if (!serve::is_terminal(probe->state())) {
    (void)path.scheduler->cancel(probe->id());
    char buf[64];
    std::snprintf(buf, sizeof buf, "the probe did not finish within %.1f s", policy_.probe_timeout_s);
    log(std::string("probe failed: ") + buf);
    breaker.record_probe(episode, Status(StatusCode::kDeadlineExceeded, buf, FailureReason::kTimeout));
    return true;
  }
  std::string text;
  const serve::RequestEvent fin = drain(*probe, text);
  if (fin.state == serve::RequestState::kCancelled) return true;  // shutting down: says nothing
  if (fin.state != serve::RequestState::kDone) {
    const Status st =
        fin.status.ok() ? Status(StatusCode::kInternal, "probe failed", FailureReason::kUnhealthy) : fin.status;
    log("probe failed: " + st.to_string());
    breaker.record_probe(episode, st);
    return true;
  }
  if (ref_ticket) {
    std::string ref_text;
    const bool ended = serve::is_terminal(ref_ticket->state());
    const bool done = ended && drain(*ref_ticket, ref_text).state == serve::RequestState::kDone;
    if (!ended) (void)ref->scheduler->cancel(ref_ticket->id());
    ref_pending_.reset();
    if (!done) {
      log("probe postponed: the " + ref->name + " path's reference run did not complete");
      return false;
    }
    probe_reference_ = std::move(ref_text);
  }
  if (compare && text != *probe_reference_) {
    const Status st(
        StatusCode::kInternal,
        "probe text differs from the " + ref->name + " path's: \"" + text + "\" vs \"" + *probe_reference_ + "\"",
        FailureReason::kUnhealthy);
    log("probe failed: " + st.message());
    breaker.record_probe(episode, st);
    return true;
  }
  std::string how;
  if (compare)
    how = " (text equals the " + ref->name + " path's)";
  else if (ref)
    how = " (text not compared: the " + ref->name + " path serves another model)";
  else
    how = " (text not compared: no CPU path)";
  log("probe passed" + how);
  breaker.record_probe(episode, Status::ok_status());
  return true;
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
  if (model.empty()) return out;
  for (admission::PathSnapshot& s : out) {
    if (s.model == model || !s.usable) continue;
    s.usable = false;
    s.unusable_reason = "serves model " + s.model + ", not " + model + " (the request's model)";
  }
  return out;
}

Result<std::vector<TokenId>> Gateway::prepare(const serve::GenerationRequest& g) {
  SPW_RETURN_IF_ERROR(serve::validate_generation_request(g));
  refresh();
  return serve::encode_prompt(tokenizer(), g);
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
  count_decision(admission::decision_kind_name(d.kind), d);
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
  Result<std::vector<TokenId>> prepared = prepare(g);
  if (!prepared.ok()) return refuse(prepared.status(), {});
  const std::vector<TokenId>& prompt = *prepared;
  const auto n_prompt = static_cast<int32_t>(std::min<size_t>(prompt.size(), INT32_MAX));

  // A path can fill between the decision and the submit (other threads):
  // decide again with fresh snapshots, a bounded number of times.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<admission::PathSnapshot> snaps = snapshots_for(request.model);
    admission::Decision d = decide(shape_of(request, n_prompt), snaps);
    count_decision(admission::decision_kind_name(d.kind), d);
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

void Gateway::count_decision(std::string_view kind, const admission::Decision& d) {
  RecentDecision r;
  r.wall_ms = env_.wall_time_ms();
  r.kind = std::string(kind);
  r.path = d.path_index >= 0 && static_cast<size_t>(d.path_index) < paths_.size()
               ? paths_[static_cast<size_t>(d.path_index)].name
               : "";
  r.reason = d.reason;
  r.degraded = d.degraded();
  std::lock_guard<std::mutex> lk(mu_);
  ++decisions_[r.kind];
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
  SPW_ASSIGN_OR_RETURN(const std::vector<TokenId> prompt, prepare(g));
  const auto n_prompt = static_cast<int32_t>(std::min<size_t>(prompt.size(), INT32_MAX));
  std::vector<admission::PathSnapshot> snaps = snapshots_for(request.model);
  Quote q;
  q.decision = decide(shape_of(request, n_prompt), snaps);
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

admission::MemoryLedger* Gateway::cotenant_ledger() const {
  // The first path's ledger is the first-choice device's (the GPU's when
  // there is one): co-tenants compete for that memory.
  for (const ExecutionPath& p : paths_)
    if (p.ledger) return p.ledger.get();
  return nullptr;
}

ReservationInfo Gateway::info_locked(uint64_t id, int64_t now) const {
  const Lease& l = leases_.at(id);
  ReservationInfo r;
  r.id = id;
  r.owner = l.owner;
  r.name = l.name;
  r.ledger = l.ledger->name();
  r.bytes = l.bytes;
  r.ttl_s = l.ttl_s;
  r.expires_in_s = static_cast<double>(l.expires_ns - now) / 1e9;
  r.after = l.ledger->snapshot();
  r.fits = r.after.used <= r.after.limit;
  return r;
}

namespace {
std::string lease_not_found(uint64_t id) { return "reservation " + std::to_string(id) + " (released or expired)"; }
bool may_touch(const ReservationCaller& who, const std::string& owner) { return who.admin || who.owner == owner; }
}  // namespace

std::string Gateway::takes_last_path(const admission::MemoryLedger& ledger, uint64_t bytes) const {
  // Asked of decide() itself, so that every rule of admission (contexts,
  // breakers, the CPU path's host budget) counts: the smallest request each
  // model can take, now and with the lease added to every path on its ledger.
  std::set<std::string> models;
  for (const ExecutionPath& p : paths_) models.insert(p.model);
  admission::RequestShape smallest;
  smallest.prompt_tokens = 1;
  smallest.max_tokens = 1;
  for (const std::string& m : models) {
    std::vector<admission::PathSnapshot> snaps = snapshots_for(m);
    if (decide(smallest, snaps).kind == admission::DecisionKind::kReject) continue;  // nothing to take away
    for (admission::PathSnapshot& s : snaps) {
      if (s.ledger != ledger.name()) continue;
      // max(co-tenants + bytes, others) <= max(co-tenants, others) + bytes:
      // the pessimistic side.
      s.ledger_used += bytes;
      s.ledger_cotenants += bytes;
    }
    const admission::Decision after = decide(smallest, snaps);
    if (after.kind == admission::DecisionKind::kReject)
      return "model " + m + " would have no path left: " + after.reason;
  }
  return "";
}

Result<ReservationInfo> Gateway::reserve_cotenant(const std::string& name, uint64_t bytes, double ttl_s,
                                                  const ReservationCaller& who) {
  if (name.empty() || name.size() > 64) return invalid_field("name", "name: 1 to 64 characters");
  if (Status st = check_byte_size(bytes, "bytes"); !st.ok()) return invalid_field("bytes", st.message());
  if (!(ttl_s > 0) || ttl_s > 86400.0) return invalid_field("ttl_s", "ttl_s: must be in (0, 86400]");
  admission::MemoryLedger* ledger = cotenant_ledger();
  if (!ledger) return Status::failed_precondition("this server keeps no memory ledger to reserve in");
  refresh();
  // One reservation is checked and declared at a time: two that each fit
  // the share alone must not both pass on the same figures.
  std::lock_guard<std::mutex> serial(reserve_mu_);
  const admission::LedgerSnapshot before = ledger->snapshot();
  uint64_t leased = 0;  // what clients' leases hold on this ledger now (refresh() dropped the lapsed ones)
  {
    std::lock_guard<std::mutex> lk(mu_);
    size_t mine = 0;
    for (const auto& [id, l] : leases_) {
      if (l.owner == who.owner) ++mine;
      if (l.ledger == ledger) leased += l.bytes;
    }
    if (mine >= kMaxReservationsPerOwner) {
      return Status::resource_exhausted("too many reservations for this API key (" +
                                        std::to_string(kMaxReservationsPerOwner) + "); release some first");
    }
    if (leases_.size() >= kMaxReservations) {
      return Status::resource_exhausted("too many reservations on this server (" + std::to_string(kMaxReservations) +
                                        "); release some first");
    }
  }
  if (policy_.reservation_max_share < 1.0) {
    const auto cap = static_cast<uint64_t>(policy_.reservation_max_share * static_cast<double>(before.limit));
    if (leased + bytes > cap) {
      return Status::failed_precondition(
          "reservation of " + admission::format_bytes(bytes) + " refused: co-tenant reservations on " + before.name +
          " would hold " + admission::format_bytes(leased + bytes) + ", more than " +
          std::to_string(static_cast<int>(policy_.reservation_max_share * 100 + 0.5)) + "% of its limit " +
          admission::format_bytes(before.limit) + " (" + admission::format_bytes(cap) +
          "; the operator sets the share with --reservation-max-share)");
    }
    const std::string last = takes_last_path(*ledger, bytes);
    if (!last.empty()) {
      return Status::failed_precondition("reservation of " + admission::format_bytes(bytes) + " on " + before.name +
                                         " refused: " + last +
                                         " (the operator allows it with --reservation-max-share 1)");
    }
  }
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  SPW_ASSIGN_OR_RETURN(admission::Ticket t, ledger->declare({admission::OwnerKind::kCoTenant, name}, bytes));
  const uint64_t id = next_lease_id_++;
  leases_[id] = Lease{who.owner, name, ledger, t, bytes, ttl_s, now + static_cast<int64_t>(ttl_s * 1e9)};
  return info_locked(id, now);
}

Result<ReservationInfo> Gateway::renew(uint64_t id, const ReservationCaller& who) {
  refresh();
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  auto it = leases_.find(id);
  // Another owner's lease is as absent as a released one: its existence is
  // none of the caller's business.
  if (it == leases_.end() || !may_touch(who, it->second.owner)) return Status::not_found(lease_not_found(id));
  it->second.expires_ns = now + static_cast<int64_t>(it->second.ttl_s * 1e9);
  return info_locked(id, now);
}

Status Gateway::release(uint64_t id, const ReservationCaller& who) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || !may_touch(who, it->second.owner)) return Status::not_found(lease_not_found(id));
  Status st = it->second.ledger->release(it->second.ticket);
  leases_.erase(it);
  return st;
}

std::vector<ReservationInfo> Gateway::reservations(const ReservationCaller& who) {
  refresh();
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ReservationInfo> out;
  for (const auto& [id, l] : leases_)
    if (may_touch(who, l.owner)) out.push_back(info_locked(id, now));
  return out;
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
  out.reservations = reservations(ReservationCaller{"", /*admin=*/true});  // the HTTP layer filters per caller
  std::set<const admission::MemoryLedger*> seen;
  for (const ExecutionPath& p : paths_) {
    const serve::Scheduler& s = *p.scheduler;
    PathStatus ps;
    ps.name = p.name;
    ps.placement = p.placement;
    ps.model = p.model;
    ps.fingerprint = p.fingerprint;
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
