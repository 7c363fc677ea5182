// Gateway: the device health checks and the breaker prober, each on its own
// thread over the Env's clock (gateway.h's contract: health checks, probes,
// typed events). Split from gateway.cpp.
#include "gateway/gateway.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

namespace spw::gateway {

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

namespace {

// Drains a finished ticket: its text and final event.
serve::RequestEvent drain_ticket(serve::Ticket& tk, std::string& text) {
  serve::RequestEvent fin;
  serve::RequestEvent ev;
  while (tk.next_event(ev, std::chrono::milliseconds(0)) == serve::PopResult::kItem) {
    if (ev.kind == serve::RequestEvent::Kind::kText)
      text += ev.text;
    else
      fin = ev;
  }
  return fin;
}

}  // namespace

// One probe of a path's breaker: what run_probe's steps share.
struct Gateway::ProbeJob {
  const ExecutionPath& path;
  uint64_t episode;
  CircuitBreaker& breaker;
  const ExecutionPath* ref;  // the reference path (the CPU path), or null
  bool compare;              // the probe's text is compared with ref's
  std::function<void(const std::string&)> log;
  // The probe's request (or its reference run's) for a path's scheduler.
  std::function<serve::PreparedRequest(const serve::Scheduler&)> prepared;
};

bool Gateway::run_probe(const ExecutionPath& path, uint64_t episode) {
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
  const ProbeJob job{path, episode, breaker, ref, compare, log, prepared};
  if (!start_probe_reference(job)) return false;
  const std::shared_ptr<serve::Ticket> ref_ticket = compare && !probe_reference_ ? ref_pending_ : nullptr;
  auto t = path.scheduler->submit_prepared(prepared(*path.scheduler));
  if (!t.ok()) {
    log("probe postponed: " + t.status().message());
    return false;
  }
  const std::shared_ptr<serve::Ticket> probe = *t;
  if (wait_for_probe(probe, ref_ticket)) {  // stopped
    (void)path.scheduler->cancel(probe->id());
    if (ref_pending_) (void)ref->scheduler->cancel(ref_pending_->id());
    return true;
  }
  return finish_probe(job, probe, ref_ticket);
}

// The reference run: submitted once and kept across rounds (a probe that
// fails at once does not wait for it), until its text is cached.
bool Gateway::start_probe_reference(const ProbeJob& job) {
  const ExecutionPath* ref = job.ref;
  const bool compare = job.compare;
  if (compare && !probe_reference_ && ref_pending_ && serve::is_terminal(ref_pending_->state())) {
    std::string ref_text;
    if (drain_ticket(*ref_pending_, ref_text).state == serve::RequestState::kDone) {
      probe_reference_ = std::move(ref_text);
    }
    ref_pending_.reset();
  }
  if (compare && !probe_reference_ && !ref_pending_) {
    auto t = ref->scheduler->submit_prepared(job.prepared(*ref->scheduler));
    if (!t.ok()) {
      job.log("probe postponed: the " + ref->name + " path cannot run the reference now (" + t.status().message() +
              ")");
      return false;
    }
    ref_pending_ = *t;
  }
  return true;
}

bool Gateway::wait_for_probe(const std::shared_ptr<serve::Ticket>& probe,
                             const std::shared_ptr<serve::Ticket>& ref_ticket) {
  ProberSync& ps = *prober_sync_;
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
  return stopped;
}

bool Gateway::finish_probe(const ProbeJob& job, const std::shared_ptr<serve::Ticket>& probe,
                           const std::shared_ptr<serve::Ticket>& ref_ticket) {
  const ExecutionPath& path = job.path;
  const ExecutionPath* ref = job.ref;
  CircuitBreaker& breaker = job.breaker;
  const uint64_t episode = job.episode;
  const auto& log = job.log;
  if (!serve::is_terminal(probe->state())) {
    (void)path.scheduler->cancel(probe->id());
    char buf[64];
    std::snprintf(buf, sizeof buf, "the probe did not finish within %.1f s", policy_.probe_timeout_s);
    log(std::string("probe failed: ") + buf);
    breaker.record_probe(episode, Status(StatusCode::kDeadlineExceeded, buf, FailureReason::kTimeout));
    return true;
  }
  std::string text;
  const serve::RequestEvent fin = drain_ticket(*probe, text);
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
    const bool done = ended && drain_ticket(*ref_ticket, ref_text).state == serve::RequestState::kDone;
    if (!ended) (void)ref->scheduler->cancel(ref_ticket->id());
    ref_pending_.reset();
    if (!done) {
      log("probe postponed: the " + ref->name + " path's reference run did not complete");
      return false;
    }
    probe_reference_ = std::move(ref_text);
  }
  if (job.compare && text != *probe_reference_) {
    const Status st(
        StatusCode::kInternal,
        "probe text differs from the " + ref->name + " path's: \"" + text + "\" vs \"" + *probe_reference_ + "\"",
        FailureReason::kUnhealthy);
    log("probe failed: " + st.message());
    breaker.record_probe(episode, st);
    return true;
  }
  std::string how;
  if (job.compare)
    how = " (text equals the " + ref->name + " path's)";
  else if (ref)
    how = " (text not compared: the " + ref->name + " path serves another model)";
  else
    how = " (text not compared: no CPU path)";
  log("probe passed" + how);
  breaker.record_probe(episode, Status::ok_status());
  return true;
}

}  // namespace spw::gateway
