// The drill's simulation: the competing workload and the nemesis
// (simulation_internal.h): phases, declared and undeclared co-tenants, armed
// device faults, queue cancellations, kills and restarts, and the samples.
#include "drill/simulation_internal.h"

namespace spw::drill::sim_detail {

// ---- Competing workload and nemesis ------------------------------------

void Simulation::declare(uint64_t bytes) {
  declared_ = bytes;
  device_.set_competing(env_.now_ns(), declared_ + undeclared_);
  if (!proc_) return;
  if (proc_->lease != 0) {
    (void)proc_->gw->release(proc_->lease);
    proc_->lease = 0;
  }
  if (bytes > 0) {
    Result<gateway::ReservationInfo> r = proc_->gw->reserve_cotenant("drill-cotenant", bytes, 24 * 3600.0);
    if (r.ok()) proc_->lease = r->id;
  }
}

void Simulation::set_phase(const Phase& p) {
  event("phase", p.name);
  undeclared_ = p.undeclared_bytes;
  if (p.cotenant_bytes != declared_ || p.undeclared_bytes != 0) {
    event("cotenant", "declared " + admission::format_bytes(p.cotenant_bytes) + ", undeclared " +
                          admission::format_bytes(p.undeclared_bytes));
  }
  declare(p.cotenant_bytes);
}

void Simulation::fault(const FaultSpec& f, const std::string& phase) {
  const std::string kind(fault_kind_name(f.kind));
  const int path = f.path == "cpu" ? 1 : 0;
  switch (f.kind) {
    case FaultKind::kPressure:
      event(kind, "the competing workload declares " + admission::format_bytes(f.bytes));
      declare(f.bytes);
      return;
    case FaultKind::kAllocFail:
      event(kind, f.path + ": the next " + std::to_string(f.count) + " run(s) fail to allocate");
      for (int i = 0; i < f.count; ++i) {
        device_.arm(
            path, 0,
            Status(StatusCode::kResourceExhausted, "injected allocation failure", FailureReason::kDeviceOutOfMemory));
      }
      return;
    case FaultKind::kDeviceLost:
      event(kind, f.path + ": the next " + std::to_string(f.count) + " run(s) lose the device after " +
                      std::to_string(f.after_submits) + " token(s)");
      for (int i = 0; i < f.count; ++i) {
        device_.arm(path, std::max(0, f.after_submits),
                    Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost));
      }
      return;
    case FaultKind::kCancelQueued:
      for (int i = 0; i < std::max(1, f.count); ++i) cancel_queued(phase);
      return;
    case FaultKind::kKill:
      kill(f);
      return;
  }
}

void Simulation::cancel_queued(const std::string& phase) {
  if (!proc_ || !serving_) {
    event("cancel_queued", "skipped: the server is down");
    return;
  }
  Active* target = nullptr;
  for (auto& [id, a] : active_) {
    if (a.ticket->path() == "cpu" && a.ticket->state() == serve::RequestState::kQueued) target = &a;
  }
  std::string how = "a client's request queued on the cpu path";
  if (target == nullptr) {
    // Make one: the cpu path's idle workers get internal requests, and a
    // client's request is queued behind them on the cpu scheduler directly.
    serve::Scheduler& cpu = *proc_->gw->paths()[1].scheduler;
    const int idle = cpu.n_workers() - static_cast<int>(cpu.load().running.size());
    for (int i = 0; i < idle; ++i) {
      serve::GenerationRequest g;
      g.prompt = sc_.classes.front().prompt;
      Result<std::vector<TokenId>> toks = serve::encode_prompt(*tok_, g);
      if (!toks.ok()) break;
      serve::PreparedRequest p;
      p.id = kNemesisIds + ++nemesis_ids_;
      p.internal = true;
      p.job.prompt = *toks;
      p.job.sampler.temperature = 0;
      p.job.max_tokens = std::max(1, std::min(40, server_.ctx - static_cast<int32_t>(toks->size())));
      p.limits.n_ctx = server_.ctx;
      p.limits.prompt_tokens = static_cast<int32_t>(toks->size());
      p.limits.max_tokens = p.job.max_tokens;
      p.decision.path = "cpu";
      p.decision.path_index = 1;
      p.decision.reason = "the drill's nemesis keeps the cpu path busy (cancel_queued)";
      (void)cpu.submit_prepared(std::move(p));
      settle();
    }
    size_t cls = 0;
    for (const Phase& ph : sc_.phases)
      if (ph.name == phase && !ph.load.empty())
        for (size_t k = 0; k < sc_.classes.size(); ++k)
          if (sc_.classes[k].name == ph.load.front().cls) cls = k;
    auto& busy = busy_[sc_.classes[cls].name];
    int slot = 0;
    while (busy.count(slot)) ++slot;
    busy.insert(slot);
    auto c = std::make_unique<Chain>();
    Chain* chain = c.get();
    chain->client = static_cast<int>(cls) * 1000 + slot + 1;
    chain->cls = cls;
    chain->phase = phase;
    chain->prompt = sc_.classes[cls].prompt;
    chain->stream = sc_.classes[cls].stream;
    chain->greedy = true;
    chain->max_tokens = sc_.classes[cls].max_tokens;
    chain->prompt_key = sc_.classes[cls].name + "/greedy";
    chain->body = "{\"prompt\":\"" + json_escape(chain->prompt) +
                  "\",\"max_tokens\":" + std::to_string(chain->max_tokens) + ",\"nemesis\":true}";
    chains_.push_back(std::move(c));
    Op inv = rec_.invoke(request_op(*chain, "complete"));
    chain->first_op = inv.op_id;
    Result<journal::AcceptResult> acc = journal_->accept({"", "/v1/completions", chain->body, ""});
    Result<std::vector<TokenId>> toks = [&]() -> Result<std::vector<TokenId>> {
      serve::GenerationRequest g;
      g.prompt = chain->prompt;
      return serve::encode_prompt(*tok_, g);
    }();
    if (!acc.ok() || !toks.ok()) {
      Op res = inv;
      res.type = OpType::kFail;
      res.error_code = "internal_error";
      rec_.complete(inv, res);
      finish_chain(chain);
      return;
    }
    chain->record_id = acc->record.id;
    chain->public_id = acc->record.public_id;
    serve::PreparedRequest p;
    p.id = kNemesisIds + ++nemesis_ids_;
    p.record_id = chain->record_id;
    p.job.prompt = *toks;
    p.job.sampler.temperature = 0;
    const int32_t room = server_.ctx - static_cast<int32_t>(toks->size());
    p.job.max_tokens = std::max(1, std::min(chain->max_tokens, room));
    p.job.checkpoint_every = server_.checkpoint_every;
    p.limits.n_ctx = server_.ctx;
    p.limits.prompt_tokens = static_cast<int32_t>(toks->size());
    p.limits.max_tokens = p.job.max_tokens;
    p.limits.max_tokens_requested = chain->max_tokens;
    p.decision.kind = admission::DecisionKind::kRedirect;
    p.decision.path_index = 1;
    p.decision.path = "cpu";
    p.decision.reason = "queued on the cpu path by the drill's nemesis (cancel_queued)";
    p.decision.n_ctx = server_.ctx;
    p.decision.prompt_tokens = p.limits.prompt_tokens;
    p.decision.max_tokens = p.job.max_tokens;
    p.allow_migration = true;
    Result<std::shared_ptr<serve::Ticket>> t = cpu.submit_prepared(std::move(p));
    if (!t.ok()) {
      Op res = inv;
      res.type = OpType::kFail;
      const FailureClass fc = classify(t.status());
      res.http_status = fc.http_status;
      res.error_code = std::string(fc.code);
      res.error_message = t.status().message();
      rec_.complete(inv, res);
      serve::RequestEvent fin;
      fin.kind = serve::RequestEvent::Kind::kFinished;
      fin.state = serve::RequestState::kFailed;
      fin.status = t.status();
      (void)journal_->finish(chain->record_id, serve::JournalObserver::outcome_of(fin, "", 0));
      finish_chain(chain);
      event("cancel_queued", "skipped: the cpu path's queue is full");
      return;
    }
    given_ids_.insert(chain->record_id);
    Active a;
    a.chain = chain;
    a.inv = inv;
    a.ticket = *t;
    a.invoke_ns = env_.now_ns();
    auto [it, fresh] = active_.emplace(inv.op_id, std::move(a));
    target = &it->second;
    settle();
    how = "a client's request queued by the nemesis behind internal requests on the cpu path";
  }
  const uint64_t ticket_id = target->ticket->id();
  const bool queued = target->ticket->state() == serve::RequestState::kQueued;
  Op cop = request_op(*target->chain, "cancel");
  cop.continues = target->inv.op_id;
  Op inv = rec_.invoke(cop);
  const bool ok = proc_->gw->cancel(ticket_id);
  Op res = inv;
  res.t_ms = ms(env_.now_ns());
  res.type = ok ? OpType::kOk : OpType::kFail;
  res.request_id = target->chain->record_id;
  res.http_status = ok ? 200 : 404;
  res.latency_ms = 0;
  rec_.complete(inv, res);
  event("cancel_queued", how + (queued ? "" : " (it had started)") + ": request " +
                             std::to_string(target->chain->record_id) + (ok ? " cancelled" : " not found"));
}

void Simulation::kill(const FaultSpec& f) {
  if (!proc_) {
    event("kill", "skipped: the server is already down");
    return;
  }
  event("kill", "the server process is killed; restart in " + std::to_string(f.restart_after_s) + " s");
  proc_->alive->store(false);  // nothing more of this process reaches the journal
  // Every client with a request in flight loses its connection.
  for (auto& [op_id, a] : active_) {
    Chain* c = a.chain;
    Op res = a.inv;
    res.t_ms = ms(env_.now_ns());
    res.type = OpType::kInfo;
    res.request_id = c->record_id;
    res.accepted = true;
    fill_route(res, *a.ticket);
    res.http_status = c->stream ? 200 : 0;
    res.error_code = "connection_lost";
    res.error_message = "the server died mid-request";
    res.latency_ms = static_cast<double>(env_.now_ns() - a.invoke_ns) / 1e6;
    if (c->stream) {
      res.text = a.unsent + a.text;
      res.ttft_ms = a.first_text_ns >= 0 ? static_cast<double>(a.first_text_ns - a.invoke_ns) / 1e6 : -1;
      c->have += res.text;
    }
    rec_.complete(a.inv, res);
  }
  std::vector<Chain*> interrupted;
  for (auto& [op_id, a] : active_) interrupted.push_back(a.chain);
  active_.clear();
  stop_process(/*drive_clock=*/false);
  journal_.reset();
  const int64_t back = env_.now_ns() + to_ns(std::max(0.0, f.restart_after_s));
  at(back, [this] { restart(); });
  // Each client comes back a moment after the restart.
  for (Chain* c : interrupted) {
    at(back + to_ns(0.1), [this, c] {
      if (!journal_) return after_end(c);
      Result<journal::Record> r = journal_->get(c->record_id);
      if (r.ok() && journal::can_resume(*r)) return resume(c);
      if (!c->key.empty()) {
        c->retry = false;
        return send(c, "retry");
      }
      after_end(c);
    });
  }
}

void Simulation::restart() {
  Result<std::unique_ptr<journal::Journal>> j = journal::Journal::open(env_, journal_path_);
  if (!j.ok()) {
    error_ = true;
    error_msg_ = "reopening the journal after the kill: " + j.status().to_string();
    return;
  }
  journal_ = std::shared_ptr<journal::Journal>(std::move(*j));
  if (Status st = start_process(); !st.ok()) {
    error_ = true;
    error_msg_ = "restarting the gateway: " + st.to_string();
    return;
  }
  event("restart", "journal recovered " + std::to_string(journal_->recovered()) + " interrupted request(s)");
  declare(declared_);  // the competing workload declares itself to the new server
  // As `serve`: the equivalence check before it takes requests. The driver
  // moves the clock for its runs (see run()); clients are refused meanwhile.
  serving_ = false;
  gateway::Gateway* gw = proc_->gw.get();
  auto done = std::make_shared<std::atomic<bool>>(false);
  starting_done_ = done;
  starting_ = std::async(std::launch::async, [gw, done] {
    auto r = gw->verify_equivalence();
    done->store(true);
    return r;
  });
}

void Simulation::sample() {
  Sample s;
  s.t_ms = ms(env_.now_ns());
  s.competing_bytes = device_.competing();
  if (!proc_ || !serving_) {
    s.up = false;
    rec_.add_sample(std::move(s));
    return;
  }
  const gateway::GatewayStatus st = proc_->gw->status();
  for (const gateway::PathStatus& p : st.paths) {
    PathSample ps;
    ps.name = p.name;
    ps.queue_depth = p.queue_depth;
    ps.running = p.running;
    ps.oldest_queued_s = p.oldest_queued_s;
    if (p.breaker) ps.breaker = std::string(gateway::breaker_state_name(p.breaker->state));
    s.paths.push_back(std::move(ps));
  }
  for (const admission::LedgerSnapshot& l : st.ledgers) {
    if (l.name == "vulkan:0") {
      s.device_capacity = l.capacity;
      s.device_limit = l.limit;
      s.device_ours = l.reserved_ours;
      s.device_cotenants = l.reserved[static_cast<int>(admission::OwnerKind::kCoTenant)];
      s.device_used = l.used;
    } else if (l.name == "host") {
      s.host_budget = l.limit;
      s.host_reserved = l.reserved_total;
    }
  }
  rec_.add_sample(std::move(s));
}

void Simulation::flush_log() {
  std::vector<std::tuple<int64_t, std::string, std::string>> lines;
  {
    std::lock_guard<std::mutex> lk(log_mu_);
    lines.swap(log_);
  }
  std::sort(lines.begin(), lines.end());
  for (auto& [t, line, kind] : lines) {
    if (t < t0_) continue;  // the start's equivalence check
    rec_.add_event({ms(t), kind, line});
  }
}

}  // namespace spw::drill::sim_detail
