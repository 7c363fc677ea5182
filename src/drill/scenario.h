// Scenario: what a drill replays, read from a TOML file (drills/*.toml).
//
// A scenario is a workload (request classes), a server to run it against, and
// phases in order; each phase lasts duration_s, says which classes send and
// how fast, how much memory the competing workload holds during it, and which
// faults fire at which second of it. The same Scenario drives the live drill
// (drill/live.h: a real `spillway serve`, real HTTP clients, a real competing
// process) and the simulation (drill/simulation.h: SimEnv, fake engines, the
// real gateway), so their reports compare.
//
// Contract: parse_scenario() / load_scenario() validate everything they read:
// unknown keys, wrong types, negative or zero durations, rates or sizes,
// unknown fault kinds or class names, a fault outside its phase, are
// InvalidArgument naming the key (with the TOML line where toml++ gives
// one); nothing is defaulted silently except the documented defaults below.
// Sizes are strings ("64MiB", "1.5GiB", plain bytes) or integers (bytes).
// Thread safety: values; no shared state.
//
// The TOML layout (drills/default.toml is a commented example). Keys marked
// (req) are required; the others default as written; any other key is refused.
//
//   name = "default"            # (req)
//   description = "..."         # default ""
//   seed = 1                    # integer >= 0: Poisson arrivals, sampling seeds
//   drain_s = 30                # > 0
//
//   [server]                    # the whole table is optional
//   model = "models/stories260K.gguf"
//   device = "vulkan"
//   device_memory = "48MiB"     # a size, passed on as --device-memory; "" = the device's heap
//   args = ["--breaker-cooldown-s", "2"]   # strings, verbatim
//   models = ["second=models/stories260K.gguf"]  # catalogue models, NAME=FILE (FILE found as `model` is),
//                                                # passed on as --model NAME=FILE
//
//   [[class]]                   # at least one
//   name = "short"              # (req) unique
//   prompt = "Once upon a time" # (req) non-empty
//   prompt_repeat = 1           # >= 1
//   max_tokens = 16             # >= 1
//   stream = true
//   greedy = true
//   model = "second"            # a name of server.models; default "": the served model
//   idempotency_share = 0.0     # 0..1
//   retry_share = 0.0           # 0..1
//
//   [[phase]]                   # at least one, run in file order
//   name = "warm"               # (req) unique
//   duration_s = 10             # > 0
//   cotenant_bytes = "16MiB"    # a size, 0 allowed (the co-tenant lets go)
//   undeclared_bytes = 0        # a size, 0 allowed
//     [[phase.load]]
//     class = "short"           # (req) a [[class]] name, once per phase
//     rate_per_s = 1            # > 0
//     concurrency = 2           # >= 1
//     [[phase.fault]]
//     kind = "alloc_fail"       # (req) pressure | alloc_fail | device_lost | cancel_queued | kill
//     at_s = 2                  # (req) 0 <= at_s < the phase's duration_s
//     # only the keys of the kind (others are refused):
//     #   pressure:      bytes (req; a size, 0 allowed)
//     #   alloc_fail:    path = "gpu", count = 1
//     #   device_lost:   path = "gpu", count = 1, after_submits = 0
//     #   cancel_queued: path = "cpu" (the queue whose waiting request is cancelled), count = 1
//     #   kill:          restart_after_s = 1 (> 0)
//
// Sizes: a string, a number with an optional K/M/G/T suffix in powers of 1024
// and an optional "iB"/"B" ("64MiB", "1.5GiB", "512M", "1048576"), or an
// integer of bytes (the same rules as --device-memory).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw::drill {

// One kind of request a client sends.
struct RequestClass {
  std::string name;            // "short", "long", ...
  std::string prompt;          // the prompt text (a completion, not chat)
  int32_t prompt_repeat = 1;   // the prompt is `prompt` repeated this many times (long prompts)
  int32_t max_tokens = 16;
  bool stream = true;
  bool greedy = true;          // false: temperature 0.8 with a per-request seed
  std::string model;           // a catalogue model's name (server.models); "": the served model
  double idempotency_share = 0;  // share of requests sent with an Idempotency-Key (0..1)
  // Share of this class's idempotent requests that are sent twice (a client
  // retry after its first attempt ended): the second must replay, not run.
  double retry_share = 0;
};

// A fault the drill's nemesis causes at a moment of a phase.
enum class FaultKind {
  kPressure,      // the competing workload jumps to `bytes` (redirect before admission)
  kAllocFail,     // armed alloc_fail on the GPU path's device (allocation failure before generation)
  kDeviceLost,    // armed device_lost while a request generates (driver reset mid-generation)
  kCancelQueued,  // a client cancels its request while it waits in the CPU path's queue
  kKill,          // kill -9 of the server, restarted on the same journal after restart_after_s
};
std::string_view fault_kind_name(FaultKind k);  // "pressure", "alloc_fail", ...
Result<FaultKind> parse_fault_kind(std::string_view name);

struct FaultSpec {
  FaultKind kind = FaultKind::kAllocFail;
  double at_s = 0;                // seconds from the start of its phase
  std::string path = "gpu";       // device faults: the path whose device is armed (cancel_queued: the queue, default "cpu")
  int32_t count = 1;              // device faults: how many events fire
  int32_t after_submits = 0;      // device_lost: submissions that pass first (mid-generation)
  uint64_t bytes = 0;             // pressure: the competing workload's new holding
  double restart_after_s = 1;     // kill: seconds the server stays down
};

struct Phase {
  std::string name;
  double duration_s = 10;
  // Classes that send in this phase and each one's arrival rate (requests per
  // second, Poisson arrivals from the drill's seed) and its concurrency cap
  // (at most that many of the class in flight at once).
  struct Load {
    std::string cls;
    double rate_per_s = 1;
    int32_t concurrency = 2;
  };
  std::vector<Load> load;
  // Memory the competing workload holds on the GPU through this phase (it
  // grows or shrinks to it at the phase's start): declared through the
  // server's reservations API (as `spillway reserve` does), and additionally
  // `undeclared_bytes` held without telling anyone (only observed usage can
  // see it, where the driver reports it).
  uint64_t cotenant_bytes = 0;
  uint64_t undeclared_bytes = 0;
  std::vector<FaultSpec> faults;
};

// How the live drill starts its own server (ignored with --server URL).
struct ServerSpec {
  std::string model = "models/stories260K.gguf";
  std::string device = "vulkan";
  std::string device_memory;      // --device-memory ("" = the device's heap)
  std::vector<std::string> args;  // more `spillway serve` flags, verbatim
  // Catalogue models, "NAME=FILE" (issue 32): the FILE resolved as `model`
  // is, passed on as --model NAME=FILE.
  std::vector<std::string> models;
};

struct Scenario {
  std::string name;
  std::string description;
  uint64_t seed = 1;
  ServerSpec server;
  std::vector<RequestClass> classes;
  std::vector<Phase> phases;
  // Seconds after the last phase for in-flight requests to end and clients to
  // resume what was interrupted, before the checker runs.
  double drain_s = 30;

  const RequestClass* find_class(std::string_view name) const;
  double total_s() const;  // sum of phase durations
};

// The `spillway serve` flags a scenario's server stands for, for the
// simulation's parser (app/serve_options.h): --model model_path, then
// server.args, then --model NAME=FILE per catalogue model (the simulation's
// engines are fakes: the files are not read). The live drill adds its own
// (port, journal, admin token) and resolves the files.
std::vector<std::string> simulated_serve_args(const Scenario& sc, const std::string& model_path);

// A size as scenarios write it (see above); 0 is accepted here, callers that
// need a positive size refuse it themselves. InvalidArgument on anything else.
Result<uint64_t> parse_size(std::string_view text);

Result<Scenario> parse_scenario(std::string_view toml_text, std::string_view source_name);
Result<Scenario> load_scenario(const std::string& path);

}  // namespace spw::drill
