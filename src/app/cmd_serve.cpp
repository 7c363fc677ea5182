// `spillway serve --model M [--device cpu|vulkan[:i]|hybrid:N] [--config F]`:
// the OpenAI-compatible HTTP server over the gateway (gateway/builder.h):
// a first-choice path placed as --device says, plus a CPU fallback path on
// the same model with a GPU placement, each request decided by admission.
// Prints "spillway: listening on http://HOST:PORT model=... paths=..." once
// it accepts connections, and one line per path built or not built (and
// why) on stderr; a GPU plan that does not fit no longer stops the server, it
// starts with the paths that fit. SIGINT/SIGTERM stop it gracefully (running
// and queued requests get --grace seconds to finish), then it exits 0. The
// stop is bounded whatever the devices do: a second signal cancels what
// runs and exits within kCancelWindow, and a drain still not done
// kStopMargin after the grace (a worker inside a device call that does not
// return) exits 1 without it. Either way the journal is as a kill -9 leaves
// it: the next start marks the unfinished requests interrupted (failed,
// resumable). Only flag parsing and printing live here.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission/ledger.h"
#include "app/commands.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/env.h"
#include "device/host_memory.h"
#include "core/size.h"
#include "gateway/builder.h"
#include "http/models.h"
#include "http/server.h"

namespace spw::app {
namespace {

struct ServeCliOptions {
  gateway::GatewayOptions g;
  std::string host = "127.0.0.1";
  int port = 8080;
  double grace_s = 10;
  bool log_requests = false;
  std::string admin_token;  // "" = no admin API
  std::vector<std::string> aliases;
  std::vector<std::string> api_keys;
  std::vector<std::string> api_key_hashes;
  bool insecure_no_auth = false;
  std::string max_body = "16MiB";
  // Sizes as text (parse_byte_size), like --max-body; defaults: GatewayOptions'.
  std::string journal_max_bytes = "1GiB";
  std::string journal_max_body_bytes = "64KiB";
  int max_connections = 512;
  int max_connections_per_client = 64;
  std::vector<std::string> allowed_hosts;
  double idle_timeout_s = 60;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
};

// /health's device_memory: a fresh heap reading into the ledger, its figures
// and the allocator's.
http::HealthDeviceMemory device_memory_status(const gateway::BuiltGateway& b) {
  const gateway::HeapReading heap = b.observe_device();
  const admission::LedgerSnapshot snap = b.device_ledger->snapshot();
  const DeviceMemoryStats ms = b.vulkan->memory_stats();
  http::HealthDeviceMemory m;
  m.device = b.vulkan->name() + " (" + b.vulkan->device_info().name + ")";
  m.healthy = b.vulkan->healthy();
  m.health_reason = b.vulkan->health_reason();
  m.capacity = snap.capacity;
  m.headroom = snap.headroom;
  m.reserved = snap.reserved_ours;
  m.co_tenant_reserved = snap.reserved[static_cast<int>(admission::OwnerKind::kCoTenant)];
  m.others_observed = snap.others;
  m.available = snap.available;
  m.observed_heap_used = heap.used;
  m.observed_unknown = heap.unknown;
  m.allocated = ms.used_bytes;
  m.allocated_peak = ms.peak_bytes;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    m.allocated_by_category.emplace_back(memory_category_name(static_cast<MemoryCategory>(c)), ms.used_by_category[c]);
  }
  return m;
}

// /health's host_memory: the ledger's figures and the process's own RSS.
http::HealthMemory host_memory_status(Env& env, const gateway::BuiltGateway& b) {
  b.observe_host();
  const admission::LedgerSnapshot snap = b.host_ledger->snapshot();
  http::HealthMemory m;
  m.budget = snap.limit;
  m.reserved = snap.reserved_ours;
  m.available = snap.available;
  m.bound_by = b.host_ledger->binding_limit();
  const device::HostMemory hm = device::HostMemoryProbe(env).read();
  auto opt = [](const device::Reading<uint64_t>& v) {
    return v.known() ? std::optional<uint64_t>(v.value()) : std::nullopt;
  };
  m.process_rss = opt(hm.process_rss_bytes);
  m.process_rss_anon = opt(hm.process_rss_anon_bytes);
  m.process_rss_file = opt(hm.process_rss_file_bytes);
  return m;
}

std::chrono::milliseconds seconds_ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); }

// The keys from --api-key and api-key-hash; checked before the model loads.
Result<std::shared_ptr<http::ApiKeys>> load_api_keys(const ServeCliOptions& o) {
  auto keys = std::make_shared<http::ApiKeys>();
  for (const std::string& k : o.api_keys) {
    if (Status st = keys->add_key(k); !st.ok()) return Status::invalid_argument("--api-key: " + st.message());
  }
  for (const std::string& h : o.api_key_hashes) {
    if (Status st = keys->add_hash(h); !st.ok()) return Status::invalid_argument("--api-key-hash: " + st.message());
  }
  SPW_RETURN_IF_ERROR(http::check_listen_auth(o.host, !keys->empty(), o.insecure_no_auth));
  return keys;
}

// Stop signals go through a self-pipe: the handler only write()s (which is
// async-signal-safe), whichever thread it lands on; the main thread reads.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t n = write(g_signal_pipe[1], &b, 1);
  (void)n;
}

// Waits up to timeout_ms (-1: forever) for a stop signal; returns it or 0.
int wait_stop_signal(int timeout_ms) {
  pollfd p{g_signal_pipe[0], POLLIN, 0};
  for (;;) {
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    unsigned char b = 0;
    if (read(g_signal_pipe[0], &b, 1) == 1) return b;
    return 0;
  }
}

bool install_stop_signals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGINT, &sa, nullptr) == 0 && sigaction(SIGTERM, &sa, nullptr) == 0;
}

int run_serve(const ServeCliOptions& o) {
  if (!install_stop_signals()) {
    std::fprintf(stderr, "spillway serve: cannot install signal handlers: %s\n", std::strerror(errno));
    return 1;
  }
  Env& env = Env::default_env();
  auto fail = [](const Status& st, const std::string& what = "") {
    std::fprintf(stderr, "spillway serve: %s%s\n", what.c_str(), st.to_string().c_str());
    return 1;
  };
  auto keys = load_api_keys(o);
  if (!keys.ok()) return fail(keys.status());
  auto max_body = parse_byte_size(o.max_body);
  if (!max_body.ok()) return fail(max_body.status(), "--max-body: ");
  gateway::GatewayOptions g = o.g;
  {
    auto journal_max = parse_byte_size(o.journal_max_bytes, /*allow_zero=*/true);
    if (!journal_max.ok()) return fail(journal_max.status(), "--journal-max-bytes: ");
    auto body_max = parse_byte_size(o.journal_max_body_bytes, /*allow_zero=*/true);
    if (!body_max.ok()) return fail(body_max.status(), "--journal-max-body-bytes: ");
    // Beyond int64_t no file grows anyway: as good as no limit.
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    g.journal_max_bytes = *journal_max > kMax ? 0 : static_cast<int64_t>(*journal_max);
    g.journal_max_body_bytes = *body_max > kMax ? 0 : static_cast<int64_t>(*body_max);
    if (g.journal_max_bytes > 0 && g.journal_max_bytes < journal::kMinJournalBytes) {
      return fail(Status::invalid_argument("--journal-max-bytes: " + o.journal_max_bytes + " is below the least a " +
                                           "journal needs, " + std::to_string(journal::kMinJournalBytes / 1024) +
                                           "KiB (0: no limit)"));
    }
  }
  // Checked before the model loads (seconds to minutes), with the ids the
  // files will be served under; the server checks again with the built paths.
  std::vector<std::string> fallback_ids;
  if (!o.g.fallback_model.empty()) fallback_ids.push_back(gateway::model_name_from_path(o.g.fallback_model));
  if (Status st = http::validate_aliases(o.aliases, gateway::model_name_from_path(o.g.model), fallback_ids); !st.ok()) {
    return fail(st);
  }
  auto built = gateway::build_gateway(env, g);
  if (!built.ok()) return fail(built.status());
  gateway::BuiltGateway& b = *built;
  for (const std::string& line : b.log) std::fprintf(stderr, "spillway serve: %s\n", line.c_str());
  if (b.journal) {
    std::fprintf(stderr, "spillway serve: journal %s (%lld interrupted requests from an earlier run marked failed, resumable)\n",
                 b.journal->path().c_str(), static_cast<long long>(b.journal->recovered()));
  }
  auto chat_template = http::resolve_chat_template(b.model->file(), o.g.chat_template);
  if (!chat_template.ok()) {
    std::fprintf(stderr, "spillway serve: --chat-template: %s\n", chat_template.status().message().c_str());
    return 1;
  }
  // A model without a recognised template still serves chat clients: ChatML
  // is the documented default (README), named in every chat response and on
  // stderr, so the client can tell the prompt was not the model's own format.
  bool default_template = false;
  if (!*chat_template) {
    *chat_template = ChatTemplateKind::kChatML;
    default_template = true;
    std::fprintf(stderr,
                 "spillway serve: %s has no chat template Spillway recognises; /v1/chat/completions uses the "
                 "default chatml template (choose another with --chat-template NAME)\n",
                 b.model_name.c_str());
  }
  gateway::Gateway& gw = *b.gateway;

  http::HttpServerOptions ho;
  ho.host_memory = [&env, &b] { return host_memory_status(env, b); };
  if (b.observe_device) ho.device_memory = [&b] { return device_memory_status(b); };
  ho.journal = b.journal;
  ho.host = o.host;
  ho.port = o.port;
  ho.model_name = b.model_name;
  ho.model_aliases = o.aliases;
  ho.chat_template = *chat_template;
  ho.chat_template_default = default_template;
  ho.log_requests = o.log_requests;
  ho.admin_token = o.admin_token;
  ho.api_keys = *keys;
  ho.insecure_no_auth = o.insecure_no_auth;
  ho.transport.max_body_bytes = static_cast<size_t>(*max_body);
  ho.transport.max_connections = o.max_connections;
  ho.transport.allowed_hosts = o.allowed_hosts;
  ho.transport.max_connections_per_client = o.max_connections_per_client;
  ho.transport.idle_timeout = seconds_ms(o.idle_timeout_s);
  ho.transport.header_timeout = seconds_ms(o.header_timeout_s);
  ho.transport.body_timeout = seconds_ms(o.body_timeout_s);
  auto server = http::HttpServer::create(env, gw, ho);
  if (!server.ok()) return fail(server.status());
  Status started = (*server)->start();
  if (!started.ok()) return fail(started);
  if (!http::is_loopback_host(o.host) && (*keys)->empty()) {
    std::fprintf(stderr, "spillway serve: warning: listening on %s without authentication (--insecure-no-auth)\n",
                 o.host.c_str());
  }
  if (!(*keys)->empty()) {
    std::fprintf(stderr, "spillway serve: %zu API keys; /v1/* and /metrics need Authorization: Bearer <key>\n",
                 (*keys)->size());
  }
  const std::string tmpl = std::string(chat_template_name(**chat_template)) + (default_template ? "(default)" : "");
  std::string paths;
  for (const gateway::ExecutionPath& p : gw.paths()) {
    paths += (paths.empty() ? "" : ",") + p.name + ":" + p.placement;
  }
  const serve::Scheduler& first = *gw.primary().scheduler;
  std::printf(
      "spillway: listening on http://%s:%d model=%s ctx=%d workers=%d queue=%d chat_template=%s "
      "placement=%s paths=%s\n",
      o.host.c_str(), (*server)->port(), b.model_name.c_str(), first.n_ctx(), first.n_workers(),
      first.queue_capacity(), tmpl.c_str(), first.placement().c_str(), paths.c_str());
  std::fflush(stdout);

  const int sig = wait_stop_signal(-1);
  std::fprintf(stderr, "spillway serve: %s received, stopping (grace %.0f s; signal again to cancel and exit)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_s);
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
  // Why the bounds: a worker inside a device call that hangs (a submission
  // the driver never finishes, a slow device) cannot be joined, and a
  // server that ignores SIGTERM is killed by its supervisor anyway, later
  // and without saying why. The drain runs on its own thread; the main
  // thread only waits, and leaves without it when the bounds run out.
  constexpr auto kStopMargin = std::chrono::seconds(5);    // cancellations landing, handlers writing
  constexpr auto kCancelWindow = std::chrono::seconds(1);  // after the second signal
  auto drained = std::make_shared<std::atomic<bool>>(false);
  std::thread drainer([&gw, grace, drained] {
    gw.shutdown(grace);
    drained->store(true);
  });
  std::thread canceller;
  auto leave_now = [](const char* why) {
    std::fprintf(stderr, "spillway serve: %s; exiting without it (the journal marks unfinished requests "
                 "interrupted at the next start)\n", why);
    std::fflush(nullptr);
    std::_Exit(1);  // no destructors: they would join the threads that do not return
  };
  const auto give_up_at = std::chrono::steady_clock::now() + grace + kStopMargin;
  while (!drained->load()) {
    if (wait_stop_signal(100) != 0) {
      std::fprintf(stderr, "spillway serve: cancelling in-flight requests\n");
      canceller = std::thread([&gw] { gw.shutdown(std::chrono::milliseconds(0)); });
      const auto cancel_by = std::chrono::steady_clock::now() + kCancelWindow;
      while (!drained->load() && std::chrono::steady_clock::now() < cancel_by) (void)wait_stop_signal(20);
      if (!drained->load()) leave_now("the cancelled requests did not end within 1 s");
      break;
    }
    if (std::chrono::steady_clock::now() >= give_up_at) leave_now("the drain did not end within the grace and 5 s");
  }
  drainer.join();
  if (canceller.joinable()) canceller.join();
  // Handlers have their final events by now; let them write them, then close.
  (*server)->stop();
  serve::SchedulerStats total;
  for (const gateway::ExecutionPath& p : gw.paths()) {
    const serve::SchedulerStats st = p.scheduler->stats();
    total.done += st.done;
    total.cancelled += st.cancelled;
    total.failed += st.failed;
    total.rejected += st.rejected;
  }
  std::fprintf(stderr, "spillway serve: stopped (done %llu, cancelled %llu, failed %llu, rejected %llu)\n",
               static_cast<unsigned long long>(total.done), static_cast<unsigned long long>(total.cancelled),
               static_cast<unsigned long long>(total.failed), static_cast<unsigned long long>(total.rejected));
  return 0;
}

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

}  // namespace

void add_serve(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeCliOptions>();
  gateway::GatewayOptions& g = o->g;
  CLI::App* sub = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API over one or more execution paths "
                                              "(GPU, hybrid, CPU fallback) with per-request admission");
  // Every flag is also a key of the TOML file given with --config (the same
  // name without the leading dashes, e.g. `cpu-queue = 8`); flags given on
  // the command line win. `--dump-config` prints every key with its default.
  // Added before the other options: see add_config_file_options.
  add_config_file_options(*sub);
  auto section = [sub](const char* name) { return sub->add_option_group(name); };
  CLI::Option_group* srv = section("server");
  srv->add_option("--model,-m", g.model, "GGUF model file")->required();
  srv->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  srv->add_option("--port", o->port, "Port (0 = pick a free one)")->capture_default_str()->check(CLI::Range(0, 65535));
  srv->add_option("--alias", o->aliases,
                  "Another id for the served model in requests' `model` field (repeatable), e.g. the name a "
                  "client is configured with; /v1/models lists it; an unknown id is a 404 model_not_found");
  srv->add_option("--threads,-t", g.threads, "CPU threads for the engine (0 = all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  srv->add_option("--chat-template", g.chat_template,
                  "Chat template for /v1/chat/completions, overriding the model's tokenizer.chat_template "
                  "(e.g. chatml, llama2, llama3, mistral, zephyr, gemma)");
  srv->add_option("--grace", o->grace_s, "Seconds in-flight requests get to finish on SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  srv->add_flag("--log-requests", o->log_requests, "Log one line per HTTP request to stderr");
  srv->add_option("--admin-token", o->admin_token,
                  "Enables the admin API (POST/GET/DELETE /v1/admin/faults: arm faults on the GPU for drills) "
                  "for loopback clients sending 'Authorization: Bearer TOKEN'; off when empty")
      ->check(key_rules("the admin token (--admin-token)", /*allow_empty=*/true));
  CLI::Option_group* cl = section("clients");
  cl->add_option("--api-key", o->api_keys,
                 "An API key (repeatable; at least 16 printable characters): with keys, /v1/* and /metrics need "
                 "'Authorization: Bearer KEY' and each key sees only its own requests")
      ->check(key_rules("an API key (--api-key)"));
  cl->add_option("--api-key-hash", o->api_key_hashes,
                 "An API key as 'sha256:HEX' (repeatable; for config files, so they hold no secret; "
                 "`spillway hash-key` prints one)");
  cl->add_flag("--insecure-no-auth", o->insecure_no_auth,
               "Allow a non-loopback --host without any API key (every client on the network is one user)");
  cl->add_option("--max-body", o->max_body, "Largest request body, after de-chunking (413 beyond)")->capture_default_str()
      ->type_name("SIZE");
  cl->add_option("--max-connections", o->max_connections, "Open connections in all (past it: health and status only)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cl->add_option("--allowed-host", o->allowed_hosts,
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
  cl->add_option("--max-connections-per-client", o->max_connections_per_client,
                 "Open connections from one address (past it: health and status only)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cl->add_option("--idle-timeout", o->idle_timeout_s, "Seconds an idle keep-alive connection stays open")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cl->add_option("--header-timeout", o->header_timeout_s,
                 "Seconds a request's line and headers may take to arrive once it started (408 after)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cl->add_option("--body-timeout", o->body_timeout_s, "Seconds a request body may take to arrive (408 after)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  srv->add_flag_function(
      "--no-warmup", [o](int64_t) { o->g.warmup = false; },
      "Skip the one tiny request per path at start (it compiles shaders and measures first rates)");

  CLI::Option_group* first = section("first-choice path");
  first->add_option("--device", g.device, "cpu, vulkan[:i|:name] or hybrid:N[:i] (embedding and first N layers on Vulkan)")
      ->capture_default_str();
  first->add_option("--parallel", g.parallel, "Requests the first path generates at once (workers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  first->add_flag("!--no-batching", g.batching,
                   "Let each worker pass over the weights alone (default: a path's workers decode their next tokens "
                   "and feed new prompts in chunks in one shared pass, continuous batching)");
  first->add_option("--batch-max-wait-us", g.batch_max_wait_us,
                    "How long a batched decode step waits for a worker busy elsewhere before it starts without it")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  first->add_option("--step-tokens", g.step_tokens,
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
  first->add_option("--kv-type", g.kv_type,
                    "KV cache element type of every path: f16 (as llama.cpp), f32, or q8_0 (CPU only; about "
                    "half of f16's memory)")
      ->capture_default_str();
  first->add_option("--kv-blocks", g.kv_blocks,
                    "KV pool of the first path in blocks of 16 positions, shared by its requests "
                    "(0 = what the memory allows, up to parallel x ctx)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  CLI::Option_group* fb = section("CPU fallback path");
  fb->add_flag_function(
      "--no-cpu-fallback", [o](int64_t) { o->g.cpu_fallback = false; },
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
  fb->add_option("--replica", g.replica,
                 "How the CPU path holds its model: warm (read in at start), mmap (read in by its first request), "
                 "on-demand (loaded by its first request) or auto (the lightest that fits --recovery-budget-ms)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "warm", "mmap", "on-demand"}));
  fb->add_option("--recovery-budget-ms", g.recovery_budget_ms,
                 "auto replica: the longest measured load + page-in time the CPU path's first request may wait")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  CLI::Option_group* off = section("offload path");
  off->add_option("--offload-layers", g.offload_layers,
                  "With --device vulkan: also serve a hybrid path with this many layers on the GPU (sharing the "
                  "GPU path's weights) for prompts the GPU path's KV cannot hold (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  off->add_option("--offload-queue", g.offload_queue, "Requests that may wait on the offload path")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  CLI::Option_group* mem = section("memory");
  mem->add_option("--host-memory-share", g.host_memory_share,
                  "Share of MemAvailable the server may use (the cgroup's room counts at 0.8)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  mem->add_option("--host-budget", g.host_budget, "Fixed ceiling on the host memory budget, e.g. 2GiB")
      ->type_name("SIZE");
  mem->add_option("--device-memory", g.device_memory,
                  "Device memory Spillway may use, e.g. 8GiB (default: the largest device-local heap)")
      ->type_name("SIZE");
  mem->add_option("--device-headroom", g.device_headroom,
                  "Device memory always kept free, e.g. 512MiB (on top of --device-headroom-share)")
      ->capture_default_str()
      ->type_name("SIZE");
  mem->add_option("--device-headroom-share", g.device_headroom_share,
                  "Share of the device capacity always kept free (kernels, driver, bursts)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.95));
  mem->add_option("--co-tenant", g.co_tenants,
                  "Another service's device memory, NAME=SIZE (repeatable), e.g. whisper=3GiB (see also POST "
                  "/v1/reservations and `spillway reserve`)");
  mem->add_option("--reservation-max-share", g.reservation_max_share,
                  "Share of the GPU's (CPU-only: the host budget's) safe limit that clients' reservations may hold in "
                  "all; below 1 a reservation that would leave a model no path is also refused, 1 allows it")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));

  CLI::Option_group* adm = section("admission");
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
                  "path's first request: bandwidth / bytes a decode step streams); 0: measured at start (~120-150 ms on the reference machine)")
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
  adm->add_option("--overflow", g.overflow,
                  "planned; or a drill baseline: none (no redirect or failover) or naive (free-memory check only)")
      ->capture_default_str();

  CLI::Option_group* cb = section("circuit breaker");
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

  CLI::Option_group* jr = section("journal");
  jr->add_option("--journal", g.journal,
                 "SQLite request journal (default $XDG_STATE_HOME or ~/.local/state /spillway/journal.sqlite; "
                 "'none' for no journal, no Idempotency-Key and no GET /v1/requests/{id})");
  jr->add_option("--journal-retention-hours", g.journal_retention_hours, "How long finished requests stay in the journal")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 24.0 * 3650));
  jr->add_option("--journal-max-bytes", o->journal_max_bytes,
                 "Size budget of the journal, its WAL included (e.g. 512MiB; 0: none): finished requests are pruned, "
                 "oldest first, to keep within it, and a new request that cannot fit is refused (503 journal_full)")
      ->capture_default_str()
      ->type_name("SIZE");
  jr->add_option("--journal-max-body-bytes", o->journal_max_body_bytes,
                 "Request bodies larger than this are dropped from the journal once nothing can run from them "
                 "(the request finished, or failed for good); its size and digest stay (0: keep every body)")
      ->capture_default_str()
      ->type_name("SIZE");
  jr->add_option("--checkpoint-every", g.checkpoint_every,
                 "Write a running request's checkpoint to the journal every N generated tokens (0: only when it is "
                 "interrupted); a resume after a crash continues from the last one")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  sub->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace spw::app
