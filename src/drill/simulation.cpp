// The drill's simulation: see simulation.h for the contract.
#include "drill/simulation.h"

#include "drill/simulation_internal.h"

namespace spw::drill {

std::string_view sim_mode_name(SimMode m) {
  switch (m) {
    case SimMode::kPlanned:
      return "planned";
    case SimMode::kNoFailover:
      return "no_failover";
    case SimMode::kNaiveFreeMemory:
      return "naive_free_memory";
  }
  return "planned";
}

Result<SimMode> parse_sim_mode(std::string_view name) {
  for (SimMode m : {SimMode::kPlanned, SimMode::kNoFailover, SimMode::kNaiveFreeMemory}) {
    if (name == sim_mode_name(m)) return m;
  }
  return invalid_field(
      "mode", "simulation mode '" + std::string(name) + "': expected planned, no_failover or naive_free_memory");
}

std::string replay_command(const std::string& scenario_file, uint64_t seed, SimMode mode) {
  std::string cmd = "spillway drill --simulate --scenario " + scenario_file + " --seed " + std::to_string(seed);
  if (mode != SimMode::kPlanned) cmd += " --mode " + std::string(sim_mode_name(mode));
  return cmd;
}

namespace sim_detail {

Result<serve::ExecOutcome> ResidentExecutor::run(const serve::ExecJob& job, const serve::ExecCallbacks& cb,
                                                 const std::atomic<bool>& cancel) {
  const uint64_t ticket = tl_ticket;
  if (Status st = residency_->begin_run(unit_, cancel); !st.ok()) {
    after_.enter(ticket);
    return st;
  }
  Result<serve::ExecOutcome> out = inner_->run(job, cb, cancel);
  residency_->end_run(unit_, true);
  return out;
}

// The catalogue's models (server_.models, from the scenario's server.models):
// as build_gateway makes them, a GPU path "gpu/NAME" on the simulated device
// and a CPU fallback "cpu/NAME", each a residency unit whose plan (the served
// model's weights and half its pool, as the fake device's figures go) is
// reserved only while resident; their engines are the served model's fakes
// under a fingerprint of their own (a checkpoint resumes on its model).
Status Simulation::add_catalogue_paths(Process& p, const std::shared_ptr<serve::RequestObserver>& journal_obs,
                                       const std::shared_ptr<gateway::CircuitBreaker>& breaker,
                                       std::vector<gateway::ExecutionPath>& paths) {
  if (server_.models.empty()) return Status::ok_status();
  gateway::ResidencyOptions ro;
  ro.keep_alive_s = server_.keep_alive_s;
  ro.min_residency_s = server_.min_residency_s;
  p.residency = std::make_shared<gateway::ModelResidency>(*p.penv, std::move(ro));
  for (const gateway::CatalogueModel& cm : server_.models) {
    const std::string name = cm.name.empty() ? gateway::model_name_from_path(cm.path) : cm.name;
    for (int i = 0; i < 2; ++i) {
      const bool gpu = i == 0;
      const std::string unit = (gpu ? "gpu/" : "cpu/") + name;
      const uint64_t plan = dev_.weights + dev_.pool / 2;
      SPW_RETURN_IF_ERROR(p.residency->add(unit, name, {{gpu ? p.gpu_ledger : p.host_ledger, plan}}, cm.pinned,
                                           cm.keep_alive_s, 50));
      const admission::PathRole role = gpu ? admission::PathRole::kPrimary : admission::PathRole::kFallback;
      const gateway::PathShape shape = gateway::path_shape(server_, role, server_.ctx);
      serve::SchedulerOptions so = gateway::scheduler_options(
          server_, unit, shape,
          std::make_shared<TrackingObserver>(gateway::path_observer(journal_obs, gpu ? breaker : nullptr), p.after));
      so.placement = gpu ? "vulkan" : "cpu";
      const FakeSpeed speed = gpu ? FakeSpeed{1000.0, 100.0, 0} : FakeSpeed{200.0, 20.0, 0};
      so.prior_rates = admission::PathRates{speed.prefill_tps, speed.decode_tps, 1.0, 0, false};
      so.hooks.before_run = [](uint64_t id) { tl_ticket = id; };
      const std::string fingerprint = std::string(kFingerprint) + "/" + name;
      std::vector<std::unique_ptr<serve::Executor>> ex;
      for (int k = 0; k < shape.workers; ++k) {
        ex.push_back(std::make_unique<ResidentExecutor>(
            p.residency, unit, p.after,
            std::make_unique<SimExecutor>(*p.penv, device_, p.after, i, speed, fingerprint)));
      }
      SPW_ASSIGN_OR_RETURN(auto sched, serve::Scheduler::create(env_, tok_, std::move(ex), so));
      gateway::ExecutionPath path;
      path.name = unit;
      path.placement = so.placement;
      path.model = name;
      path.role = role;
      path.scheduler = std::move(sched);
      path.tokenizer = tok_;
      path.ledger = gpu ? p.gpu_ledger : p.host_ledger;
      if (gpu) path.breaker = breaker;
      path.fingerprint = fingerprint;
      paths.push_back(std::move(path));
    }
  }
  return Status::ok_status();
}

Status Simulation::start_process() {
  auto p = std::make_unique<Process>();
  p->penv = std::make_unique<ProcessEnv>(env_);
  SPW_ASSIGN_OR_RETURN(auto dl, admission::DeviceLedger::create(
                                    "vulkan:0", dev_.capacity,
                                    admission::HeadroomPolicy{server_.device_headroom, server_.device_headroom_share}));
  p->gpu_ledger = std::shared_ptr<admission::MemoryLedger>(std::move(dl));
  SPW_ASSIGN_OR_RETURN(auto w,
                       p->gpu_ledger->reserve({admission::OwnerKind::kModelWeights, model_name_}, dev_.weights));
  SPW_RETURN_IF_ERROR(p->gpu_ledger->commit(w, dev_.weights));
  SPW_ASSIGN_OR_RETURN(auto kv, p->gpu_ledger->reserve({admission::OwnerKind::kRequest, "kv-pool"}, dev_.pool));
  SPW_RETURN_IF_ERROR(p->gpu_ledger->commit(kv, dev_.pool));
  admission::HostBudgetPolicy hp;
  hp.cap_bytes = 4 * kGiB;
  admission::HostReadings hr;
  hr.mem_available = 64 * kGiB;
  SPW_ASSIGN_OR_RETURN(auto hl, admission::HostLedger::create("host", hp, hr));
  p->host_ledger = std::shared_ptr<admission::MemoryLedger>(std::move(hl));
  // The cpu path's plan in host memory: its model and KV pool.
  const uint64_t host_plan = dev_.weights + dev_.pool / 2;
  SPW_ASSIGN_OR_RETURN(auto hw, p->host_ledger->reserve({admission::OwnerKind::kModelWeights, model_name_}, host_plan));
  SPW_RETURN_IF_ERROR(p->host_ledger->commit(hw, host_plan));

  // The server's own wiring (gateway/composition.h): breaker, observers,
  // scheduler settings and policy as build_gateway makes them.
  SPW_ASSIGN_OR_RETURN(const gateway::BreakerOptions bo, gateway::breaker_options(server_));
  SPW_ASSIGN_OR_RETURN(std::shared_ptr<gateway::CircuitBreaker> breaker,
                       gateway::CircuitBreaker::create(env_, "vulkan:0", bo));
  auto journal_obs = std::make_shared<GatedObserver>(std::make_shared<serve::JournalObserver>(journal_), p->alive);

  std::vector<gateway::ExecutionPath> paths;
  for (int i = 0; i < 2; ++i) {
    const bool gpu = i == 0;
    const admission::PathRole role = gpu ? admission::PathRole::kPrimary : admission::PathRole::kFallback;
    const gateway::PathShape shape = gateway::path_shape(server_, role, server_.ctx);
    // The AfterRun tracking wraps the server's observers: the driver waits
    // for their last call (simulation-only, see AfterRun).
    serve::SchedulerOptions so = gateway::scheduler_options(
        server_, gpu ? "gpu" : "cpu", shape,
        std::make_shared<TrackingObserver>(gateway::path_observer(journal_obs, gpu ? breaker : nullptr), p->after));
    so.placement = gpu ? "vulkan" : "cpu";
    // The gpu path's KV gate on its pool's blocks (the fake device holds the
    // pool's bytes: Device::pool); the cpu path runs ungated.
    so.kv_blocks_total = gpu ? gateway::wanted_kv_blocks(server_, role, shape) : 0;
    const FakeSpeed speed = gpu ? FakeSpeed{1000.0, 100.0, 0} : FakeSpeed{200.0, 20.0, 0};
    so.prior_rates = admission::PathRates{speed.prefill_tps, speed.decode_tps, 1.0, 0, false};
    so.hooks.before_run = [](uint64_t id) { tl_ticket = id; };
    std::vector<std::unique_ptr<serve::Executor>> ex;
    for (int k = 0; k < shape.workers; ++k)
      ex.push_back(std::make_unique<SimExecutor>(*p->penv, device_, p->after, i, speed));
    SPW_ASSIGN_OR_RETURN(auto sched, serve::Scheduler::create(env_, tok_, std::move(ex), so));
    gateway::ExecutionPath path;
    path.name = so.path;
    path.placement = so.placement;
    path.model = model_name_;
    path.role = gpu ? admission::PathRole::kPrimary : admission::PathRole::kFallback;
    path.scheduler = std::move(sched);
    path.tokenizer = tok_;
    path.ledger = gpu ? p->gpu_ledger : p->host_ledger;
    if (gpu) path.breaker = breaker;
    path.fingerprint = kFingerprint;
    paths.push_back(std::move(path));
  }
  SPW_RETURN_IF_ERROR(add_catalogue_paths(*p, journal_obs, breaker, paths));
  gateway::GatewayPolicy gp = gateway::gateway_policy(server_);
  gp.residency = p->residency;
  // The run's mode decides the overflow (the live drill passes --overflow
  // per mode the same way).
  gp.overflow = opt_.mode == SimMode::kPlanned      ? gateway::Overflow::kPlanned
                : opt_.mode == SimMode::kNoFailover ? gateway::Overflow::kNone
                                                    : gateway::Overflow::kNaive;
  // The observed reading: ours (committed) plus what the competing workload
  // held one interval ago (a free-memory reading lags).
  std::weak_ptr<admission::MemoryLedger> weak = p->gpu_ledger;
  const int64_t lag = to_ns(std::max(server_.observe_interval_s, 0.25));
  gp.observe = [this, weak, lag] {
    auto l = weak.lock();
    if (!l) return;
    auto* dl = static_cast<admission::DeviceLedger*>(l.get());
    dl->observe(l->snapshot().committed_ours + device_.competing_at(env_.now_ns() - lag));
  };
  // No health prober: the fake device has no health check (its faults are
  // the nemesis's).
  gp.health_interval_s = 0;
  // The drill's co-tenant stands for real memory another process takes:
  // the operator's leave for it to take everything.
  gp.reservation_max_share = 1.0;
  gp.on_event = [this](const gateway::GatewayEvent& e) {
    std::lock_guard<std::mutex> lk(log_mu_);
    log_.emplace_back(env_.now_ns(), e.text, event_kind(e));
  };
  SPW_ASSIGN_OR_RETURN(p->gw, gateway::Gateway::create(env_, std::move(paths), {}, std::move(gp)));
  gateway::RequestServiceOptions ro;
  ro.journal = journal_;
  ro.encode_decision = [](const admission::Decision& d) { return http::render_decision(d); };
  ro.parse_stored = [this](const journal::Record& r) { return stored_request(r); };
  p->service = std::make_unique<gateway::RequestService>(env_, *p->gw, std::move(ro));
  proc_ = std::move(p);
  device_.reset_running();
  return Status::ok_status();
}

void Simulation::stop_process(bool drive_clock) {
  if (!proc_) return;
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  gateway::Gateway* gw = proc_->gw.get();
  std::thread stopper([&] {
    gw->shutdown(0ms);
    done.set_value();
  });
  if (!drive_clock) proc_->penv->kill();
  const auto until = std::chrono::steady_clock::now() + kRealTimeout;
  const auto fallback = std::chrono::steady_clock::now() + 2s;
  while (finished.wait_for(100us) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "drill simulation: seed %llu: shutdown hung\n", static_cast<unsigned long long>(opt_.seed));
      std::abort();
    }
    // A dying process needs no clock; a drained one (or a stuck kill) does.
    if (drive_clock || std::chrono::steady_clock::now() > fallback) env_.advance_to_next();
  }
  stopper.join();
  // The start-up check's runs ended with the shutdown: it returns now.
  if (starting_.valid()) {
    if (starting_.wait_for(kRealTimeout) != std::future_status::ready) {
      std::fprintf(stderr, "drill simulation: seed %llu: the start-up check hung\n",
                   static_cast<unsigned long long>(opt_.seed));
      std::abort();
    }
    (void)starting_.get();
  }
  serving_ = false;
  proc_->service.reset();
  proc_->gw.reset();
  proc_.reset();
}

Status Simulation::verify() {
  gateway::Gateway* gw = proc_->gw.get();
  // A flag rather than future::wait_for(0): that waits on a timer.
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto fut = std::async(std::launch::async, [gw, done] {
    auto r = gw->verify_equivalence();
    done->store(true);
    return r;
  });
  const auto until = std::chrono::steady_clock::now() + kRealTimeout;
  while (!done->load()) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "drill simulation: seed %llu: verify_equivalence hung\n",
                   static_cast<unsigned long long>(opt_.seed));
      std::abort();
    }
    // Only once every worker is parked, as anywhere else.
    // Only once every worker is parked and both runs of a pair are in
    // (verify submits them one after the other, from its own thread).
    // As in run(): the deadline before the counts, then settle again.
    if (!settle()) continue;
    const int64_t deadline = env_.next_deadline_ns();
    const auto& ps = proc_->gw->paths();
    if (deadline < 0 || ps[0].scheduler->stats().submitted != ps[1].scheduler->stats().submitted) {
      std::this_thread::yield();  // its thread is between runs
      continue;
    }
    if (settle()) env_.advance_to_next();
  }
  for (const gateway::EquivalenceInfo& e : fut.get()) {
    if (!e.passed) return Status(StatusCode::kInternal, "simulated paths not equivalent: " + e.detail);
  }
  return Status::ok_status();
}

Simulation::Picture Simulation::picture() const {
  Picture p;
  const gateway::Gateway::ProberPark park = proc_->gw->prober_park();
  p.prober_parked = park.parked;
  p.prober_on_clock = park.on_clock;
  for (const gateway::ExecutionPath& path : proc_->gw->paths()) {
    const serve::LoadSnapshot l = path.scheduler->load();
    p.paths.push_back(
        {static_cast<int64_t>(l.running.size()), static_cast<int64_t>(l.queued.size()), l.kv_blocks_free});
    p.running += static_cast<int>(l.running.size());
    if (!l.queued.empty() && static_cast<int>(l.running.size()) < path.scheduler->n_workers()) {
      const int32_t need = l.queued.front().kv_blocks;
      if (l.kv_blocks_total == 0 || need <= l.kv_blocks_free || need > l.kv_blocks_total) p.startable = true;
    }
  }
  return p;
}

// Waits (real time) until every running request's worker and the prober are
// parked and no queued request could start: only then is the picture (and
// advancing the clock) exact. As gateway_test's Harness::settle.
bool Simulation::settle() {
  if (!proc_) return true;
  const auto until = std::chrono::steady_clock::now() + kRealTimeout;
  int spins = 0;
  while (std::chrono::steady_clock::now() < until) {
    const bool idle1 = proc_->after.idle();
    const Picture a = picture();
    const int w1 = env_.waiters();
    const Picture b = picture();
    const int w2 = env_.waiters();
    const bool idle2 = proc_->after.idle();
    const int expected = a.running + (a.prober_on_clock ? 1 : 0);
    if (idle1 && idle2 && a == b && w1 == w2 && w1 == expected && !a.startable && a.prober_parked) return true;
    // Yield rather than sleep: the workers it waits for need microseconds,
    // and a sleep's timer slack (50 us) would dominate the run.
    if (++spins < 20000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(20us);
    }
  }
  error_ = true;
  error_msg_ =
      "the simulated gateway did not settle (a worker is stuck) at t=" + std::to_string(ms(env_.now_ns())) + " ms";
  return false;
}

Result<History> Simulation::run() {
  if (Result<std::unique_ptr<journal::Journal>> j = journal::Journal::open(env_, journal_path_); j.ok()) {
    journal_ = std::shared_ptr<journal::Journal>(std::move(*j));
  } else {
    return j.status();
  }
  SPW_RETURN_IF_ERROR(start_process());
  SPW_RETURN_IF_ERROR(verify());
  {
    std::lock_guard<std::mutex> lk(log_mu_);
    log_.clear();
  }
  t0_ = env_.now_ns();
  end_ns_ = t0_ + to_ns(sc_.total_s() + std::max(0.0, sc_.drain_s));
  device_.set_competing(t0_, 0);
  History& h = rec_.unsafe_history();
  h.scenario = sc_.name;
  h.mode = std::string(sim_mode_name(opt_.mode));
  h.seed = opt_.seed;
  h.first_path = "gpu";
  schedule_workload();

  serving_ = true;
  auto spin_until = std::chrono::steady_clock::time_point::max();
  for (;;) {
    if (!settle()) break;
    flush_log();
    poll();
    if (error_) break;
    if (starting_.valid()) {
      // A restarted server's start-up check: done, or time may pass only
      // while one of its runs is in flight with both of a pair submitted
      // (between runs its thread is about to submit or to return, and
      // nothing else may happen at that instant before it did).
      if (starting_done_->load()) {
        std::string detail;
        for (const gateway::EquivalenceInfo& e : starting_.get()) detail += e.detail;
        serving_ = true;
        event("ready", "the restarted server takes requests (equivalence: " + detail + ")");
        spin_until = std::chrono::steady_clock::time_point::max();
        continue;
      }
      // The deadline first: a run parked on the clock was submitted before,
      // so the counts read after it include it. Equal counts then mean the
      // pair's second run is in too; the settle below lets it start.
      const int64_t deadline = env_.next_deadline_ns();
      const auto& ps = proc_->gw->paths();
      if (deadline < 0 || ps[0].scheduler->stats().submitted != ps[1].scheduler->stats().submitted) {
        if (spin_until == std::chrono::steady_clock::time_point::max()) {
          spin_until = std::chrono::steady_clock::now() + kRealTimeout;
        } else if (std::chrono::steady_clock::now() > spin_until) {
          error_ = true;
          error_msg_ = "the restarted server's start-up check is stuck";
          break;
        }
        std::this_thread::yield();
        continue;
      }
      spin_until = std::chrono::steady_clock::time_point::max();
      if (!settle()) break;
    }
    const int64_t now = env_.now_ns();
    if (!actions_.empty() && actions_.begin()->first.first <= now) {
      auto f = std::move(actions_.begin()->second);
      actions_.erase(actions_.begin());
      f();
      continue;
    }
    if (now >= end_ns_ && !starting_.valid()) break;
    int64_t next = actions_.empty() ? -1 : actions_.begin()->first.first;
    const int64_t deadline = env_.next_deadline_ns();
    if (deadline >= 0 && (next < 0 || deadline < next)) next = deadline;
    if (next < 0 || (next > end_ns_ && !starting_.valid())) next = end_ns_;
    env_.advance_to(next);
  }
  if (error_) return Status(StatusCode::kInternal, "seed " + std::to_string(opt_.seed) + ": " + error_msg_);
  // The end: whatever is still in flight is cancelled by the shutdown and
  // its client hears so.
  stop_process(/*drive_clock=*/true);
  flush_log();
  for (auto& [op_id, a] : active_) {
    serve::RequestEvent ev;
    bool done = false;
    while (!done && a.ticket->next_event(ev, 0ms) == serve::PopResult::kItem) {
      if (ev.kind == serve::RequestEvent::Kind::kText) {
        a.text += ev.text;
      } else {
        a.chain->resumes = kMaxResumes;  // no resume after the end
        a.chain->retry = false;
        complete(a, ev);
        done = true;
      }
    }
    if (!done) {
      Op res = a.inv;
      res.t_ms = ms(env_.now_ns());
      res.type = OpType::kInfo;
      res.request_id = a.chain->record_id;
      res.accepted = true;
      res.error_code = "drill_ended";
      rec_.complete(a.inv, res);
    }
  }
  active_.clear();
  // Reference texts and the journal's final records.
  for (const auto& c : chains_) {
    if (h.reference.count(c->prompt_key)) continue;
    serve::GenerationRequest g;
    g.prompt = c->prompt;
    Result<std::vector<TokenId>> toks = serve::encode_prompt(*tok_, g);
    const int32_t n = toks.ok() ? static_cast<int32_t>(toks->size()) : 0;
    h.reference[c->prompt_key] = FakeExecutor::text_of(std::max(0, std::min(c->max_tokens, server_.ctx - n)));
  }
  for (int64_t id : given_ids_) {
    FinalRecord f;
    f.request_id = id;
    Result<journal::Record> r = journal_ ? journal_->get(id) : Result<journal::Record>(Status::not_found("no journal"));
    if (r.ok()) {
      f.found = true;
      f.state = std::string(journal::state_name(r->state));
      f.error_code = r->outcome.error_code;
      f.text = r->outcome.text;
      f.placement = r->placement;
      f.runs = r->attempts;
    }
    if (auto it = under_reserve_.find(id); it != under_reserve_.end()) f.admitted_under_reserve = it->second;
    h.finals[id] = std::move(f);
  }
  h.duration_ms = ms(env_.now_ns());
  journal_.reset();
  return rec_.take();
}

std::string make_run_dir(const std::string& base) {
  std::string root = base;
  if (root.empty()) {
    if (::access("/dev/shm", W_OK) == 0) {
      root = "/dev/shm";
    } else if (const char* t = std::getenv("TMPDIR"); t && *t) {
      root = t;
    } else {
      root = "/tmp";
    }
  }
  std::string tmpl = root + "/spw-drill-sim-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return std::string(buf.data());
}

}  // namespace sim_detail

using namespace sim_detail;

Result<History> simulate(const Scenario& scenario, const SimOptions& options) {
  if (scenario.classes.empty() || scenario.phases.empty()) {
    return invalid_field("scenario", "the simulation needs at least one request class and one phase");
  }
  for (const Phase& p : scenario.phases) {
    for (const FaultSpec& f : p.faults) {
      if (f.path != "gpu" && f.path != "cpu") {
        return invalid_field("path", "fault path '" + f.path + "': the simulation has the paths gpu and cpu");
      }
    }
  }
  SPW_ASSIGN_OR_RETURN(gateway::GatewayOptions server, server_options(scenario, options));
  Device dev;
  dev.capacity = options.device.capacity;
  if (dev.capacity == 0 && !scenario.server.device_memory.empty()) {
    SPW_ASSIGN_OR_RETURN(dev.capacity, parse_size(scenario.server.device_memory, "server.device_memory"));
  }
  if (dev.capacity == 0) dev.capacity = kGiB;
  dev.weights = options.device.weights_bytes ? options.device.weights_bytes : dev.capacity / 32;
  dev.pool = options.device.pool_bytes ? options.device.pool_bytes : dev.capacity / 32;
  dev.run_bytes = options.device.run_bytes ? options.device.run_bytes : std::max<uint64_t>(1, dev.capacity / 256);
  if (dev.weights + dev.pool >= dev.capacity) {
    return invalid_field("device", "the simulated device's plan (weights + pool) does not fit its capacity");
  }
  std::shared_ptr<const Tokenizer> tok = options.tokenizer;
  if (!tok) {
    SPW_ASSIGN_OR_RETURN(tok, load_tokenizer(options.model_path.empty() ? scenario.server.model : options.model_path));
  }
  const std::string dir = make_run_dir(options.work_dir);
  if (dir.empty()) return Status::io_error("cannot make a temporary folder for the simulation's journal");
  Result<History> out = Status(StatusCode::kInternal, "not run");
  {
    Simulation sim(scenario, options, std::move(server), dev, tok, dir + "/journal.db");
    out = sim.run();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

Result<SimSummary> simulate_seeds(const Scenario& scenario, const SimOptions& base, uint64_t first_seed,
                                  int64_t n_seeds, SimMode mode, const SimProgress& progress) {
  if (n_seeds < 1) return invalid_field("seeds", "the number of seeds must be >= 1");
  SimSummary s;
  s.scenario = scenario.name;
  s.mode = mode;
  s.first_seed = first_seed;
  const auto t0 = std::chrono::steady_clock::now();
  SimOptions o = base;
  o.mode = mode;
  if (!o.tokenizer) {
    Result<std::shared_ptr<const Tokenizer>> tok =
        load_tokenizer(o.model_path.empty() ? scenario.server.model : o.model_path);
    if (tok.ok()) o.tokenizer = *tok;  // else every seed reports the error
  }
  const std::string file = o.scenario_file.empty() ? scenario.name + ".toml" : o.scenario_file;

  // Seeds run side by side on `jobs` threads (each run is mostly waiting
  // for thread hand-offs, so more runs than cores still gain); results are
  // taken in seed order on this thread.
  struct Slot {
    bool done = false;
    Status error;
    CheckResult check;
  };
  std::vector<Slot> slots(static_cast<size_t>(n_seeds));
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int64_t> next{0};
  int jobs = o.jobs > 0 ? o.jobs : 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = static_cast<int>(std::min<int64_t>(jobs, n_seeds));
  auto worker = [&] {
    SimOptions mine = o;
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n_seeds) return;
      mine.seed = first_seed + static_cast<uint64_t>(i);
      Slot r;
      Result<History> h = simulate(scenario, mine);
      if (h.ok()) {
        r.check = check(*h);
      } else {
        r.error = h.status();
      }
      r.done = true;
      {
        std::lock_guard<std::mutex> lk(mu);
        slots[static_cast<size_t>(i)] = std::move(r);
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < jobs; ++j) threads.emplace_back(worker);
  for (int64_t i = 0; i < n_seeds; ++i) {
    Slot r;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return slots[static_cast<size_t>(i)].done; });
      r = std::move(slots[static_cast<size_t>(i)]);
    }
    const uint64_t seed = first_seed + static_cast<uint64_t>(i);
    ++s.seeds;
    if (!r.error.ok()) {
      s.failures.push_back({seed, {"simulation"}, r.error.to_string(), replay_command(file, seed, mode)});
      if (progress) progress(seed, nullptr);
      continue;
    }
    const CheckResult& c = r.check;
    s.accepted += c.figures.accepted;
    s.succeeded += c.figures.succeeded;
    s.refused += c.figures.refused;
    s.lost += c.figures.lost;
    s.duplicated += c.figures.duplicated;
    for (const Gate& g : c.gates)
      if (g.name == "reserve_line" && !g.passed) ++s.over_reserve;
    if (c.passed) {
      ++s.passed;
    } else {
      SeedFailure f;
      f.seed = seed;
      f.failed_gates = c.failed_gates();
      for (const Gate& g : c.gates) {
        if (g.passed) continue;
        if (!f.detail.empty()) f.detail += "; ";
        f.detail += g.name + ": " + g.detail;
      }
      f.command = replay_command(file, seed, mode);
      s.failures.push_back(std::move(f));
    }
    if (progress) progress(seed, &c);
  }
  for (std::thread& t : threads) t.join();
  s.success_rate = s.accepted > 0 ? static_cast<double>(s.succeeded) / static_cast<double>(s.accepted) : 1.0;
  s.real_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace spw::drill
