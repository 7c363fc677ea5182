// Gateway: a server's execution paths behind one per-request router.
//
// Contract: a Gateway owns one or more execution paths (each an ExecutionPath:
// a Scheduler = its own bounded queue and workers, plus its placement, model,
// context limit, KV budget, memory ledger and replica mode), the memory
// ledgers, the co-tenants' reservations and the admission policy. Paths are
// in preference order: the first is the first-choice path.
//   submit()  tokenizes the prompt once, refreshes the ledgers' observed usage
//             when it is older than policy.observe_interval_s, expires lapsed
//             reservations, takes admission::decide() over every path's
//             snapshot and submits to the chosen path; a path whose queue
//             filled in between is retried with the next decision. Returns the
//             Ticket (which carries its Decision), or the refusal Status with
//             its typed reason (kQueueFull -> 429, kNoPath /
//             kHostMemoryExhausted -> 503, kInvalidField / kContextFull ->
//             400) and the Decision it was refused under (for Retry-After and
//             the journal). Nothing touches a device before the decision.
//   failover  a request that fails on a path with a device fault before its
//             first token or text (serve::Scheduler::set_failover) is decided
//             again without that path and adopted by the chosen one under the
//             same ticket, id and stream (nothing was streamed, so nothing
//             repeats); its decision's reason starts "failover from <path>
//             after <failure>", status counts it as kFailover, and the
//             device fault reaches the breaker. With no other path able to
//             take it now, it fails with its own error.
//   quote()   the same decision without submitting, plus each path's own
//             predicted start delay, time to first token and decode rate.
//   cancel()  by ticket id, on whichever path holds it: queued requests end at
//             once (their KV gate blocks and reservations are released before
//             cancel returns), running ones at their next token boundary.
//   reserve_cotenant() declares another process's memory on a ledger (the GPU
//             ledger when there is one): accepted even when it leaves Spillway
//             no room on that ledger (`fits` says so) and counted by the next
//             decision; renew() extends its lease, release() ends it, and a
//             lease not renewed within its ttl is released by the next call
//             that refreshes (submit, quote, status, reservations()).
//             Reservations belong to the caller that made them
//             (ReservationCaller::owner, the API key's owner): another owner
//             gets NotFound from renew()/release() and does not see them in
//             reservations(); the admin sees and may end every one. Refused
//             (nothing declared): a size outside core/size.h's domain
//             (InvalidArgument); an owner's kMaxReservationsPerOwner-th+1 or
//             the gateway's kMaxReservations-th+1 live lease
//             (ResourceExhausted); and, unless policy.reservation_max_share is
//             1 (the operator's leave for co-tenants to take everything),
//             FailedPrecondition naming the figures when the leases on the
//             ledger would hold more than that share of its limit, or when
//             the smallest request (one prompt token, one generated) of some
//             model that some path admits now would be admitted by none
//             after it: a client's declaration never takes a model's last
//             path away (a CPU-only server's host ledger, say).
//   status()  paths (each with its breaker's snapshot), ledgers,
//             reservations and decision counters.
// Circuit breakers (gateway/breaker.h): a path may carry its device's breaker
// (the GPU and hybrid paths share one; the CPU path has none). Outcomes reach
// it through the path's observer (BreakerObserver, set up by the builder).
// While it is open or half-open every path on that device is unusable to
// admission, with the reason "gpu_unavailable: circuit breaker open since ...
// after <trip reason>; next probe in N s", so decide() redirects (the reason
// is in the Decision, hence in every response) or, with no other path,
// refuses with 503 kNoPath (no new FailureReason: the refusal means "no path
// can serve it now", which kNoPath already says, resumable; the breaker's
// reason is in the message). ready() counts only paths whose breaker is
// closed.
// Probing: a prober thread (started when some path has a breaker, stopped
// and joined by shutdown) waits on the Env's clock for a breaker's next probe
// time; when it is half-open it runs policy.probe_prompt (greedy,
// probe_tokens) on the breaker's first path as an internal request (not
// journaled, not tracked, not counted as a decision, never sent to a client),
// one probe at a time, and reports each result to the breaker. A probe passes
// when it generates and, where the CPU path serves the same model (not a
// --fallback-model of another name, whose text is expected to differ: then
// success alone counts), when its text equals that path's text for the same
// prompt (run once, also as an internal request, and cached). A probe enters
// the path's queue like any request, but only while the breaker keeps every
// client off that path, so it never takes a slot a client could have had; a
// full queue, or a reference that cannot run, postpones it by
// probe_retry_s without counting. A probe that does not end within
// probe_timeout_s is cancelled and fails (kTimeout).
// Recovery: a path may carry its device's DeviceControl (device_control.h;
// shared like the breaker). When the prober finds a breaker half-open, before
// the episode's first probe it calls the device's recover(): an unhealthy
// backend is re-initialised there (timed; shown in status), and the paths'
// session groups re-open themselves on their next run, which is the probe
// (serve/engine_executor.h). A failed re-initialisation fails the episode's
// probe (-> open again, with the grown cooldown).
// Health prober: a thread of its own (started when some path's device has a
// health check and policy.health_interval_s > 0; stopped and joined by
// shutdown) runs each device's health_check() every health_interval_s while
// its breaker is closed (an open breaker already keeps clients off it, and
// recovery has its own probes), each on a helper thread that it waits for at
// most health_timeout_s on the Env's clock: a failed check, or one that did not
// answer in time (kTimeout; a check still running at the next round counts
// again, and no second one is started), is breaker->record_health_failure().
// All times come from the injected Env, so a SimEnv drives leases, refresh,
// ETAs, breakers, the prober and the health prober deterministically.
// Thread safety: every public method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission/controller.h"
#include "admission/ledger.h"
#include "admission/prior.h"
#include "core/env.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "engine/step_batcher.h"
#include "gateway/breaker.h"
#include "gateway/device_control.h"
#include "gateway/residency.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace spw::gateway {

// How a path's model is held in host memory, and what making the path ready
// from there costs (see builder.h for how the mode is chosen).
struct ReplicaInfo {
  // shared: the first path's mapping of the same file (resident for it);
  // warm: its own mapping, every page read in at start; mmap: mapped at
  // start, pages read in by the first request; on-demand: nothing mapped
  // until the first request loads it.
  std::string mode = "shared";
  std::string why;           // the choice and the figures behind it
  double load_ms = -1;       // measured at start: map, parse, bind (-1: not measured)
  double page_in_ms = -1;    // measured at start: read every page of the file
  double recovery_ms = 0;    // predicted: from the first request to running on it
  bool loaded = true;        // false: on-demand and not loaded yet
  double loaded_in_ms = -1;  // on-demand: how long its load took when it came
};

// A path's replica as it changes (an on-demand load completes on a worker).
class Replica {
 public:
  explicit Replica(ReplicaInfo info) : info_(std::move(info)) {}
  ReplicaInfo info() const {
    std::lock_guard<std::mutex> lk(mu_);
    return info_;
  }
  void mark_loaded(double ms) {
    std::lock_guard<std::mutex> lk(mu_);
    info_.loaded = true;
    info_.loaded_in_ms = ms;
  }
  // An on-demand replica given back after a temporary load (the
  // equivalence check at start): not loaded again, its measured load time
  // kept.
  void mark_unloaded() {
    std::lock_guard<std::mutex> lk(mu_);
    info_.loaded = false;
  }
  // The predicted time of its next load (a catalogue model's last measured
  // load: gateway/residency.h).
  void set_recovery_ms(double ms) {
    std::lock_guard<std::mutex> lk(mu_);
    info_.recovery_ms = ms;
  }
  // Seconds before the path can start any work (admission's startup_s).
  double startup_s() const {
    std::lock_guard<std::mutex> lk(mu_);
    return info_.loaded ? 0.0 : info_.recovery_ms / 1e3;
  }

 private:
  mutable std::mutex mu_;
  ReplicaInfo info_;
};

struct ExecutionPath {
  std::string name;       // "gpu", "hybrid", "cpu"
  std::string placement;  // "vulkan", "hybrid:2", "cpu"
  std::string model;      // model name served on this path
  bool fallback_model = false;
  admission::PathRole role = admission::PathRole::kPrimary;
  std::shared_ptr<Replica> replica = std::make_shared<Replica>(ReplicaInfo{});
  double startup_ms = 0;  // measured at start: build + warm-up
  // The rates the path started from before any request finished on it
  // (admission/prior.h): from the measured bandwidth of its memory and the
  // bytes a decode step streams. computed false: the scheduler's default.
  admission::RatePrior prior;
  std::unique_ptr<serve::Scheduler> scheduler;
  std::shared_ptr<const Tokenizer> tokenizer;
  // The ledger of the memory this path's plan lives in (null: none).
  std::shared_ptr<admission::MemoryLedger> ledger;
  // The circuit breaker of the device this path runs on (null: none, as for
  // the CPU path). Paths on one device share one.
  std::shared_ptr<CircuitBreaker> breaker;
  // What can be done to that device besides running work (health checks,
  // re-initialisation, armed faults); null: nothing (the CPU path). Paths on
  // one device share one.
  std::shared_ptr<DeviceControl> device;
  // A path without a device (the CPU path): the slow faults of its cores,
  // armed through the admin API as a device's are (CpuBackend::set_faults);
  // null on paths with a device, whose injector is device->faults().
  std::shared_ptr<FaultInjector> cpu_faults;
  // The injector the admin API arms for this path: the device's, else the
  // cores'; null: none.
  FaultInjector* faults() const { return device ? device->faults() : cpu_faults.get(); }
  // The compatibility fingerprint of the model it serves (Model::
  // fingerprint(): file identity, every metadata key including the chat
  // template, tokenizer and tensor types; a checkpoint carries its model's).
  // Empty: unknown, never migrated to or from.
  std::string fingerprint;
  // The CPU kernel variant its host-side compute runs (backend/cpu/
  // kernel_variant.h: "x86-64-v3"); "" when not known (a path built by
  // hand). Variants round differently, so it is part of the path's numerics.
  std::string cpu_kernels;
  // What the path computes with: its placement and kernel variant. Two paths
  // of one fingerprint and equal numerics give the same bits by their
  // backend's contract; otherwise migration between them waits for their
  // equivalence check (verify_equivalence).
  std::string numerics() const { return cpu_kernels.empty() ? placement : placement + "/" + cpu_kernels; }
  // How its model pools embeddings (LlamaHparams::pooling; kNone: it serves
  // no /v1/embeddings).
  Pooling pooling = Pooling::kNone;
  int32_t embedding_dims = 0;  // its model's n_embd: the width of its embeddings
  // The element type of its KV cache ("f16", "f32", "q8_0"; `--kv-type`):
  // for status. "" when not known (a path built by hand).
  std::string kv_type;
  // The workers' step batcher (continuous batching); null: each worker
  // passes over the weights alone. For status only.
  std::shared_ptr<StepBatcher> batcher;
  // An on-demand replica's unload (its weights and sessions given back
  // when no worker is using them; false: in use, kept); null for the other
  // modes. verify_equivalence loads such a replica to check it, then calls
  // this, so the mode still costs nothing until a request needs it.
  std::function<bool()> unload;
};

// A path that could not be built at start, and why (shown in status).
struct PathNotBuilt {
  std::string name;
  std::string reason;
};

// How requests overflow when the first path cannot take them. kPlanned is
// Spillway. The other two exist as baselines for the drill (what the plan
// buys, in the same figures), never as a recommendation:
//   kNone   every request goes to the first path whatever its memory says;
//           no redirect, no failover, no migration: a device fault is the
//           request's end (with its own error); an open breaker is 503.
//   kNaive  admission checks a free-memory reading only: the ledger's
//           capacity without headroom against our reservations plus observed
//           use by others; co-tenants' declarations are not seen. Redirect,
//           failover and migration work as planned.
// Either way a Decision's pressure is the true (planned) figure of the path
// it chose, so a record shows what the request was admitted under.
enum class Overflow { kPlanned, kNone, kNaive };
std::string_view overflow_name(Overflow o);  // "planned", "none", "naive"
// Where a path's current rates come from: "measured" (a request finished on
// it), "prior" (its RatePrior, computed) or "default" (neither).
std::string_view rates_source(const admission::PathRates& rates, const admission::RatePrior& prior);
Result<Overflow> parse_overflow(std::string_view name);

// Whether a request may move between two paths mid-generation: both serve
// one fingerprint and their runs of the same requests gave the same text.
struct EquivalenceInfo {
  std::string a, b;  // path names
  std::string placement_a, placement_b;  // ExecutionPath::numerics(): "cpu/x86-64-v3"
  std::string fingerprint;
  bool passed = false;
  std::string detail;  // what was compared, or the first difference
  double ms = 0;       // how long the check took
  // Where the verdict comes from: "checked" (run by this process) or
  // "stored" (kept by an earlier run with the same model, placements,
  // devices and binary: GatewayPolicy::equivalence_store).
  std::string source = "checked";
  int64_t checked_ms = 0;  // when it was run (the Env's wall clock)
};

// Where equivalence verdicts outlive the process (the journal database, in
// `serve`). `scope` joins the key: whatever besides the model's fingerprint
// and the placements decides the outcome (the devices' names and drivers,
// the binary), so a verdict is reused only where it still holds.
struct EquivalenceStore {
  std::string scope;
  std::function<std::optional<EquivalenceInfo>(const std::string& key)> load;  // nullopt: none kept
  std::function<void(const std::string& key, const EquivalenceInfo& info)> save;
};

// What the gateway reports on its own (not per request), typed so that a
// composition can count or plot it without reading its text: the server logs
// `text`; the drill's simulation records events by kind.
enum class GatewayEventKind {
  kBreakerTransition,  // `state` is the device breaker's new state
  kProbe,              // a breaker probe passed, failed or was postponed
  kEquivalence,        // an equivalence check between two paths finished
  kHealthCheck,        // a device health check failed
  kDevice,             // a device re-initialisation (done or failed)
};
struct GatewayEvent {
  GatewayEventKind kind = GatewayEventKind::kDevice;
  std::string device;                 // the breaker's / device's name ("" for kEquivalence)
  std::optional<BreakerState> state;  // kBreakerTransition only
  std::string text;                   // one line for people, as `log` gets it
};

// The host CPU and the kernel variant chosen for it
// (backend/cpu/kernel_variant.h), for status; filled by the builder.
struct HostCpuInfo {
  std::string brand;                  // "AMD EPYC 7B13"; "" when CPUID has none
  std::vector<std::string> features;  // the extensions it has and the OS enabled
  std::string kernels;                // the variant the CPU kernels run: "x86-64-v3"
  std::string kernels_isa;            // the extensions that variant uses: "avx2 fma f16c"
  std::vector<std::string> built;     // the variants in this binary, best first
};

struct GatewayPolicy {
  HostCpuInfo host_cpu;  // reported in status as is
  admission::AdmissionPolicy admission;
  Overflow overflow = Overflow::kPlanned;
  double observe_interval_s = 1.0;  // re-read observed memory at most this often
  // Called (under no gateway lock) to re-read observed usage into the ledgers.
  std::function<void()> observe;
  // Breaker probes (see the contract): the prompt, greedy, and its tokens.
  std::string probe_prompt = "Once upon a time";
  int32_t probe_tokens = 8;
  double probe_timeout_s = 30;  // a probe not done by then fails (kTimeout)
  double probe_retry_s = 1;     // a probe that could not run now tries again after this
  // Health prober (see the contract): every this often per device (0: off),
  // a check not answered within health_timeout_s fails (kTimeout).
  double health_interval_s = 5;
  double health_timeout_s = 10;
  // Every GatewayEvent, as its text (log) and typed (on_event); either may be
  // null. Called on the thread that saw the event, under no gateway lock.
  std::function<void(const std::string&)> log;
  std::function<void(const GatewayEvent&)> on_event;
  // Equivalence check between paths of one fingerprint (verify_equivalence):
  // each prompt greedy and seeded (temperature, seed), tokens each.
  std::vector<std::string> equivalence_prompts = {"Once upon a time", "The little dog"};
  int32_t equivalence_tokens = 16;
  float equivalence_temperature = 0.8f;
  uint64_t equivalence_seed = 42;
  double equivalence_timeout_s = 120;  // per run, on the Env's clock
  // Verdicts kept across restarts (null functions: none).
  EquivalenceStore equivalence_store;
  // The catalogue's models beyond the first (gateway/residency.h): which are
  // resident, loads and evictions; null: the server has one model. Paths
  // serving a model it manages are eligible only for requests naming that
  // model; a path whose model is not resident is priced with its load (its
  // plan's bytes against the ledger, less what evictable models hold; its
  // replica's predicted load time and the wait for room before its start).
  std::shared_ptr<ModelResidency> residency;
  // Co-tenant leases (reserve_cotenant) on a ledger hold at most this share
  // of its limit; 1 lets them take it all, the last path of a model
  // included (the drill's co-tenant, which stands for real memory).
  double reservation_max_share = 0.8;
};

// Who asks about co-tenant reservations: the API key's owner ("" when the
// server has no keys) and whether it is the admin (sees every lease).
struct ReservationCaller {
  std::string owner;
  bool admin = false;
};
inline constexpr size_t kMaxReservationsPerOwner = 32;
inline constexpr size_t kMaxReservations = 1024;  // bounds the gateway's memory, not the bytes

// What the HTTP layer asks for, after parsing.
struct RouteRequest {
  serve::GenerationRequest generation;  // prompt text, sampler, max_tokens, stop, record_id
  bool allow_shrink = false;
  bool allow_migration = true;  // false: X-Spillway-Migrate: never
  // The model the client named, when it named one model of several: only
  // paths serving it are eligible (the others' verdicts say which model they
  // serve). Empty: the service's model, on whichever path the plan chooses
  // (a fallback model included, marked as such). The server resolves ids and
  // aliases (http/models.h) before it gets here.
  std::string model;
  // Ollama's keep_alive for a catalogue model (GatewayPolicy::residency):
  // seconds it stays resident after this request (< 0: until evicted for
  // room; 0: given back when idle); none: the model's own.
  std::optional<double> keep_alive_s;
};

struct Admitted {
  std::shared_ptr<serve::Ticket> ticket;
  const ExecutionPath* path = nullptr;
};

// A resume of an interrupted request (POST /v1/requests/{id}/resume).
struct ResumeRequest {
  int64_t record_id = 0;
  std::shared_ptr<const Checkpoint> checkpoint;
  // The text the client says it has; it must agree with the checkpoint's
  // text as far as both go (kReplayMismatch otherwise).
  std::string received_text;
  bool allow_migration = true;
  std::optional<int32_t> max_tokens_requested;  // what the original request asked
  SafePointRules safe_points;                   // the original request's own spans
};

struct Resumed {
  Admitted admitted;
  // Checkpoint text the client does not have yet: the response sends it
  // before the ticket's stream.
  std::string unsent;
};

struct Refusal {
  Status status;
  admission::Decision decision;  // kReject with http status and Retry-After; empty for 400s
};

// Where a queued request stands now.
struct Progress {
  int32_t queue_position = 0;    // 1-based; 0 when not queued
  double estimated_delay_s = 0;  // until it starts, from the path's rates
};

struct PathQuote {
  std::string path;
  std::string placement;
  std::string model;
  bool eligible = false;
  std::string reason;
  admission::Timing timing;
  double decode_tps = 0;
  double prefill_tps = 0;
  bool rates_measured = false;  // false: the path's prior (ExecutionPath::prior)
  // "measured" (finished requests on the path), "prior" (the rate prior:
  // bandwidth / bytes streamed) or "default" (no prior could be computed).
  std::string rates_source;
};

struct Quote {
  admission::Decision decision;
  std::string placement;  // of the chosen path ("" on reject)
  std::string model;
  bool fallback_model = false;
  std::vector<PathQuote> paths;
};

struct ReservationInfo {
  uint64_t id = 0;
  std::string owner;  // ReservationCaller::owner of its maker (not rendered to clients)
  std::string name;
  std::string ledger;
  uint64_t bytes = 0;
  double ttl_s = 0;
  double expires_in_s = 0;
  bool fits = true;  // Spillway still has room under its safe limit
  admission::LedgerSnapshot after;
};

struct PathStatus {
  std::string name, placement, model;
  std::string fingerprint;  // ExecutionPath::fingerprint
  bool fallback_model = false;
  std::string role;
  ReplicaInfo replica;
  double startup_ms = 0;
  int32_t workers = 0, running = 0, queue_depth = 0, queue_capacity = 0, n_ctx = 0;
  double oldest_queued_s = 0;
  int32_t kv_block_tokens = 0, kv_blocks_total = 0, kv_blocks_free = 0;
  std::string kv_type;                       // ExecutionPath::kv_type
  std::string cpu_kernels;                   // ExecutionPath::cpu_kernels
  admission::PathRates rates;                // what quotes use now (rates.measured: from finished requests)
  admission::RatePrior prior;                // ExecutionPath::prior
  serve::SchedulerStats stats;               // probes included
  std::optional<BreakerSnapshot> breaker;    // the path's device breaker; none on the CPU path
  std::optional<DeviceStatus> device;        // its device's health and recovery; none on the CPU path
  std::optional<StepBatcherStats> batching;  // none: not batched (one worker or --no-batching)
};

// The kinds status counts decisions by: the controller's six, and the
// gateway's own re-decisions: kFailover (decided again without the faulted
// path, before the first token) and kMigrate (moved at a checkpoint).
enum class DecisionCounter : uint8_t { kAdmit, kDelay, kShrink, kOffload, kRedirect, kReject, kFailover, kMigrate };
inline constexpr size_t kNumDecisionCounters = 8;
// "admit", "delay", "shrink", "offload", "redirect", "reject" (as
// admission::decision_kind_name), "failover", "migrate".
std::string_view decision_counter_name(DecisionCounter c);
DecisionCounter decision_counter(admission::DecisionKind k);

// One decision as status shows it (the most recent first).
struct RecentDecision {
  int64_t wall_ms = 0;  // when (the Env's wall clock)
  DecisionCounter kind = DecisionCounter::kAdmit;
  std::string path;     // where it sent the request ("" for a reject)
  std::string reason;
  bool degraded = false;
};

struct GatewayStatus {
  std::vector<PathStatus> paths;
  std::vector<PathNotBuilt> not_built;
  std::vector<admission::LedgerSnapshot> ledgers;
  std::vector<ReservationInfo> reservations;
  std::array<uint64_t, kNumDecisionCounters> decisions{};  // by DecisionCounter
  std::vector<RecentDecision> recent_decisions;  // the last kRecentDecisions, newest first
  bool ready = false;                            // some path can take work
  std::vector<EquivalenceInfo> equivalence;      // the checks done so far
  std::string overflow = "planned";              // overflow_name(policy.overflow): a baseline says so
  std::vector<ResidentModelInfo> models;         // the catalogue's managed models (none: one model)
  HostCpuInfo host_cpu;                          // GatewayPolicy::host_cpu

  uint64_t decided(DecisionCounter c) const { return decisions[static_cast<size_t>(c)]; }
};

class Gateway {
 public:
  // At least one path, each with a scheduler and a tokenizer; InvalidArgument
  // otherwise. Ledgers shared by several paths are listed once in status.
  static Result<std::unique_ptr<Gateway>> create(Env& env, std::vector<ExecutionPath> paths,
                                                 std::vector<PathNotBuilt> not_built, GatewayPolicy policy);
  ~Gateway();

  Result<Admitted> submit(const RouteRequest& request, Refusal* refusal = nullptr);
  // Continues an interrupted request from its checkpoint on whichever path
  // serves its model now (fingerprint equal; any placement), as a new ticket
  // under the same record id: the received text is checked against the
  // checkpoint's (FailedPrecondition kReplayMismatch naming the byte where
  // they differ), what the client lacks of the checkpoint's text is
  // returned as `unsent`, and what it holds beyond it is regenerated and
  // compared, not re-sent (ExecJob::replay). Refusals as submit (kNoPath
  // when no path serves the model).
  Result<Resumed> resume(const ResumeRequest& request, Refusal* refusal = nullptr);
  // The checkpoint a request has before its first token (engine's
  // start_checkpoint): its prompt tokenized as submit() does, its sampler,
  // stop rules and max_tokens (absent: the path's context less the prompt),
  // for `model` (RouteRequest::model: the first path serving it; "" the
  // first path's model). A request interrupted before it saved a checkpoint
  // (a crash during its prefill, or a catalogue model's load) resumes from
  // it. Errors: those of submit()'s validation and tokenization.
  Result<Checkpoint> start_checkpoint(const serve::GenerationRequest& request, const std::string& model = "");
  // Runs the equivalence check between every two paths that serve one
  // fingerprint on different placements and have not been checked yet
  // (results cached by fingerprint and placements for the Gateway's life),
  // as internal requests: each of policy.equivalence_prompts greedy and
  // seeded on both, side by side; equal text everywhere passes. Blocks
  // until done (each run bounded by equivalence_timeout_s); returns every
  // result so far. Paths on one placement are equivalent by the backend's
  // contract (bitwise batch invariance) and are not run. An on-demand
  // replica not loaded yet is loaded for the check and unloaded after it
  // (ExecutionPath::unload), so that it is a migration target like the
  // others. A verdict kept in policy.equivalence_store under the same key
  // and scope is taken instead of running the check; a check that ran to a
  // verdict (texts compared) is saved there. Paths of catalogue models
  // (GatewayPolicy::residency) are not run: that would load every one of
  // them at start; a verdict for the same fingerprint and numerics applies
  // to them all the same.
  std::vector<EquivalenceInfo> verify_equivalence();
  // May a request move from paths_[from] to paths_[to] mid-generation?
  // OK, or why not.
  Status migration_allowed(size_t from, size_t to) const;
  Result<Quote> quote(const RouteRequest& request);
  // What submit() would refuse without tokenizing, for a request whose prompt
  // text (after any chat template) is prompt_bytes long: no token of a
  // path's vocabulary stands for more input bytes than its stored text has
  // (SentencePiece's U+2581 and byte-level BPE's byte symbols are longer
  // than the bytes they stand for; control tokens are their text), so the
  // prompt has at least ceil(prompt_bytes / longest stored token) tokens.
  // decide() on that lower bound: a reject there is a reject for the real
  // prompt too (contexts, queues, breakers and host memory only get
  // tighter with more tokens), so it is returned as submit() would return
  // it (400 kContextFull, 429 kQueueFull with the decision's retry_after_s,
  // 503) and counted as a decision; OK otherwise, counting nothing. Costs
  // one decide(), whatever the prompt's size: a 10 MB prompt that cannot
  // fit is refused in microseconds instead of after its tokenization.
  Status precheck(const RouteRequest& request, size_t prompt_bytes, Refusal* refusal = nullptr);
  bool cancel(uint64_t ticket_id);
  // The live ticket with this id, or null.
  std::shared_ptr<serve::Ticket> find(uint64_t ticket_id) const;
  // The live ticket whose journal record id this is, or null.
  std::shared_ptr<serve::Ticket> find_by_record(int64_t record_id) const;
  // Every ticket queued or running now (internal requests included).
  std::vector<std::shared_ptr<serve::Ticket>> live() const;
  // Position of a queued ticket on its path and its current estimated delay.
  Progress progress(const serve::Ticket& ticket);

  Result<ReservationInfo> reserve_cotenant(const std::string& name, uint64_t bytes, double ttl_s,
                                           const ReservationCaller& who = {});
  Result<ReservationInfo> renew(uint64_t reservation_id, const ReservationCaller& who = {});
  Status release(uint64_t reservation_id, const ReservationCaller& who = {});
  // The caller's live leases (every lease for the admin), oldest first.
  std::vector<ReservationInfo> reservations(const ReservationCaller& who = {});

  GatewayStatus status();
  // The catalogue's managed models now (GatewayStatus::models alone).
  std::vector<ResidentModelInfo> models() const {
    return policy_.residency ? policy_.residency->list() : std::vector<ResidentModelInfo>{};
  }
  // Some path can take work: not shutting down, queue not full, breaker closed.
  bool ready() const;
  // Stops the prober (joined), then drains the paths side by side.
  void shutdown(std::chrono::milliseconds grace);

  // For tests under a SimEnv: whether the prober thread is parked (waiting
  // for a trip, a probe time or a probe's end, with nothing it has not seen
  // yet) and whether that wait is on the Env's clock (it then counts among
  // SimEnv::waiters()). Without a prober: parked, off the clock.
  struct ProberPark {
    bool parked = true;
    bool on_clock = false;
  };
  ProberPark prober_park() const;
  // Likewise for the health prober: parked = waiting on the clock for its
  // next round (not while a round runs). Without one: parked, off the clock.
  struct HealthPark {
    bool parked = true;
    bool on_clock = false;
  };
  HealthPark health_park() const;

  const std::vector<ExecutionPath>& paths() const { return paths_; }
  const ExecutionPath& primary() const { return paths_.front(); }
  const Tokenizer& tokenizer() const { return *paths_.front().tokenizer; }
  // The tokenizer of the paths serving `model` ("" or unknown: tokenizer()).
  const Tokenizer& tokenizer_for(const std::string& model) const;
  // Running + queued on every path.
  int32_t in_flight() const;

 private:
  Gateway(Env& env, std::vector<ExecutionPath> paths, std::vector<PathNotBuilt> not_built, GatewayPolicy policy);
  void refresh();  // observed usage + lease expiry, on the policy's schedule
  void expire_locked(int64_t now);
  // Validation, observed-memory refresh and tokenization: what submit and
  // quote both do before deciding.
  // An embeddings request (request.pooling): every input tokenized into
  // *embed_inputs, the longest returned.
  Result<std::vector<TokenId>> prepare(const serve::GenerationRequest& request, const std::string& model,
                                       std::vector<std::vector<TokenId>>* embed_inputs = nullptr);
  // Paths whose model does not pool `pooling` embeddings made unusable, saying so.
  void embeddings_only(std::vector<admission::PathSnapshot>& snaps, Pooling pooling) const;
  admission::PathSnapshot snapshot_of(const ExecutionPath& path) const;
  // A decision for a catalogue model that is not resident: its reason says
  // what the load will hold and evict (ModelResidency::plan's note).
  void note_load(admission::Decision& d) const;
  std::vector<admission::PathSnapshot> snapshots() const;
  // snapshots(), with the paths that do not serve `model` (when not empty:
  // RouteRequest::model) unusable, saying which model they serve.
  std::vector<admission::PathSnapshot> snapshots_for(const std::string& model) const;
  // submit()'s refusal Status for a reject decision.
  Status reject_status(const admission::Decision& d, const std::vector<admission::PathSnapshot>& snaps) const;
  admission::MemoryLedger* cotenant_ledger() const;
  ReservationInfo info_locked(uint64_t id, int64_t now) const;
  // Why declaring `bytes` more on `ledger` would leave some model that a
  // path admits now with no path for its smallest request; "" when not.
  std::string takes_last_path(const admission::MemoryLedger& ledger, uint64_t bytes) const;
  void track(const std::shared_ptr<serve::Ticket>& t);
  // A request that failed on paths_[from] before its first token: decided
  // again without that path and adopted by the chosen one (same ticket, id
  // and stream). False when no other path can take it now.
  // Returns OK when moved, else why not.
  Status failover(size_t from, const std::shared_ptr<serve::Ticket>& t, const Status& failure);
  // The same for a request that already produced tokens: from its
  // checkpoint (t->job().resume) to a path migration_allowed() from `from`.
  Status migrate(size_t from, const std::shared_ptr<serve::Ticket>& t, const Status& failure);
  // A decision for continuing `cp` (prompt = its tokens, max = what is left)
  // over `snaps`.
  // admission::decide under policy_.overflow (see Overflow).
  admission::Decision decide(const admission::RequestShape& shape, std::vector<admission::PathSnapshot> snaps) const;
  admission::Decision decide_resume(const Checkpoint& cp, std::vector<admission::PathSnapshot> snaps);
  void prober_loop();
  void emit(GatewayEvent e) const;
  // One probe of `path`'s breaker in half-open `episode`, reported to it.
  // False when it could not run now (queue full, no reference yet): retry.
  bool run_probe(const ExecutionPath& path, uint64_t episode);
  // run_probe's steps (gateway_health.cpp): the reference run started (false:
  // postponed, retry); the wait for the probe (true: the prober is stopping);
  // the probe's verdict reported to the breaker (run_probe's result).
  struct ProbeJob;
  bool start_probe_reference(const ProbeJob& job);
  bool wait_for_probe(const std::shared_ptr<serve::Ticket>& probe, const std::shared_ptr<serve::Ticket>& ref_ticket);
  bool finish_probe(const ProbeJob& job, const std::shared_ptr<serve::Ticket>& probe,
                    const std::shared_ptr<serve::Ticket>& ref_ticket);
  void stop_prober();
  void health_loop();
  void check_health_round();
  void stop_health();

  Env& env_;
  std::vector<ExecutionPath> paths_;
  std::vector<PathNotBuilt> not_built_;
  GatewayPolicy policy_;
  std::atomic<uint64_t> next_ticket_id_{1};
  std::once_flag longest_token_once_;
  size_t longest_token_bytes_ = 0;  // precheck()'s bound, set once

  mutable std::mutex mu_;
  std::mutex reserve_mu_;  // one reserve_cotenant() check-and-declare at a time (before mu_)
  int64_t last_observe_ns_ = 0;
  struct Lease {
    std::string owner;  // ReservationCaller::owner of its maker
    std::string name;
    admission::MemoryLedger* ledger = nullptr;
    admission::Ticket ticket;
    uint64_t bytes = 0;
    double ttl_s = 0;
    int64_t expires_ns = 0;
  };
  std::map<uint64_t, Lease> leases_;
  uint64_t next_lease_id_ = 1;
  std::array<uint64_t, kNumDecisionCounters> decisions_{};  // by DecisionCounter
  static constexpr size_t kRecentDecisions = 32;
  std::deque<RecentDecision> recent_decisions_;
  // Counts a decision and keeps it among the recent ones.
  void count_decision(DecisionCounter kind, const admission::Decision& d);
  std::map<uint64_t, std::weak_ptr<serve::Ticket>> live_;
  // verify_equivalence's results, keyed by fingerprint and the two
  // placements in order.
  std::map<std::string, EquivalenceInfo> equivalence_;
  std::mutex verify_mu_;  // one verify_equivalence at a time

  // The prober's state, shared with the callbacks that wake it (breaker
  // listeners, probe tickets' on_finished), which may outlive the Gateway.
  struct ProberSync {
    enum class Phase { kBusy, kIdle, kClock, kProbe };
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    bool kick = false;  // something changed since the prober last looked
    Phase phase = Phase::kBusy;
    std::function<bool()> probe_settled;  // kProbe: the probe's wait is over
  };
  const std::shared_ptr<ProberSync> prober_sync_ = std::make_shared<ProberSync>();
  bool has_prober_ = false;
  std::mutex prober_join_mu_;
  std::thread prober_;
  // Prober thread only: the CPU path's probe text once known, and its run
  // while it is under way.
  std::optional<std::string> probe_reference_;
  std::shared_ptr<serve::Ticket> ref_pending_;
  // Prober thread only: the half-open episode each device was last recovered
  // for (recover() runs once per episode, before its first probe).
  std::map<const CircuitBreaker*, uint64_t> recovered_episode_;

  // The health prober's state; a check's helper thread may outlive a round
  // (it timed out), so its result lives in shared state.
  struct HealthRun {
    bool done = false;
    Status status;
    int64_t started_ns = 0;
  };
  struct HealthSync {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    bool parked = false;
  };
  const std::shared_ptr<HealthSync> health_sync_ = std::make_shared<HealthSync>();
  struct HealthRunner {
    std::shared_ptr<DeviceControl> device;
    std::shared_ptr<CircuitBreaker> breaker;
    std::shared_ptr<HealthRun> run;  // the last check (null: none yet)
    std::thread thread;
  };
  std::vector<HealthRunner> health_runners_;  // health thread only (joined by stop_health)
  bool has_health_ = false;
  std::mutex health_join_mu_;
  std::thread health_;
};

}  // namespace spw::gateway
