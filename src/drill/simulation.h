// Simulation: a drill scenario on a simulated clock, over the real gateway.
//
// What is real and what is fake. Real: the Gateway (admission::decide, the
// memory ledgers, redirect, failover before the first token, migration at
// checkpoints, resume), the Schedulers (bounded queues, the KV gate), the
// CircuitBreaker with its prober, the SQLite Journal (accept with
// Idempotency-Key rules, the admission record, running/terminal states and
// checkpoints through JournalObserver, recovery at open, reopen for resume)
// and the tokenizer of the scenario's model. Fake: the clock (SimEnv), the
// engines (a FakeExecutor per worker: "t0 t1 ..." at fixed speeds, gpu 1000
// prompt / 100 generated tokens per second, cpu 200 / 20), the device (a
// byte count, below) and the clients (simulated actors on the driver
// thread). One seed is one run; simulated time is free, so a scenario of a
// minute runs in a fraction of a second of real time.
//
// The run (simulate()):
//   - Paths: "gpu" (placement vulkan, breaker "vulkan:0", a DeviceLedger of
//     the fake device) and "cpu" (role fallback, its own bounded queue, a
//     HostLedger), from SimOptions::server: the scenario's server.args as
//     `spillway serve` parses them (the caller parses them: `spillway drill`
//     with the serve flags' own parser, app/serve_options.h), the builder's
//     defaults otherwise. They are wired with build_gateway's own steps
//     (gateway/composition.h): the breaker's options, the paths' observers
//     (journal + breaker), their scheduler settings by role (workers, queue,
//     context, KV blocks of the gpu path's gate, checkpoint interval) and the
//     gateway policy (admission, observe interval); the mode sets the
//     overflow, and there is no health prober and no reservation limit
//     (reservation_max_share 1, as the live drill passes). ctx 0 (the
//     model's context_length) is kSimContext. What is the simulation's own:
//     the engines, the ledgers' capacities (below), the lagging reading.
//     The equivalence check runs at start, as `serve` does after its
//     warm-up, so migration is allowed.
//   - The device: capacity = SimDevice::capacity, else server.device_memory,
//     else 1 GiB; headroom = the --device-headroom-share (0.05). Spillway's
//     plan (weights + KV pool) is reserved and committed in the ledger. A
//     run on the gpu path also holds run_bytes while it runs (scratch the
//     plan's headroom is for; admission does not see it). The competing
//     workload holds the phase's cotenant_bytes, declared through
//     Gateway::reserve_cotenant (as `spillway reserve`; re-declared after a
//     restart), plus undeclared_bytes, which only the observed reading shows:
//     GatewayPolicy::observe feeds the ledger ours + what the competing
//     workload held one observe interval ago (readings lag). A gpu run that
//     starts while plan + running runs' bytes + its own + the competing
//     workload's bytes exceed capacity fails before its first token with
//     ResourceExhausted / kDeviceOutOfMemory: a real out-of-memory.
//   - Determinism: the driver moves the clock only when every worker and the
//     prober are parked on it and no run is between its end and its
//     observer's last call (a failover, a breaker trip: see AfterRun in
//     simulation.cpp), and acts alone in between, in a fixed order (actions
//     by time then sequence; tickets by operation). Device decisions (armed
//     faults, the out-of-memory check) for runs that start at one instant are
//     taken 1 ns later, all together, in (path, ticket id) order, so thread
//     timing never decides which run gets a fault. The same scenario, seed
//     and mode give the same History, byte for byte in history_to_json, also
//     with other runs going on at the same time (simulate_seeds' jobs).
//   - Workload from the seed: per phase and class, Poisson arrivals at
//     rate_per_s; an arrival finds a free client of that class (at most
//     `concurrency` in flight) or is dropped. Each request: the class's
//     prompt (repeated prompt_repeat times), max_tokens, stream, greedy or
//     temperature 0.8 with a drawn seed, an Idempotency-Key with
//     idempotency_share; a keyed request that ended is sent again with
//     retry_share (f = "retry": a finished key must replay, not run).
//     Op::client = class index * 1000 + slot + 1; Op::prompt_key =
//     "<class>/greedy" or "<class>/seed=<n>".
//     Requests go as the HTTP layer sends them: journal accept (replay of a
//     finished key), Gateway::submit, set_admission, a refusal finished in
//     the journal as resumable.
//   - Completions: ok (done, all the text), fail (refused or failed; a
//     resumable failure with a checkpoint is resumed by its client at once:
//     journal reopen + Gateway::resume with the received text, f = "resume",
//     at most 8 times, 1 s apart when refused), info (the server was killed
//     while it ran). A request or resume that finds the server down fails
//     with http_status 0, error_code "connection_refused"; a keyed retry
//     that does is sent again a second later (at most 8 times).
//   - Nemesis: pressure (the declared co-tenant jumps to `bytes`), alloc_fail
//     (the path's next `count` runs fail before their first token with
//     kDeviceOutOfMemory), device_lost (the next run fails after
//     `after_submits` tokens with kDeviceLost, `count` times), cancel_queued
//     (a client cancels a request queued on the cpu path with
//     Gateway::cancel; when none is queued there, the nemesis fills the cpu
//     path's idle workers with internal requests and a client's request is
//     queued on the cpu scheduler directly, bypassing admission, then
//     cancelled), kill (see below). Each is an Event; so are phases,
//     co-tenant steps, breaker transitions and restarts.
//   - Kill: a crash of the server "process", in-process: from the kill
//     instant nothing of the old process reaches the journal (its journal
//     observer is cut off: a dead process writes nothing), its engines'
//     sleeps are cut short (a ProcessEnv over the SimEnv) and it is shut down
//     without moving the clock, the in-flight clients complete as `info`
//     with what they had, and the Journal is closed (its lock released).
//     After restart_after_s the Journal is reopened, whose recovery fails
//     the rows left running as resumable, and a new gateway is built (fresh
//     ledgers, breaker, queues; the co-tenant declares itself again); as
//     `serve` does, it runs the equivalence check before it takes requests
//     (on the fake cpu path's speed that is about 3.3 simulated seconds, in
//     which clients are refused; events "restart" and "ready"). Clients then
//     continue what was interrupted: resume from a journaled checkpoint, or
//     from the prompt when the kill came before the first one (as the
//     server's resume does: Gateway::start_checkpoint); else a keyed request
//     retries under its key. Not simulated: a kill
//     in the middle of a SQLite write (every journal call is atomic here),
//     memory the dead process held on the device lingering after it.
//   - Samples every sample_interval_s from Gateway::status() (queues,
//     breakers, the gpu ledger's capacity/limit/ours/co-tenants/used, the
//     host ledger's budget/reserved); host_rss is 0 (no process).
//   - After the last phase, drain_s for in-flight requests and resumes; then
//     every request id a client was given is read back from the journal into
//     History::finals. admitted_under_reserve is kept by the driver over every
//     decision it recorded for that id on a gpu-side path (Decision::pressure
//     <= 1, the true planned figure also under the baselines): the journal
//     keeps only the last decision, which after a failover is the cpu one.
//   - History::reference: FakeExecutor's text for each prompt_key's
//     effective max_tokens (the engine is deterministic: that is the clean run).
// Modes (SimMode): planned (Spillway), no_failover (gateway Overflow::kNone:
// everything on the first path, a device fault is the request's end),
// naive_free_memory (Overflow::kNaive: admission sees a free-memory reading).
// Failures: InvalidArgument for a scenario the simulation cannot run (no
// classes or phases, an unknown fault path, server options out of range or
// server.args not parsed into SimOptions::server);
// NotFound / the tokenizer's error when the model file cannot be read;
// IOError when the journal's temporary folder cannot be made; Internal when
// the simulated system does not settle within 10 s of real time (a stuck
// worker: the message names the seed and the simulated time). A shutdown
// that does not finish within 10 s of real time aborts the process (a hung
// worker cannot be joined, and a CI run must not hang).
// Thread safety: simulate() and simulate_seeds() may run concurrently (each
// run has its own SimEnv, gateway and journal file); the progress callback is
// called on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "drill/checker.h"
#include "drill/history.h"
#include "drill/scenario.h"
#include "gateway/builder.h"

namespace spw {
class Tokenizer;
}

namespace spw::drill {

enum class SimMode { kPlanned, kNoFailover, kNaiveFreeMemory };
std::string_view sim_mode_name(SimMode m);              // "planned", "no_failover", "naive_free_memory"
Result<SimMode> parse_sim_mode(std::string_view name);  // those names; InvalidArgument otherwise

// The simulated model's context_length: the context of the paths when the
// server's ctx is 0 (what the drills were sized for).
inline constexpr int32_t kSimContext = 512;

// The fake GPU. 0 = derived (see the contract).
struct SimDevice {
  uint64_t capacity = 0;       // 0: server.device_memory, else 1 GiB
  uint64_t weights_bytes = 0;  // 0: capacity / 32
  uint64_t pool_bytes = 0;     // the KV pool; 0: capacity / 32
  uint64_t run_bytes = 0;      // held by each running gpu run; 0: capacity / 256
};

struct SimOptions {
  uint64_t seed = 1;
  SimMode mode = SimMode::kPlanned;
  // The scenario's file, for the replay command ("" : <scenario>.toml).
  std::string scenario_file;
  // Where the tokenizer comes from: this model file ("" = the scenario's
  // server.model, relative to the working directory), or `tokenizer` when
  // set (shared by runs: loading it once saves each seed the parse).
  std::string model_path;
  std::shared_ptr<const Tokenizer> tokenizer;
  // Folder for the per-run journal files ("" = /dev/shm when writable, else
  // $TMPDIR or /tmp); each run makes and removes its own subfolder.
  std::string work_dir;
  SimDevice device;
  // The simulated server's settings (see the contract): the scenario's
  // server.args parsed as `spillway serve` flags by the caller (src/drill
  // reads no flags). None: the defaults, for a scenario without server.args
  // (one with them is InvalidArgument: they would be ignored).
  std::optional<gateway::GatewayOptions> server;
  double sample_interval_s = 0.25;
  // simulate_seeds: seeds run side by side on this many threads (0: two per
  // hardware thread: a run mostly waits for thread hand-offs, so twice the
  // cores still gains). Each seed's history is the same whatever the number.
  int jobs = 0;
};

// One seed: the History of the run (History::mode = sim_mode_name).
Result<History> simulate(const Scenario& scenario, const SimOptions& options);

// The command that replays `seed` bit for bit:
// "spillway drill --simulate --scenario FILE --seed S" (plus " --mode M"
// for a baseline).
std::string replay_command(const std::string& scenario_file, uint64_t seed, SimMode mode);

struct SeedFailure {
  uint64_t seed = 0;
  std::vector<std::string> failed_gates;
  std::string detail;   // the failed gates' details, or the simulation's error
  std::string command;  // replay_command
};

struct SimSummary {
  std::string scenario;
  SimMode mode = SimMode::kPlanned;
  uint64_t first_seed = 0;
  int64_t seeds = 0;
  int64_t passed = 0;
  std::vector<SeedFailure> failures;  // in seed order
  // Sums over the seeds (from each CheckResult's figures).
  int64_t accepted = 0, succeeded = 0, refused = 0, lost = 0, duplicated = 0;
  int64_t over_reserve = 0;  // seeds whose reserve_line gate failed
  double success_rate = 1;   // succeeded / accepted over all seeds
  double real_seconds = 0;   // wall-clock time of the whole loop
};

// Called after each seed, in seed order, on the calling thread (seed, its
// check; null check when the run failed).
using SimProgress = std::function<void(uint64_t seed, const CheckResult* check)>;

// Runs seeds [first_seed, first_seed + n_seeds) with `base` (its seed and
// mode replaced), checks each with drill::check(), and collects the failing
// ones with their replay command. A seed whose simulation returns an error
// is a failure (its detail is the error), not an error of the whole run;
// InvalidArgument only for n_seeds < 1.
Result<SimSummary> simulate_seeds(const Scenario& scenario, const SimOptions& base, uint64_t first_seed,
                                  int64_t n_seeds, SimMode mode, const SimProgress& progress = {});

}  // namespace spw::drill
