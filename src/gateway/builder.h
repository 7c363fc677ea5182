// GatewayOptions and build_gateway(): the composition `spillway serve`, the
// drill and integration tests all use, from a model file to a running set of
// execution paths.
//
// Contract: build_gateway(env, options) opens the journal, reads the host's
// memory (MemAvailable, cgroup, --host-budget) into a HostLedger, and builds:
//   the first-choice path from `device` (cpu, vulkan[:i], hybrid:N[:i]):
//     for a GPU placement it opens the device, makes a DeviceLedger (capacity
//     = device_memory or the largest device-local heap, headroom, co-tenants
//     declared with --co-tenant, the heap reading where the driver has
//     VK_EXT_memory_budget) and sizes the KV pool to what the ledger has left
//     after weights and scratch: min(kv_blocks, or workers x ctx when 0,
//     what fits). Requests then take their blocks from that pool one request
//     at a time (KV gate), so short requests share it. If not even the
//     weights and a minimal pool fit, the GPU path is not built and the
//     reason is kept (the server starts with the paths that fit);
//   the offload path (offload_layers > 0, full-GPU first path): hybrid:N on
//     the same device and model (the GPU path's uploaded weights are shared:
//     its device cost is its KV for N layers), one worker, one full context;
//     its device KV is set aside before the GPU pool is sized;
//   the CPU fallback path (unless cpu_fallback is false or the first path is
//     already the CPU): fallback_model or the same model file, cpu_parallel
//     workers, its own queue of cpu_queue and a context of cpu_ctx (0: the
//     first path's), its KV pool and scratch (and a fallback model's weights)
//     reserved in the host ledger; when the host cannot hold it, it is not
//     built (reason kept). Its replica (warm / mmap / on-demand, or shared
//     when the first path runs CPU layers from the same mapping) is chosen
//     as `replica` says, from the load and page-in times measured at start;
//     with mmap or on-demand on the same file as a full-GPU first path, that
//     path's host pages are dropped after its weights are on the device.
// The GPU-side paths (gpu, and hybrid beside it) share one CircuitBreaker for
// their device (breaker_* options), fed by their observers alongside the
// journal; the gateway probes it back (gateway.h). They also share one
// DeviceControl (device_control.h) bound to the VulkanBackend: its health
// check for the gateway's health prober (health_interval_s,
// health_timeout_s), its re-initialisation for recovery before the breaker's
// probes (each path's session group then re-opens itself: on_reopened counts
// it), and its FaultInjector for the admin API. A breaker or health option
// out of range is InvalidArgument naming the option.
// The ledgers hold each path's plan as committed; observed usage is re-read
// (host readings, the device heap) at most every observe_interval_s by the
// gateway. Errors: a bad option is InvalidArgument naming the option (field()
// its key, e.g. "offload-layers"; the CLI shows it as the flag); no path
// that fits is ResourceExhausted naming every path's reason; a model that
// does not load is its loader's error.
// The composition is a sequence of named steps (builder.cpp: the model files,
// the device ledger and GPU plan, the CPU plan, each path, the gateway); the
// ones another composition needs (option checks, host ledger, journal,
// breaker and device control, a path's observers, the gateway policy, a
// path's scheduler settings by role) are in gateway/composition.h, which the
// drill's simulation builds its server with.
// Thread safety: build_gateway is called once; the result is used as Gateway.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "admission/ledger.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/env.h"
#include "core/kv_type.h"
#include "core/placement.h"
#include "core/status.h"
#include "gateway/gateway.h"
#include "journal/journal.h"
#include "model/model.h"

namespace spw::gateway {

// How the CPU fallback path holds its model (GatewayOptions::replica).
enum class ReplicaMode { kAuto, kWarm, kMmap, kOnDemand };
// "auto", "warm", "mmap", "on-demand": the --replica spellings and
// ReplicaInfo::mode's (a chosen mode is never auto).
std::string_view replica_mode_name(ReplicaMode m);
// Those names; InvalidArgument quoting the text otherwise.
Result<ReplicaMode> parse_replica_mode(std::string_view name);

// Another service's declared device memory (--co-tenant NAME=SIZE).
struct CoTenant {
  std::string name;
  uint64_t bytes = 0;
};

// A model of the catalogue beyond the first (issue 32): served by an
// on-demand path of its own on the first path's placement, loaded by its
// first request (or at start: preload, pinned), kept for its keep-alive,
// evicted for another model's load when idle (never when pinned). See
// gateway/residency.h.
struct CatalogueModel {
  std::string name;  // "": the file's stem
  std::string path;
  bool pinned = false;
  bool preload = false;
  std::optional<double> keep_alive_s;  // none: GatewayOptions::keep_alive_s
  // Found by models_dir: a file that cannot be served is listed unavailable
  // with the reason instead of refusing the server's start.
  bool from_dir = false;
};

// Every key is also a `spillway serve` flag of the same name (with dashes);
// the defaults here are the documented ones (`spillway serve --dump-config`
// prints them as TOML with their descriptions). The values are typed: the
// flags' text (placements, sizes, NAME=SIZE, enum names) is parsed where it
// is read (src/app/serve_options.h), so the library never sees a spelling.
// build_gateway checks the ranges and the combinations; its errors are
// InvalidArgument with field() the option's key (e.g. "kv-type") and a
// message that starts with that key (the CLI adds the dashes).
struct GatewayOptions {
  std::string model;
  std::string chat_template;
  // The catalogue beyond `model` (CatalogueModel), and a folder whose *.gguf
  // files join it (named by file stem; `model` and fallback_model skipped).
  std::vector<CatalogueModel> models;
  std::string models_dir;
  // Seconds a catalogue model stays resident after its last use (< 0:
  // until evicted for room), and the least time it stays resident before
  // another model's load may evict it (0: no minimum; see residency.h).
  double keep_alive_s = 300;
  double min_residency_s = 30;
  // By catalogue model name (explicit or found in models_dir): pinned,
  // preloaded, its own keep-alive. A name no catalogue model has is
  // InvalidArgument (field "pin", "preload", "model-keep-alive").
  std::vector<std::string> pin;
  std::vector<std::string> preload;
  std::map<std::string, double> model_keep_alive;
  // First-choice path.
  Placement device = Placement::cpu();
  int32_t parallel = 1;   // its workers (concurrent requests)
  int32_t queue = 64;     // its waiting requests
  int32_t ctx = 0;        // its context (0: the model's)
  int32_t kv_blocks = 0;  // its KV pool in blocks of 16 (0: what fits, up to parallel x ctx)
  int threads = 0;        // CPU threads (0: all)
  // Element type of every path's KV cache: f16 (as llama.cpp), f32, or q8_0
  // (CPU only). Sizes the pools and the ledgers' KV figures.
  KvType kv_type = KvType::kF16;
  // Continuous batching of every path's workers (serve::EngineServeOptions).
  bool batching = true;
  int32_t batch_max_wait_us = 1000;
  int32_t step_tokens = 32;  // serve::EngineServeOptions::step_tokens
  // CPU fallback path (with a GPU first path).
  bool cpu_fallback = true;
  int32_t cpu_parallel = 1;
  int32_t cpu_queue = 8;
  int32_t cpu_ctx = 0;  // 0: the first path's context
  // A smaller model for the CPU path ("" = the first path's model). It must
  // share the model's tokenizer (so the prompt, template and stop rules mean
  // the same); it is always labelled as a different model.
  std::string fallback_model;
  // How the CPU fallback path holds its model: warm (mapped and read in at
  // start), mmap (mapped, read in by its first request), on-demand (loaded by
  // its first request) or auto: the lightest mode whose measured recovery
  // (load + page-in time) fits recovery_budget_ms.
  ReplicaMode replica = ReplicaMode::kAuto;
  double recovery_budget_ms = 2000;
  // Offload path (with a full-GPU first path): N > 0 builds a hybrid:N path
  // (layers [0, N) on the GPU, sharing the GPU path's uploaded weights, the
  // rest on the CPU) with one worker and one full context, for prompts the
  // GPU path's KV cannot hold; its device KV is set aside before the GPU
  // path's pool is sized.
  int32_t offload_layers = 0;
  int32_t offload_queue = 8;
  // Memory.
  double host_memory_share = 0.5;
  std::optional<uint64_t> host_budget;    // bytes; none: no fixed ceiling
  std::optional<uint64_t> device_memory;  // bytes; none: the largest device-local heap
  uint64_t device_headroom = 0;           // bytes
  double device_headroom_share = 0.05;
  std::vector<CoTenant> co_tenants;
  // Share of the co-tenant ledger's limit that clients' reservations (POST
  // /v1/reservations) may hold in all; 1 also lets them take a model's last
  // path (GatewayPolicy::reservation_max_share).
  double reservation_max_share = 0.8;
  // Admission.
  double pressure_threshold = 1.0;
  double max_delay_s = 2.0;
  bool allow_shrink = false;
  int32_t min_shrink_tokens = 16;
  double observe_interval_s = 1.0;
  // planned (Spillway), or a drill baseline: none | naive (gateway.h Overflow).
  Overflow overflow = Overflow::kPlanned;
  // Circuit breaker, one per GPU device (the GPU and offload paths share it;
  // the CPU path has none). The contract, and why these defaults differ from
  // resilience4j's, Envoy's and LiteLLM's, is in gateway/breaker.h.
  int32_t breaker_consecutive_failures = 3;  // device faults in a row that trip it
  double breaker_failure_share = 0.5;        // or this share of device faults ...
  int32_t breaker_min_requests = 10;         // ... among at least this many outcomes ...
  double breaker_window_s = 30;              // ... within this window
  double breaker_cooldown_s = 5;             // first cooldown; doubled on each consecutive trip
  double breaker_max_cooldown_s = 300;       // cap of the cooldown
  int32_t breaker_probes = 2;                // probe generations that must pass to close it
  // Health prober, per GPU device (gateway.h): a tiny real device operation
  // (VulkanBackend::health_check) every health_interval_s (0: off) while the
  // breaker is closed; a failure, or no answer within health_timeout_s, is a
  // device fault for the breaker.
  double health_interval_s = 5;
  double health_timeout_s = 10;
  // Journal.
  std::string journal;  // "" = default place, "none" = no journal
  double journal_retention_hours = 168;
  // The journal's size budget (database and WAL, bytes; 0: none): finished
  // rows are pruned, oldest first, to keep within it, and a request that
  // cannot fit is refused with 503 journal_full (journal.h, Size budget).
  // 1 GiB by default: retention alone let a flood of large requests grow it
  // without bound, and 1 GiB still holds dozens of the largest bodies the
  // server accepts (--max-body 16MiB) in flight.
  int64_t journal_max_bytes = int64_t{1} << 30;
  // Bodies larger than this are dropped once nothing can run from them
  // (done, or failed for good: journal.h, finish()); 0: all are kept. A
  // finished request's body is not served back (GET shows its size and
  // digest), so only forensics lose it; 64 KiB keeps ordinary prompts.
  int64_t journal_max_body_bytes = int64_t{64} << 10;
  // A running journaled request's checkpoint is written every this many
  // generated tokens (0: only when it is interrupted), so that after a crash
  // POST /v1/requests/{id}/resume continues from there (one synchronous
  // SQLite commit each: see docs/PERFORMANCE.md).
  int32_t checkpoint_every = 32;
  // Warm-up: one tiny generation per path at start (JITs shaders, measures
  // first rates and the time to make the path ready).
  bool warmup = true;
  // Rate priors (admission/prior.h): each path starts from decode/prefill
  // rates computed from the bytes a decode step streams and the read
  // bandwidth, bytes/s, of the memory it streams from. 0: the host's is
  // measured at start (admission/bandwidth.h: ~120-150 ms in the reference sandbox, the `threads` count);
  // the GPU's is the host's for lavapipe or an integrated GPU, else unknown
  // (that path keeps the default rates until its first request). Given: used
  // as is (tests, or a figure measured elsewhere).
  double host_bandwidth = 0;
  double device_bandwidth = 0;
  admission::PriorConstants prior_constants;
};

// A reading of the device-local heap: everyone's use of it, or why unknown.
struct HeapReading {
  std::optional<uint64_t> used;
  std::string unknown;
};

// A catalogue model as the HTTP layer needs it (its id, template), or why it
// is not served.
struct CatalogueEntry {
  std::string name;
  std::string path;
  bool available = false;
  std::string reason;                       // unavailable: why
  std::optional<std::string> chat_template;  // the file's tokenizer.chat_template
};

struct BuiltGateway {
  std::unique_ptr<Gateway> gateway;
  std::shared_ptr<journal::Journal> journal;  // null with journal = "none"
  std::shared_ptr<const Model> model;
  std::string model_name;
  std::string chat_template;     // resolved name ("" = none)
  std::vector<std::string> log;  // what was built and why (one line each)
  // The ledgers and the device, for /health (thread-safe objects).
  std::shared_ptr<admission::HostLedger> host_ledger;
  std::shared_ptr<admission::DeviceLedger> device_ledger;  // null without a GPU path
  std::shared_ptr<VulkanBackend> vulkan;                   // null without a GPU path
  // The catalogue beyond the first model, and its residency (null: none).
  std::vector<CatalogueEntry> catalogue;
  std::shared_ptr<ModelResidency> residency;
  // Re-read observed usage into the host / device ledger now (the gateway
  // calls both on its schedule; /health each for its own section).
  std::function<void()> observe_host;
  std::function<HeapReading()> observe_device;  // null without a GPU path
};

// The default journal place: $XDG_STATE_HOME/spillway/journal.sqlite, else
// ~/.local/state/spillway/journal.sqlite.
Result<std::string> default_journal_path();
std::string model_name_from_path(const std::string& path);
// The model files of a --models-dir: its regular *.gguf files, sorted by
// name; InvalidArgument (field "models-dir") naming the folder when it
// cannot be read.
Result<std::vector<std::string>> models_dir_files(const std::string& dir);

Result<BuiltGateway> build_gateway(Env& env, const GatewayOptions& options);

}  // namespace spw::gateway
