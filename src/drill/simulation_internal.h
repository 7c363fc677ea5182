// The drill's simulation, private parts shared by its files: the simulated
// server process (its clock, the fake device, the executor and observers)
// and the Simulation that drives one seed. simulation.cpp: a process's start,
// stop and checks, the run loop, simulate() and simulate_seeds();
// simulation_workload.cpp: the clients' requests and what continues them;
// simulation_nemesis.cpp: the competing workload, the faults and restarts.
// Not part of the drill's contract (simulation.h).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "drill/simulation.h"
#include "admission/controller.h"
#include "admission/ledger.h"
#include "core/failure.h"
#include "core/sim_env.h"
#include "core/size.h"
#include "engine/checkpoint.h"
#include "gateway/breaker.h"
#include "gateway/composition.h"
#include "gateway/gateway.h"
#include "gateway/residency.h"
#include "gateway/request_service.h"
#include "gguf/gguf.h"
#include "http/spillway_api.h"
#include "journal/journal.h"
#include "serve/journal_observer.h"
#include "serve/scheduler.h"
#include "serve/testing/fake_executor.h"
#include "tokenizer/tokenizer.h"

namespace spw::drill::sim_detail {


using namespace std::chrono_literals;
using serve::testing::FakeExecutor;
using serve::testing::FakeFaults;
using serve::testing::FakeSpeed;

inline constexpr uint64_t kMiB = 1024ull * 1024;
inline constexpr uint64_t kGiB = 1024ull * kMiB;
// Real-time bound on one quiescence wait: a correct run never comes near it;
// it turns a stuck worker into an error instead of a hang.
inline constexpr std::chrono::milliseconds kRealTimeout = 10s;
inline constexpr const char* kFingerprint = "fake-model";
inline constexpr int kMaxResumes = 8;
// Ticket ids of requests the nemesis queues on the cpu path itself (beyond
// any the gateway numbers in one run).
inline constexpr uint64_t kNemesisIds = 1ull << 48;

inline int64_t to_ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

// ---- Sizes and server flags -------------------------------------------

// core/size.h's reading, as scenario.cpp and --device-memory take sizes; the
// error names the scenario field.
inline Result<uint64_t> parse_size(std::string_view text, const std::string& what) {
  Result<uint64_t> r = parse_byte_size(text);
  if (!r.ok()) return invalid_field(what, what + ": " + r.status().message());
  return r;
}

// The simulated server's options: SimOptions::server (the scenario's
// server.args as `spillway serve` parses them), ctx 0 (the model's
// context_length) as the simulated model's, kSimContext. Checked as
// build_gateway checks them, plus what the simulation needs (a queue on each
// path, a context of at least one block, a headroom share below 1).
inline Result<gateway::GatewayOptions> server_options(const Scenario& sc, const SimOptions& o) {
  if (!o.server && !sc.server.args.empty()) {
    return invalid_field("server.args",
                         "server.args: the simulation takes them parsed (SimOptions::server: `spillway drill` parses "
                         "them as `spillway serve` does)");
  }
  gateway::GatewayOptions s = o.server.value_or(gateway::GatewayOptions{});
  if (s.ctx == 0) s.ctx = kSimContext;
  if (Status st = gateway::check_options(s); !st.ok()) return st.with_context("server.args");
  if (s.queue < 1 || s.cpu_queue < 1 || s.ctx < 16 || s.checkpoint_every < 0 ||
      !(s.device_headroom_share >= 0 && s.device_headroom_share < 1)) {
    return invalid_field("server.args", "server.args: a value is out of range for the simulation");
  }
  return s;
}

// ---- The tokenizer, loaded once per file -------------------------------

inline Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(path); it != cache.end()) return it->second;
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(Env::default_env(), path));
  SPW_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_gguf(*file));
  std::shared_ptr<const Tokenizer> shared(std::move(tok));
  cache[path] = shared;
  return shared;
}

inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// ---- One server process's clock for its engines -------------------------

// The engines' view of the clock: the SimEnv's, except that kill() wakes
// every sleeper at once and makes later sleeps return at once, so that a
// killed process's runs end without the simulated clock moving (a dead
// process takes no time to die). Each sleeper waits on its own mutex and
// cv, so that a wake-up reaches only it.
class ProcessEnv final : public Env {
 public:
  explicit ProcessEnv(SimEnv& base) : base_(base) {}

  int64_t now_ns() override { return base_.now_ns(); }
  int64_t wall_time_ms() override { return base_.wall_time_ms(); }
  void sleep_for_ns(int64_t ns) override {
    if (ns <= 0) return;
    Sleeper s;
    const int64_t deadline = base_.now_ns() + ns;
    {
      std::lock_guard<std::mutex> lk(reg_mu_);
      if (killed_) return;
      sleepers_.insert(&s);
    }
    {
      std::unique_lock<std::mutex> lk(s.mu);
      while (!s.woken) {
        if (!base_.wait_until_ns(lk, s.cv, deadline)) break;
      }
    }
    std::lock_guard<std::mutex> lk(reg_mu_);
    sleepers_.erase(&s);
  }
  using Env::wait_until_ns;
  bool wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, int64_t deadline_ns) override {
    return base_.wait_until_ns(lock, cv, deadline_ns);
  }
  uint64_t random_u64() override { return base_.random_u64(); }
  using Env::map_file;
  Result<std::unique_ptr<MappedFile>> map_file(const std::string& path, const MapOptions& options) override {
    return base_.map_file(path, options);
  }
  Result<std::string> read_file(const std::string& path) override { return base_.read_file(path); }
  Status write_file(const std::string& path, std::string_view data) override { return base_.write_file(path, data); }
  bool file_exists(const std::string& path) override { return base_.file_exists(path); }

  void kill() {
    std::lock_guard<std::mutex> lk(reg_mu_);
    killed_ = true;
    for (Sleeper* s : sleepers_) {
      std::lock_guard<std::mutex> sl(s->mu);
      s->woken = true;
      s->cv.notify_all();
    }
  }
  bool killed() {
    std::lock_guard<std::mutex> lk(reg_mu_);
    return killed_;
  }

 private:
  struct Sleeper {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
  };
  SimEnv& base_;
  std::mutex reg_mu_;  // before any Sleeper's mu
  bool killed_ = false;
  std::set<Sleeper*> sleepers_;
};

// ---- The fake device ---------------------------------------------------

// The GPU's bytes and the nemesis's armed faults; shared by every executor
// of every process of one run. Runs that start at one simulated instant are
// decided together one nanosecond later, in (path, ticket id) order, so the
// outcome never depends on which worker thread got there first.
class DeviceModel {
 public:
  DeviceModel(uint64_t capacity, uint64_t plan, uint64_t run_bytes)
      : capacity_(capacity), plan_(plan), run_bytes_(run_bytes) {}

  struct Start {
    int path = 0;
    uint64_t ticket = 0;
    int64_t t_ns = 0;
    bool resolved = false;
    Status fault;        // armed fault taken by this run (OK: none)
    int32_t after = 0;   // tokens before it fires
    bool oom = false;    // the device had no room for it
    bool holds = false;  // holds run_bytes until it ends
  };

  // Called at a run's start on its worker thread; blocks 1 ns of simulated
  // time. False when the process was killed meanwhile.
  bool start(Start& s, ProcessEnv& penv) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending_.insert(&s);
    }
    penv.sleep_for_ns(1);
    std::lock_guard<std::mutex> lk(mu_);
    if (penv.killed() && !s.resolved) {
      pending_.erase(&s);
      return false;
    }
    if (!s.resolved) resolve_locked(penv.now_ns());
    return true;
  }
  void end(const Start& s) {
    if (!s.holds) return;
    std::lock_guard<std::mutex> lk(mu_);
    --running_;
  }

  void arm(int path, int32_t after, Status st) {
    std::lock_guard<std::mutex> lk(mu_);
    armed_[path].push_back({after, std::move(st)});
  }
  void set_competing(int64_t now, uint64_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    competing_ = bytes;
    timeline_.push_back({now, bytes});
  }
  uint64_t competing() const {
    std::lock_guard<std::mutex> lk(mu_);
    return competing_;
  }
  // What the competing workload held at `t` (a lagging reading sees this).
  uint64_t competing_at(int64_t t) const {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t v = 0;
    for (const auto& [when, bytes] : timeline_) {
      if (when > t) break;
      v = bytes;
    }
    return v;
  }
  int64_t ooms() const {
    std::lock_guard<std::mutex> lk(mu_);
    return ooms_;
  }
  int64_t faults_fired() const {
    std::lock_guard<std::mutex> lk(mu_);
    return fired_;
  }
  void reset_running() {
    std::lock_guard<std::mutex> lk(mu_);
    running_ = 0;
  }

 private:
  struct Order {
    bool operator()(const Start* a, const Start* b) const {
      if (a->t_ns != b->t_ns) return a->t_ns < b->t_ns;
      if (a->path != b->path) return a->path < b->path;
      if (a->ticket != b->ticket) return a->ticket < b->ticket;
      return a < b;
    }
  };
  void resolve_locked(int64_t now) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      Start* s = *it;
      if (s->t_ns >= now) {
        ++it;
        continue;
      }
      auto& q = armed_[s->path];
      if (!q.empty()) {
        s->fault = std::move(q.front().second);
        s->after = q.front().first;
        q.erase(q.begin());
        ++fired_;
      }
      if (s->path == 0 && !(!s->fault.ok() && s->after == 0)) {
        const uint64_t need = plan_ + run_bytes_ * static_cast<uint64_t>(running_ + 1) + competing_;
        if (need > capacity_) {
          s->oom = true;
          ++ooms_;
        } else {
          s->holds = true;
          ++running_;
        }
      }
      s->resolved = true;
      it = pending_.erase(it);
    }
  }

  const uint64_t capacity_, plan_, run_bytes_;
  mutable std::mutex mu_;
  std::set<Start*, Order> pending_;
  std::map<int, std::vector<std::pair<int32_t, Status>>> armed_;
  uint64_t competing_ = 0;
  std::vector<std::pair<int64_t, uint64_t>> timeline_;
  int running_ = 0;
  int64_t ooms_ = 0, fired_ = 0;
};

// The ticket id a worker is about to run (SchedulerHooks::before_run).
thread_local uint64_t tl_ticket = 0;

// Runs whose worker is still busy after run() returned: the scheduler then
// fails it over (the gateway decides, another path adopts it) and calls the
// observer (journal, breaker: a trip and its log line) on that worker's
// thread, after the ticket already left the path's running set. settle()
// cannot see that thread otherwise; a run counts here from its return to the
// end of its on_finish / on_failover.
class AfterRun {
 public:
  void enter(uint64_t ticket) {
    std::lock_guard<std::mutex> lk(mu_);
    tickets_.insert(ticket);
  }
  void leave(uint64_t ticket) {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = tickets_.find(ticket); it != tickets_.end()) tickets_.erase(it);
  }
  bool idle() const {
    std::lock_guard<std::mutex> lk(mu_);
    return tickets_.empty();
  }

 private:
  mutable std::mutex mu_;
  std::multiset<uint64_t> tickets_;
};

// A catalogue model's worker (issue 32): its runs go through the model
// residency as the real on-demand executor's do (room made, or waited for,
// before the run; the unit released after it); a run the residency refuses
// ends there, counted by AfterRun like any run's return.
class ResidentExecutor final : public serve::Executor {
 public:
  ResidentExecutor(std::shared_ptr<gateway::ModelResidency> residency, std::string unit, AfterRun& after,
                   std::unique_ptr<serve::Executor> inner)
      : residency_(std::move(residency)), unit_(std::move(unit)), after_(after), inner_(std::move(inner)) {}
  Result<serve::ExecOutcome> run(const serve::ExecJob& job, const serve::ExecCallbacks& cb,
                                 const std::atomic<bool>& cancel) override;

 private:
  std::shared_ptr<gateway::ModelResidency> residency_;
  std::string unit_;
  AfterRun& after_;
  std::unique_ptr<serve::Executor> inner_;
};

// A worker's engine: the device decides first (armed fault, out of memory),
// then a FakeExecutor with its own FakeFaults runs it on the process's clock.
class SimExecutor final : public serve::Executor {
 public:
  // `fingerprint`: the model it serves (a catalogue model's is its own).
  SimExecutor(ProcessEnv& penv, DeviceModel& device, AfterRun& after, int path, FakeSpeed speed,
              const std::string& fingerprint = kFingerprint)
      : penv_(penv),
        device_(device),
        after_(after),
        path_(path),
        faults_(std::make_shared<FakeFaults>()),
        inner_(penv, speed, faults_, fingerprint) {}

  Result<serve::ExecOutcome> run(const serve::ExecJob& job, const serve::ExecCallbacks& cb,
                                 const std::atomic<bool>& cancel) override {
    Result<serve::ExecOutcome> r = run_on_device(job, cb, cancel);
    after_.enter(tl_ticket);
    return r;
  }

 private:
  Result<serve::ExecOutcome> run_on_device(const serve::ExecJob& job, const serve::ExecCallbacks& cb,
                                           const std::atomic<bool>& cancel) {
    DeviceModel::Start s;
    s.path = path_;
    s.ticket = tl_ticket;
    s.t_ns = penv_.now_ns();
    if (!device_.start(s, penv_)) {
      return Status(StatusCode::kUnavailable, "the server process was killed", FailureReason::kShuttingDown);
    }
    if (!s.fault.ok() && s.after == 0) return s.fault;
    if (s.oom) {
      return Status(StatusCode::kResourceExhausted,
                    "simulated device out of memory: the plan, the running requests and the competing workload "
                    "exceed the device's capacity",
                    FailureReason::kDeviceOutOfMemory);
    }
    if (!s.fault.ok()) faults_->fail_after(s.after, s.fault);
    Result<serve::ExecOutcome> r = inner_.run(job, cb, cancel);
    device_.end(s);
    return r;
  }

  ProcessEnv& penv_;
  DeviceModel& device_;
  AfterRun& after_;
  const int path_;
  std::shared_ptr<FakeFaults> faults_;
  FakeExecutor inner_;
};

// The journal's observer until the process is killed: a dead process
// writes nothing.
class GatedObserver final : public serve::RequestObserver {
 public:
  GatedObserver(std::shared_ptr<serve::RequestObserver> inner, std::shared_ptr<std::atomic<bool>> alive)
      : inner_(std::move(inner)), alive_(std::move(alive)) {}
  void on_start(const serve::Ticket& t, const std::string& placement) override {
    if (alive_->load()) inner_->on_start(t, placement);
  }
  void on_finish(const serve::Ticket& t, const serve::RequestEvent& fin, const std::string& text) override {
    if (alive_->load()) inner_->on_finish(t, fin, text);
  }
  void on_failover(const serve::Ticket& t, const Status& failure) override {
    if (alive_->load()) inner_->on_failover(t, failure);
  }
  void on_checkpoint(const serve::Ticket& t, const Checkpoint& cp) override {
    if (alive_->load()) inner_->on_checkpoint(t, cp);
  }

 private:
  std::shared_ptr<serve::RequestObserver> inner_;
  std::shared_ptr<std::atomic<bool>> alive_;
};

// The path's observer, then AfterRun::leave for the ticket (see AfterRun).
class TrackingObserver final : public serve::RequestObserver {
 public:
  TrackingObserver(std::shared_ptr<serve::RequestObserver> inner, AfterRun& after)
      : inner_(std::move(inner)), after_(after) {}
  void on_start(const serve::Ticket& t, const std::string& placement) override {
    if (inner_) inner_->on_start(t, placement);
  }
  void on_finish(const serve::Ticket& t, const serve::RequestEvent& fin, const std::string& text) override {
    if (inner_) inner_->on_finish(t, fin, text);
    after_.leave(t.id());
  }
  void on_failover(const serve::Ticket& t, const Status& failure) override {
    if (inner_) inner_->on_failover(t, failure);
    after_.leave(t.id());
  }
  void on_checkpoint(const serve::Ticket& t, const Checkpoint& cp) override {
    if (inner_) inner_->on_checkpoint(t, cp);
  }

 private:
  std::shared_ptr<serve::RequestObserver> inner_;
  AfterRun& after_;
};

// ---- The run -------------------------------------------------------------

struct Device {
  uint64_t capacity = 0, weights = 0, pool = 0, run_bytes = 0;
};

// One server process: its gateway, ledgers and breaker.
struct Process {
  std::unique_ptr<ProcessEnv> penv;
  AfterRun after;
  std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
  std::shared_ptr<admission::MemoryLedger> gpu_ledger, host_ledger;
  std::unique_ptr<gateway::Gateway> gw;
  std::shared_ptr<gateway::ModelResidency> residency;  // the catalogue's (null: one model)
  // The server's own request lifecycle over this process's gateway and the
  // journal (destroyed before the gateway it refers to).
  std::unique_ptr<gateway::RequestService> service;
  uint64_t lease = 0;  // the declared co-tenant's reservation (0: none)
};

// A client's request and whatever continues it (resume, retry).
struct Chain {
  int client = 0;
  size_t cls = 0;
  std::string phase;
  std::string prompt, body, key, prompt_key;
  std::string model;  // RequestClass::model: a catalogue model's name ("": the served model)
  bool stream = true, greedy = true;
  uint64_t seed = 0;
  int32_t max_tokens = 0;
  bool retry = false;  // send again with the key once it ended
  int64_t first_op = 0;
  int64_t record_id = 0;
  int64_t public_id = 0;  // the id its response carried (what a resume names)
  std::string have;       // text the client holds
  int resumes = 0;        // resume calls made
  int retries = 0;        // retries refused because the server was down
};

struct Active {
  Chain* chain = nullptr;
  Op inv;
  std::shared_ptr<serve::Ticket> ticket;
  int64_t invoke_ns = 0;
  int64_t first_text_ns = -1;
  std::string text;    // streamed text of this operation
  std::string unsent;  // a resume's checkpoint text the client lacked
  // What poll() saw last: a ticket gets events only with a new token or its
  // end, so an unchanged pair means nothing to read (and an empty
  // next_event still costs a timed wait).
  int32_t seen_generated = -1;
  int seen_state = -1;
  size_t text_base = 0;  // ticket->text() before its first event (a resume's)
};

// The history's name for a gateway event (history.h's event kinds): a
// breaker's transition by its new state, a probe's result as "breaker" (the
// breaker's own line), equivalence checks, and the rest as "gateway".
inline std::string event_kind(const gateway::GatewayEvent& e) {
  switch (e.kind) {
    case gateway::GatewayEventKind::kBreakerTransition:
      if (!e.state) return "breaker";
      return "breaker_" + std::string(gateway::breaker_state_name(*e.state));
    case gateway::GatewayEventKind::kProbe:
      return "breaker";
    case gateway::GatewayEventKind::kEquivalence:
      return "equivalence";
    case gateway::GatewayEventKind::kHealthCheck:
    case gateway::GatewayEventKind::kDevice:
      return "gateway";
  }
  return "gateway";
}

class Simulation {
 public:
  Simulation(const Scenario& sc, const SimOptions& o, gateway::GatewayOptions server, Device dev,
             std::shared_ptr<const Tokenizer> tok, std::string journal_path)
      : sc_(sc),
        opt_(o),
        server_(std::move(server)),
        dev_(dev),
        tok_(std::move(tok)),
        journal_path_(std::move(journal_path)),
        env_(SimEnvOptions{1'000'000'000, 1'700'000'000'000, o.seed}),
        device_(dev.capacity, dev.weights + dev.pool, dev.run_bytes),
        rng_(o.seed * 0x9E3779B97F4A7C15ull + 0x5bd1e995ull) {
    const std::string& m = sc_.server.model;
    const size_t slash = m.find_last_of('/');
    model_name_ = m.substr(slash == std::string::npos ? 0 : slash + 1);
    if (model_name_.size() > 5 && model_name_.substr(model_name_.size() - 5) == ".gguf") {
      model_name_.resize(model_name_.size() - 5);
    }
  }

  ~Simulation() {
    if (proc_) stop_process(/*drive_clock=*/true);
  }

  Result<History> run();

 private:
  // Setup.
  Status start_process();
  void stop_process(bool drive_clock);
  Status verify();
  // Quiescence and time.
  bool settle();
  struct Picture {
    std::vector<std::array<int64_t, 3>> paths;
    int running = 0;
    bool startable = false;
    bool prober_parked = true;
    bool prober_on_clock = false;
    bool operator==(const Picture&) const = default;
  };
  Picture picture() const;
  double ms(int64_t t_ns) const { return static_cast<double>(t_ns - t0_) / 1e6; }
  void at(int64_t t_ns, std::function<void()> f) { actions_.emplace(std::make_pair(t_ns, seq_++), std::move(f)); }
  // Workload.
  void schedule_workload();
  void arrive(size_t cls, const std::string& phase, bool greedy, uint64_t seed, bool keyed, bool retry);
  void send(Chain* c, const std::string& f);
  void resume(Chain* c);
  // Completes `inv` as refused on the spot (no time spent in the server):
  // `res` with the failure's status, code and message, at the clock's now.
  void complete_refused(const Op& inv, Op res, int http_status, const std::string& code, const std::string& message);
  Status add_catalogue_paths(Process& p, const std::shared_ptr<serve::RequestObserver>& journal_obs,
                             const std::shared_ptr<gateway::CircuitBreaker>& breaker,
                             std::vector<gateway::ExecutionPath>& paths);
  static serve::GenerationRequest generation_of(const Chain& c);
  void after_end(Chain* c);
  void finish_chain(Chain* c);
  void poll();
  void complete(Active& a, const serve::RequestEvent& fin);
  void fill_route(Op& op, const serve::Ticket& t) const;
  Op request_op(const Chain& c, const std::string& f) const;
  void note_decision(int64_t record_id, const admission::Decision& d);
  Result<gateway::StoredRequest> stored_request(const journal::Record& r) const;
  // Nemesis and the competing workload.
  void set_phase(const Phase& p);
  void declare(uint64_t bytes);
  void fault(const FaultSpec& f, const std::string& phase);
  void cancel_queued(const std::string& phase);
  void kill(const FaultSpec& f);
  void restart();
  void sample();
  void flush_log();
  void event(const std::string& kind, const std::string& detail) { rec_.add_event({ms(env_.now_ns()), kind, detail}); }

  const Scenario& sc_;
  const SimOptions& opt_;
  const gateway::GatewayOptions server_;  // ctx resolved (server_options)
  const Device dev_;
  std::shared_ptr<const Tokenizer> tok_;
  const std::string journal_path_;
  std::string model_name_;

  mutable SimEnv env_;  // declared before everything that runs on it (now_ns() is not const)
  DeviceModel device_;
  std::mt19937_64 rng_;
  std::shared_ptr<journal::Journal> journal_;
  std::unique_ptr<Process> proc_;
  HistoryRecorder rec_;
  int64_t t0_ = 0, end_ns_ = 0;
  uint64_t seq_ = 0;
  std::map<std::pair<int64_t, uint64_t>, std::function<void()>> actions_;
  std::vector<std::unique_ptr<Chain>> chains_;
  std::map<int64_t, Active> active_;           // by invoke op id
  std::map<std::string, std::set<int>> busy_;  // class name -> client slots in use
  uint64_t declared_ = 0, undeclared_ = 0;
  std::set<int64_t> given_ids_;
  std::map<int64_t, bool> under_reserve_;  // record id -> every gpu-side decision under the line
  std::mutex log_mu_;
  // The gateway's events: (time, text, the history's event kind); sorted by
  // time then text when flushed.
  std::vector<std::tuple<int64_t, std::string, std::string>> log_;
  uint64_t nemesis_ids_ = 0;
  bool error_ = false;
  std::string error_msg_;
  // A restarted server's start-up equivalence check, running on its own
  // thread while the clock moves its runs; clients are refused until then.
  std::future<std::vector<gateway::EquivalenceInfo>> starting_;
  std::shared_ptr<std::atomic<bool>> starting_done_;
  bool serving_ = false;
};

}  // namespace spw::drill::sim_detail
