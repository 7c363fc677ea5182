// The drill's simulation: see simulation.h for the contract.
#include "drill/simulation.h"

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

#include "admission/controller.h"
#include "admission/ledger.h"
#include "core/failure.h"
#include "core/sim_env.h"
#include "core/size.h"
#include "engine/checkpoint.h"
#include "gateway/breaker.h"
#include "gateway/composition.h"
#include "gateway/gateway.h"
#include "gateway/request_service.h"
#include "gguf/gguf.h"
#include "http/spillway_api.h"
#include "journal/journal.h"
#include "serve/journal_observer.h"
#include "serve/scheduler.h"
#include "serve/testing/fake_executor.h"
#include "tokenizer/tokenizer.h"

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

namespace {

using namespace std::chrono_literals;
using serve::testing::FakeExecutor;
using serve::testing::FakeFaults;
using serve::testing::FakeSpeed;

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024ull * kMiB;
// Real-time bound on one quiescence wait: a correct run never comes near it;
// it turns a stuck worker into an error instead of a hang.
constexpr std::chrono::milliseconds kRealTimeout = 10s;
constexpr const char* kFingerprint = "fake-model";
constexpr int kMaxResumes = 8;
// Ticket ids of requests the nemesis queues on the cpu path itself (beyond
// any the gateway numbers in one run).
constexpr uint64_t kNemesisIds = 1ull << 48;

int64_t to_ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

// ---- Sizes and server flags -------------------------------------------

// core/size.h's reading, as scenario.cpp and --device-memory take sizes; the
// error names the scenario field.
Result<uint64_t> parse_size(std::string_view text, const std::string& what) {
  Result<uint64_t> r = parse_byte_size(text);
  if (!r.ok()) return invalid_field(what, what + ": " + r.status().message());
  return r;
}

// The simulated server's options: SimOptions::server (the scenario's
// server.args as `spillway serve` parses them), ctx 0 (the model's
// context_length) as the simulated model's, kSimContext. Checked as
// build_gateway checks them, plus what the simulation needs (a queue on each
// path, a context of at least one block, a headroom share below 1).
Result<gateway::GatewayOptions> server_options(const Scenario& sc, const SimOptions& o) {
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

Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& path) {
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

std::string json_escape(const std::string& s) {
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

// A worker's engine: the device decides first (armed fault, out of memory),
// then a FakeExecutor with its own FakeFaults runs it on the process's clock.
class SimExecutor final : public serve::Executor {
 public:
  SimExecutor(ProcessEnv& penv, DeviceModel& device, AfterRun& after, int path, FakeSpeed speed)
      : penv_(penv),
        device_(device),
        after_(after),
        path_(path),
        faults_(std::make_shared<FakeFaults>()),
        inner_(penv, speed, faults_, kFingerprint) {}

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
std::string event_kind(const gateway::GatewayEvent& e) {
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
  gateway::GatewayPolicy gp = gateway::gateway_policy(server_);
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
  c->retry = retry;
  c->prompt_key = rc.name + (greedy ? "/greedy" : "/seed=" + std::to_string(c->seed));
  if (keyed) c->key = "drill-" + std::to_string(opt_.seed) + "-" + std::to_string(chains_.size() + 1);
  c->body = "{\"prompt\":\"" + json_escape(c->prompt) + "\",\"max_tokens\":" + std::to_string(c->max_tokens) +
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
  op.placement = op.path == "gpu" ? "vulkan" : op.path;
  op.model = model_name_;
  const admission::Decision d = t.decision();
  op.decision = std::string(admission::decision_kind_name(d.kind));
  op.reason = d.reason;
  op.degraded = op.path != "gpu";
  // What the spillway object shows: degraded = the decision's.
  op.degraded_shown = op.degraded && d.degraded();
  op.failovers = t.attempts() - t.migrations();
  op.migrations = t.migrations();
}

// The checker's over-reserve figure: whether every decision that placed the
// request on the gpu path kept it under its reserve.
void Simulation::note_decision(int64_t record_id, const admission::Decision& d) {
  if (d.path_index != 0) return;
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
    out.seed_given = true;
    out.max_tokens_requested = c->max_tokens;
    return out;
  }
  return Status::not_found("no client sent request " + std::to_string(r.id));
}

// A request through the server's own RequestService (idempotency, precheck,
// journal, decision, refusal), as the HTTP layer hands it over.
void Simulation::send(Chain* c, const std::string& f) {
  Op inv = rec_.invoke(request_op(*c, f));
  if (f == "complete") c->first_op = inv.op_id;
  Op res = inv;
  res.t_ms = inv.t_ms;
  auto fail_now = [&](int http, const std::string& code, const std::string& msg) {
    res.t_ms = ms(env_.now_ns());
    res.type = OpType::kFail;
    res.http_status = http;
    res.error_code = code;
    res.error_message = msg;
    res.latency_ms = 0;
    rec_.complete(inv, res);
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
    // As the server's replay says: the path it ran on (by its placement).
    for (const gateway::ExecutionPath& p : proc_->gw->paths()) {
      if (p.placement == res.placement) res.path = p.name;
    }
    res.model = model_name_;
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
    res.t_ms = ms(env_.now_ns());
    res.type = OpType::kFail;
    res.http_status = http;
    res.error_code = code;
    res.error_message = msg;
    res.latency_ms = 0;
    rec_.complete(inv, res);
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
    res.finish_reason = std::string(serve::finish_reason_name(fin.finish));
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

}  // namespace

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
