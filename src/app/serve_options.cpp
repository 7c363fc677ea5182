#include "app/serve_options.h"

#include <cctype>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "backend/vulkan/device_spec.h"
#include "core/duration.h"
#include "core/size.h"
#include "http/models.h"
#include "http/server.h"
#include "journal/journal.h"

namespace spw::app {
namespace {

// A key's rules checked as the value arrives, so that a bad key in --config
// is reported with the file and line (config_file.cpp runs the option's
// validators there). The message names lengths and positions, never the key.
CLI::Validator key_rules(std::string what, bool allow_empty = false) {
  return CLI::Validator(
      [what, allow_empty](std::string& key) -> std::string {
        if (allow_empty && key.empty()) return {};
        Status s = http::check_api_key_rules(key, what);
        return s.ok() ? std::string() : s.message();
      },
      "", "key rules");
}

// The model, the address and the process: --model, --host, --port, ..., --no-warmup.
void add_server_flags(CLI::Option_group* srv, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  srv->add_option("--model,-m", o.models,
                  "GGUF model file, or NAME=FILE (repeatable): the first is the served model (always resident); "
                  "each other one is a catalogue model that requests name in `model`, loaded by its first request "
                  "and evicted when idle for another's load or after its keep-alive");
  srv->add_option("--models-dir", g.models_dir,
                  "A folder whose *.gguf files join the catalogue, each named by its file stem (without --model, "
                  "the first by name is the served model); a file that cannot be served is listed in /v1/models "
                  "as unavailable with the reason");
  srv->add_option("--keep-alive", o.keep_alive,
                  "How long a catalogue model stays loaded after its last request (5m, 300, 1h; negative: until "
                  "evicted for room); a request's keep_alive field or X-Spillway-Keep-Alive header overrides it")
      ->capture_default_str();
  srv->add_option("--min-residency-s", g.min_residency_s,
                  "Seconds a catalogue model stays loaded before another model's load may evict it: two models "
                  "that cannot both fit are then served in runs, not one load per request (0: no minimum)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  srv->add_option("--pin", o.pin, "A catalogue model (by name) loaded at start and never evicted (repeatable)");
  srv->add_option("--preload", o.preload, "A catalogue model (by name) loaded at start (repeatable)");
  srv->add_option("--model-keep-alive", o.model_keep_alive,
                  "NAME=DURATION: one catalogue model's keep-alive instead of --keep-alive (repeatable)");
  srv->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  srv->add_option("--port", o.port, "Port (0 = pick a free one)")->capture_default_str()->check(CLI::Range(0, 65535));
  srv->add_option("--alias", o.aliases,
                  "Another id for the served model in requests' `model` field (repeatable), e.g. the name a "
                  "client is configured with; /v1/models lists it; an unknown id is a 404 model_not_found");
  srv->add_option("--threads,-t", g.threads, "CPU threads for the engine (0 = all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  srv->add_option("--chat-template", g.chat_template,
                  "Chat template for /v1/chat/completions, overriding the model's tokenizer.chat_template "
                  "(e.g. chatml, llama2, llama3, mistral, zephyr, gemma)");
  srv->add_option("--grace", o.grace_s, "Seconds in-flight requests get to finish on SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  srv->add_flag("--log-requests", o.log_requests, "Log one line per HTTP request to stderr");
  srv->add_option("--admin-token", o.admin_token,
                  "Enables the admin API (POST/GET/DELETE /v1/admin/faults: arm faults on the GPU for drills) "
                  "for loopback clients sending 'Authorization: Bearer TOKEN'; off when empty")
      ->check(key_rules("the admin token (--admin-token)", /*allow_empty=*/true));
  srv->add_flag_function(
      "--no-warmup", [&o](int64_t) { o.g.warmup = false; },
      "Skip the one tiny request per path at start (it compiles shaders and measures first rates)");
}

// Who may connect and how much they may send: API keys, hosts, connection limits, timeouts.
void add_client_flags(CLI::Option_group* cl, ServeCliOptions& o) {
  cl->add_option("--api-key", o.api_keys,
                 "An API key (repeatable; at least 16 printable characters): with keys, /v1/* and /metrics need "
                 "'Authorization: Bearer KEY' and each key sees only its own requests")
      ->check(key_rules("an API key (--api-key)"));
  cl->add_option("--api-key-hash", o.api_key_hashes,
                 "An API key as 'sha256:HEX' (repeatable; for config files, so they hold no secret; "
                 "`spillway hash-key` prints one)");
  cl->add_flag("--insecure-no-auth", o.insecure_no_auth,
               "Allow a non-loopback --host without any API key (every client on the network is one user)");
  cl->add_option("--max-body", o.max_body, "Largest request body, after de-chunking (413 beyond)")
      ->capture_default_str()
      ->type_name("SIZE");
  cl->add_option("--max-connections", o.max_connections, "Open connections in all (past it: health and status only)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cl->add_option("--allowed-host", o.allowed_hosts,
                 "A host name clients may reach this server by (repeatable; '*': any). Without API keys the "
                 "server answers only to IP addresses and localhost in the Host header (a defence against DNS "
                 "rebinding from a browser); with keys, any name")
      ->transform(CLI::Validator(
          [](std::string& name) -> std::string {
            for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            Status s = http::check_allowed_host(name);
            return s.ok() ? std::string() : s.message();
          },
          "", "host name"));
  cl->add_option("--max-connections-per-client", o.max_connections_per_client,
                 "Open connections from one address (past it: health and status only)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cl->add_option("--idle-timeout", o.idle_timeout_s, "Seconds an idle keep-alive connection stays open")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cl->add_option("--header-timeout", o.header_timeout_s,
                 "Seconds a request's line and headers may take to arrive once it started (408 after)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cl->add_option("--body-timeout", o.body_timeout_s, "Seconds a request body may take to arrive (408 after)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// The first-choice path: its device, workers, batching, queue, context and KV.
void add_first_path_flags(CLI::Option_group* first, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  GatewayFlagText& text = o.text;
  first
      ->add_option("--device", text.device,
                   "cpu, vulkan[:i|:name] or hybrid:N[:i] (the first N layers on Vulkan); +cpu-experts after a device "
                   "one keeps a mixture of experts' experts on the CPU, +cpu-experts:K those of layers 0..K-1 only "
                   "(chosen by itself when they do not fit the device)")
      ->capture_default_str();
  first->add_option("--parallel", g.parallel, "Requests the first path generates at once (workers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  first->add_flag("!--no-batching", g.batching,
                  "Let each worker pass over the weights alone (default: a path's workers decode their next tokens "
                  "and feed new prompts in chunks in one shared pass, continuous batching)");
  first
      ->add_option("--batch-max-wait-us", g.batch_max_wait_us,
                   "How long a batched decode step waits for a worker busy elsewhere before it starts without it")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  first
      ->add_option("--step-tokens", g.step_tokens,
                   "Tokens per batched step: the running requests' next tokens plus a chunk of a new prompt. "
                   "Smaller steps keep the running streams' inter-token latency low while a prompt is read; larger "
                   "ones give that prompt its first token sooner")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  first->add_option("--queue", g.queue, "Requests that may wait on the first path")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  first->add_option("--ctx,-c", g.ctx, "Context positions per request (0 = the model's context_length)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  first
      ->add_option("--kv-type", text.kv_type,
                   "KV cache element type of every path: f16 (as llama.cpp), f32, or q8_0 (CPU only; about "
                   "half of f16's memory)")
      ->capture_default_str();
  first
      ->add_option("--kv-blocks", g.kv_blocks,
                   "KV pool of the first path in blocks of 16 positions, shared by its requests "
                   "(0 = what the memory allows, up to parallel x ctx)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// The CPU fallback path: its workers, queue, context, model and replica.
void add_fallback_flags(CLI::Option_group* fb, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  GatewayFlagText& text = o.text;
  fb->add_flag_function(
      "--no-cpu-fallback", [&o](int64_t) { o.g.cpu_fallback = false; },
      "With a GPU first path, do not serve a CPU path on the same model file for the requests the GPU cannot take");
  fb->add_option("--cpu-parallel", g.cpu_parallel, "Requests the CPU path generates at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  fb->add_option("--cpu-queue", g.cpu_queue, "Requests that may wait on the CPU path")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  fb->add_option("--cpu-ctx", g.cpu_ctx, "Context of the CPU path (0 = the first path's)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  fb->add_option("--fallback-model", g.fallback_model,
                 "A smaller GGUF the CPU path serves instead of the model (same tokenizer; always shown as a "
                 "different model)");
  fb->add_option("--replica", text.replica,
                 "How the CPU path holds its model: warm (read in at start), mmap (read in by its first request), "
                 "on-demand (loaded by its first request) or auto (the lightest that fits --recovery-budget-ms)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "warm", "mmap", "on-demand"}));
  fb->add_option("--recovery-budget-ms", g.recovery_budget_ms,
                 "auto replica: the longest measured load + page-in time the CPU path's first request may wait")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// The offload (hybrid) path beside a Vulkan first path.
void add_offload_flags(CLI::Option_group* off, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  off->add_option("--offload-layers", g.offload_layers,
                  "With --device vulkan: also serve a hybrid path with this many layers on the GPU (sharing the "
                  "GPU path's weights) for prompts the GPU path's KV cannot hold (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  off->add_option("--offload-queue", g.offload_queue, "Requests that may wait on the offload path")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// Host and device memory budgets, headroom, co-tenants and reservations.
void add_memory_flags(CLI::Option_group* mem, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  GatewayFlagText& text = o.text;
  mem->add_option("--host-memory-share", g.host_memory_share,
                  "Share of MemAvailable the server may use (the cgroup's room counts at 0.8)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  mem->add_option("--host-budget", text.host_budget, "Fixed ceiling on the host memory budget, e.g. 2GiB")
      ->type_name("SIZE");
  mem->add_option("--device-memory", text.device_memory,
                  "Device memory Spillway may use, e.g. 8GiB (default: the largest device-local heap)")
      ->type_name("SIZE");
  mem->add_option("--device-headroom", text.device_headroom,
                  "Device memory always kept free, e.g. 512MiB (on top of --device-headroom-share)")
      ->capture_default_str()
      ->type_name("SIZE");
  mem->add_option("--device-headroom-share", g.device_headroom_share,
                  "Share of the device capacity always kept free (kernels, driver, bursts)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.95));
  mem->add_option("--co-tenant", text.co_tenants,
                  "Another service's device memory, NAME=SIZE (repeatable), e.g. whisper=3GiB (see also POST "
                  "/v1/reservations and `spillway reserve`)");
  mem->add_option("--reservation-max-share", g.reservation_max_share,
                  "Share of the GPU's (CPU-only: the host budget's) safe limit that clients' reservations may hold in "
                  "all; below 1 a reservation that would leave a model no path is also refused, 1 allows it")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
}

// Admission: pressure, delay, rate priors, shrinking, overflow mode.
void add_admission_flags(CLI::Option_group* adm, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  GatewayFlagText& text = o.text;
  adm->add_option("--pressure-threshold", g.pressure_threshold,
                  "Largest share of a ledger's safe limit (capacity - headroom) a path may be at to take new work")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 10.0));
  adm->add_option("--max-delay-s", g.max_delay_s,
                  "Longest estimated wait on the first path before a request goes to another path")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  adm->add_option("--host-bandwidth", g.host_bandwidth,
                  "Read bandwidth of host memory in bytes/s for the paths' rate priors (the speeds quoted before a "
                  "path's first request: bandwidth / bytes a decode step streams); 0: measured at start (~120-150 ms "
                  "on the reference machine) with each weight type's decode kernel (a few ms a type); given: no "
                  "start-up probes, kernels priced with the reference machine's figures")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  adm->add_option("--device-bandwidth", g.device_bandwidth,
                  "The GPU's memory bandwidth in bytes/s for the rate priors; 0: the host's for lavapipe or an "
                  "integrated GPU, else not known (the GPU-side paths quote default rates until their first request)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  adm->add_flag("--allow-shrink", g.allow_shrink,
                "Shrink max_tokens to fit memory for every request (else only with X-Spillway-Allow-Shrink: true)")
      ->capture_default_str();
  adm->add_option("--min-shrink-tokens", g.min_shrink_tokens, "Never shrink below this many new tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  adm->add_option("--observe-interval-s", g.observe_interval_s, "Re-read observed memory at most this often")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  adm->add_option("--overflow", text.overflow,
                  "planned; or a drill baseline: none (no redirect or failover) or naive (free-memory check only)")
      ->capture_default_str();
}

// The GPU circuit breaker and the device health checks.
void add_breaker_flags(CLI::Option_group* cb, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  cb->add_option("--breaker-consecutive-failures", g.breaker_consecutive_failures,
                 "Device faults in a row (device lost, device out of memory, timeouts, failed health checks) "
                 "that take the GPU out of service")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cb->add_option("--breaker-failure-share", g.breaker_failure_share,
                 "Or: share of device faults among the outcomes within --breaker-window-s that does")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  cb->add_option("--breaker-min-requests", g.breaker_min_requests,
                 "Outcomes within the window before --breaker-failure-share counts")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cb->add_option("--breaker-window-s", g.breaker_window_s, "Time window of --breaker-failure-share, in seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cb->add_option("--breaker-cooldown-s", g.breaker_cooldown_s,
                 "Seconds out of service before the first probe; doubled on each consecutive trip")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cb->add_option("--breaker-max-cooldown-s", g.breaker_max_cooldown_s,
                 "Longest cooldown; a device that stays in service this long starts again from --breaker-cooldown-s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cb->add_option("--breaker-probes", g.breaker_probes,
                 "Probe generations (greedy, their text checked against the CPU path's) that must pass to put the "
                 "GPU back in service")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  cb->add_option("--health-interval-s", g.health_interval_s,
                 "Seconds between health checks of each GPU device (a tiny real device operation; a failure "
                 "counts as a device fault); 0 = off")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cb->add_option("--health-timeout-s", g.health_timeout_s,
                 "A health check that has not answered after this many seconds fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

// The request journal: file, retention, sizes, checkpoints.
void add_journal_flags(CLI::Option_group* jr, ServeCliOptions& o) {
  gateway::GatewayOptions& g = o.g;
  GatewayFlagText& text = o.text;
  jr->add_option("--journal", g.journal,
                 "SQLite request journal (default $XDG_STATE_HOME or ~/.local/state /spillway/journal.sqlite; "
                 "'none' for no journal, no Idempotency-Key and no GET /v1/requests/{id})");
  jr->add_option("--journal-retention-hours", g.journal_retention_hours,
                 "How long finished requests stay in the journal")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 24.0 * 3650));
  jr->add_option("--journal-max-bytes", text.journal_max_bytes,
                 "Size budget of the journal, its WAL included (e.g. 512MiB; 0: none): finished requests are pruned, "
                 "oldest first, to keep within it, and a new request that cannot fit is refused (503 journal_full)")
      ->capture_default_str()
      ->type_name("SIZE");
  jr->add_option("--journal-max-body-bytes", text.journal_max_body_bytes,
                 "Request bodies larger than this are dropped from the journal once nothing can run from them "
                 "(the request finished, or failed for good); its size and digest stay (0: keep every body)")
      ->capture_default_str()
      ->type_name("SIZE");
  jr->add_option("--checkpoint-every", g.checkpoint_every,
                 "Write a running request's checkpoint to the journal every N generated tokens (0: only when it is "
                 "interrupted); a resume after a crash continues from the last one")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

// [NAME=]PATH: NAME when the text has '=' before any '/' (a path may hold
// '=' further on).
gateway::CatalogueModel catalogue_model(const std::string& text) {
  gateway::CatalogueModel m;
  const size_t eq = text.find('=');
  if (eq != std::string::npos && eq > 0 && text.find('/') > eq) {
    m.name = text.substr(0, eq);
    m.path = text.substr(eq + 1);
  } else {
    m.path = text;
  }
  return m;
}

// --model, --models-dir, --keep-alive, --pin, --preload and
// --model-keep-alive into the catalogue of `g`.
Status catalogue_options(const ServeCliOptions& o, gateway::GatewayOptions& g) {
  auto ka = parse_duration_s(o.keep_alive);
  if (!ka.ok()) return invalid_field("keep-alive", "--keep-alive: " + ka.status().message());
  g.keep_alive_s = *ka;
  g.models.clear();
  if (o.models.empty()) {
    if (g.models_dir.empty()) {
      return invalid_field("model", "--model: a GGUF model file is needed (or --models-dir DIR)");
    }
    // The first *.gguf of the folder by name is the served model.
    auto files = gateway::models_dir_files(g.models_dir);
    if (!files.ok()) return invalid_field("models-dir", "--" + files.status().message());
    if (files->empty()) return invalid_field("models-dir", "--models-dir " + g.models_dir + ": no *.gguf file in it");
    g.model = files->front();
  } else {
    const gateway::CatalogueModel first = catalogue_model(o.models.front());
    if (!first.name.empty()) {
      return invalid_field("model", "--model " + o.models.front() +
                                        ": the served model is named by its file (use --alias for other ids)");
    }
    g.model = first.path;
    for (size_t i = 1; i < o.models.size(); ++i) g.models.push_back(catalogue_model(o.models[i]));
  }
  g.pin = o.pin;
  g.preload = o.preload;
  g.model_keep_alive.clear();
  for (const std::string& text : o.model_keep_alive) {
    const size_t eq = text.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return invalid_field("model-keep-alive",
                           "--model-keep-alive " + text + ": expected NAME=DURATION, e.g. coder=30m");
    }
    auto d = parse_duration_s(text.substr(eq + 1));
    if (!d.ok()) return invalid_field("model-keep-alive", "--model-keep-alive " + text + ": " + d.status().message());
    g.model_keep_alive[text.substr(0, eq)] = *d;
  }
  return Status::ok_status();
}

}  // namespace

// One function per option group, in --help and --dump-config order.
void add_serve_options(CLI::App& sub, ServeCliOptions& o) {
  auto section = [&sub](const char* name) { return sub.add_option_group(name); };
  add_server_flags(section("server"), o);
  add_client_flags(section("clients"), o);
  add_first_path_flags(section("first-choice path"), o);
  add_fallback_flags(section("CPU fallback path"), o);
  add_offload_flags(section("offload path"), o);
  add_memory_flags(section("memory"), o);
  add_admission_flags(section("admission"), o);
  add_breaker_flags(section("circuit breaker"), o);
  add_journal_flags(section("journal"), o);
}

Result<gateway::GatewayOptions> gateway_options(const ServeCliOptions& o) {
  gateway::GatewayOptions g = o.g;
  const GatewayFlagText& t = o.text;
  SPW_RETURN_IF_ERROR(catalogue_options(o, g));
  {
    auto device = Placement::parse(t.device);
    if (!device.ok()) return device.status().with_context("--device");
    g.device = *device;
  }
  {
    auto kv = parse_kv_type(t.kv_type);
    if (!kv.ok()) return invalid_field("kv-type", "--kv-type: " + kv.status().message());
    g.kv_type = *kv;
  }
  {
    auto replica = gateway::parse_replica_mode(t.replica);
    if (!replica.ok()) return invalid_field("replica", "--replica " + replica.status().message());
    g.replica = *replica;
  }
  {
    auto overflow = gateway::parse_overflow(t.overflow);
    if (!overflow.ok()) return invalid_field("overflow", overflow.status().message());
    g.overflow = *overflow;
  }
  if (!t.host_budget.empty()) {
    auto cap = parse_memory_size(t.host_budget);
    if (!cap.ok()) return cap.status().with_context("--host-budget " + t.host_budget);
    g.host_budget = *cap;
  }
  if (!t.device_memory.empty()) {
    auto bytes = parse_memory_size(t.device_memory);
    if (!bytes.ok()) return bytes.status().with_context("--device-memory " + t.device_memory);
    g.device_memory = *bytes;
  }
  // "0" (the default) is no fixed headroom; any other value is a size.
  if (t.device_headroom != "0") {
    auto h = parse_memory_size(t.device_headroom);
    if (!h.ok()) return h.status().with_context("--device-headroom " + t.device_headroom);
    g.device_headroom = *h;
  }
  for (const std::string& ct : t.co_tenants) {
    const size_t eq = ct.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return invalid_field("co-tenant", "--co-tenant " + ct + ": expected NAME=SIZE, e.g. whisper=3GiB");
    }
    auto bytes = parse_memory_size(ct.substr(eq + 1));
    if (!bytes.ok()) return bytes.status().with_context("--co-tenant " + ct);
    g.co_tenants.push_back({ct.substr(0, eq), *bytes});
  }
  {
    auto journal_max = parse_byte_size(t.journal_max_bytes, /*allow_zero=*/true);
    if (!journal_max.ok()) return journal_max.status().with_context("--journal-max-bytes");
    auto body_max = parse_byte_size(t.journal_max_body_bytes, /*allow_zero=*/true);
    if (!body_max.ok()) return body_max.status().with_context("--journal-max-body-bytes");
    // Beyond int64_t no file grows anyway: as good as no limit.
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    g.journal_max_bytes = *journal_max > kMax ? 0 : static_cast<int64_t>(*journal_max);
    g.journal_max_body_bytes = *body_max > kMax ? 0 : static_cast<int64_t>(*body_max);
    if (g.journal_max_bytes > 0 && g.journal_max_bytes < journal::kMinJournalBytes) {
      return Status::invalid_argument("--journal-max-bytes: " + t.journal_max_bytes + " is below the least a " +
                                      "journal needs, " + std::to_string(journal::kMinJournalBytes / 1024) +
                                      "KiB (0: no limit)");
    }
  }
  return g;
}

Status with_flags(const Status& st) {
  if (st.ok()) return st;
  const std::string& m = st.message();
  size_t end = 0;
  while (end < m.size() && (std::islower(static_cast<unsigned char>(m[end])) || m[end] == '-')) ++end;
  if (end == 0 || (end < m.size() && m[end] != ' ' && m[end] != ':')) return st;
  // Only a key of a serve flag: the library's messages start with the option.
  static const std::set<std::string> keys = [] {
    std::set<std::string> k;
    CLI::App app;
    ServeCliOptions scratch;
    add_serve_options(app, scratch);
    for (CLI::App* group : app.get_subcommands([](CLI::App* s) { return s->get_name().empty(); })) {
      for (CLI::Option* opt : group->get_options()) {
        for (const std::string& n : opt->get_lnames()) k.insert(n);
      }
    }
    return k;
  }();
  if (keys.count(m.substr(0, end)) == 0) return st;
  return Status(st.code(), "--" + m, st.reason(), st.field());
}

Result<gateway::GatewayOptions> parse_serve_args(const std::vector<std::string>& args) {
  CLI::App app("spillway serve");
  ServeCliOptions o;
  add_serve_options(app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::Error& e) {
    return Status::invalid_argument(e.what());
  }
  return gateway_options(o);
}

}  // namespace spw::app
