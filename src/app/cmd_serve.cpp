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

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission/ledger.h"
#include "app/commands.h"
#include "app/serve_options.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/env.h"
#include "core/size.h"
#include "device/host_memory.h"
#include "gateway/builder.h"
#include "http/models.h"
#include "http/server.h"

namespace spw::app {
namespace {

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

// The template /v1/chat/completions uses, and whether it is the default.
struct ServeChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kChatML;
  bool is_default = false;
};

// --chat-template, else the model's, else the default; nullopt (after saying
// why on stderr) when --chat-template names none Spillway knows.
std::optional<ServeChatTemplate> serve_chat_template(const gateway::BuiltGateway& b, const ServeCliOptions& o) {
  auto chat_template = http::resolve_chat_template(b.model->file(), o.g.chat_template);
  if (!chat_template.ok()) {
    std::fprintf(stderr, "spillway serve: --chat-template: %s\n", chat_template.status().message().c_str());
    return std::nullopt;
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
  return ServeChatTemplate{**chat_template, default_template};
}

// The HTTP server's options: the flags', the built gateway's model and
// journal, and /health's memory readings over `env` and `b` (which must
// outlive the server).
http::HttpServerOptions http_server_options(Env& env, gateway::BuiltGateway& b, const ServeCliOptions& o,
                                            const std::shared_ptr<http::ApiKeys>& keys, uint64_t max_body,
                                            const ServeChatTemplate& chat_template) {
  http::HttpServerOptions ho;
  ho.host_memory = [&env, &b] { return host_memory_status(env, b); };
  if (b.observe_device) ho.device_memory = [&b] { return device_memory_status(b); };
  ho.journal = b.journal;
  ho.host = o.host;
  ho.port = o.port;
  ho.model_name = b.model_name;
  ho.model_aliases = o.aliases;
  ho.chat_template = chat_template.kind;
  ho.chat_template_default = chat_template.is_default;
  for (const gateway::CatalogueEntry& e : b.catalogue) {
    http::HttpServerOptions::CatalogueModel m;
    m.id = e.name;
    m.unavailable = e.available ? "" : e.reason;
    // The file's own template, else ChatML as for the served model (named
    // as the default in its chat responses).
    if (e.chat_template) {
      if (Result<ChatTemplateKind> k = detect_chat_template(*e.chat_template); k.ok()) m.chat_template = *k;
    }
    if (!m.chat_template) {
      m.chat_template = ChatTemplateKind::kChatML;
      m.chat_template_default = true;
    }
    ho.catalogue.push_back(std::move(m));
  }
  ho.log_requests = o.log_requests;
  ho.admin_token = o.admin_token;
  ho.api_keys = keys;
  ho.insecure_no_auth = o.insecure_no_auth;
  ho.transport.max_body_bytes = static_cast<size_t>(max_body);
  ho.transport.max_connections = o.max_connections;
  ho.transport.allowed_hosts = o.allowed_hosts;
  ho.transport.max_connections_per_client = o.max_connections_per_client;
  ho.transport.idle_timeout = seconds_ms(o.idle_timeout_s);
  ho.transport.header_timeout = seconds_ms(o.header_timeout_s);
  ho.transport.body_timeout = seconds_ms(o.body_timeout_s);
  return ho;
}

// The warnings about keys, then the "listening" line on stdout.
void announce_listening(const ServeCliOptions& o, const gateway::BuiltGateway& b, const http::ApiKeys& keys, int port,
                        const ServeChatTemplate& chat_template) {
  const gateway::Gateway& gw = *b.gateway;
  if (!http::is_loopback_host(o.host) && keys.empty()) {
    std::fprintf(stderr, "spillway serve: warning: listening on %s without authentication (--insecure-no-auth)\n",
                 o.host.c_str());
  }
  if (!keys.empty()) {
    std::fprintf(stderr, "spillway serve: %zu API keys; /v1/* and /metrics need Authorization: Bearer <key>\n",
                 keys.size());
  }
  const std::string tmpl =
      std::string(chat_template_name(chat_template.kind)) + (chat_template.is_default ? "(default)" : "");
  std::string paths;
  for (const gateway::ExecutionPath& p : gw.paths()) {
    paths += (paths.empty() ? "" : ",") + p.name + ":" + p.placement;
  }
  const serve::Scheduler& first = *gw.primary().scheduler;
  std::printf(
      "spillway: listening on http://%s:%d model=%s ctx=%d workers=%d queue=%d chat_template=%s "
      "placement=%s paths=%s\n",
      o.host.c_str(), port, b.model_name.c_str(), first.n_ctx(), first.n_workers(), first.queue_capacity(),
      tmpl.c_str(), first.placement().c_str(), paths.c_str());
  std::fflush(stdout);
}

// From the first stop signal: drain the gateway within the grace (a second
// signal cancels what runs), stop the server, print the totals. Leaves with
// _Exit(1) when the bounds run out.
void stop_serving(gateway::Gateway& gw, http::HttpServer& server, double grace_s) {
  const int sig = wait_stop_signal(-1);
  std::fprintf(stderr, "spillway serve: %s received, stopping (grace %.0f s; signal again to cancel and exit)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", grace_s);
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
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
    std::fprintf(stderr,
                 "spillway serve: %s; exiting without it (the journal marks unfinished requests "
                 "interrupted at the next start)\n",
                 why);
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
  server.stop();
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
  // The flags' text into typed options (a value that does not parse names
  // its flag); the ranges and combinations are build_gateway's.
  auto g = gateway_options(o);
  if (!g.ok()) return fail(g.status());
  // Checked before the model loads (seconds to minutes), with the ids the
  // files will be served under; the server checks again with the built paths.
  std::vector<std::string> fallback_ids;
  if (!o.g.fallback_model.empty()) fallback_ids.push_back(gateway::model_name_from_path(o.g.fallback_model));
  if (Status st = http::validate_aliases(o.aliases, gateway::model_name_from_path(g->model), fallback_ids); !st.ok()) {
    return fail(st);
  }
  auto built = gateway::build_gateway(env, *g);
  if (!built.ok()) return fail(with_flags(built.status()));
  gateway::BuiltGateway& b = *built;
  for (const std::string& line : b.log) std::fprintf(stderr, "spillway serve: %s\n", line.c_str());
  if (b.journal) {
    std::fprintf(
        stderr, "spillway serve: journal %s (%lld interrupted requests from an earlier run marked failed, resumable)\n",
        b.journal->path().c_str(), static_cast<long long>(b.journal->recovered()));
  }
  const std::optional<ServeChatTemplate> chat_template = serve_chat_template(b, o);
  if (!chat_template) return 1;
  gateway::Gateway& gw = *b.gateway;

  auto server = http::HttpServer::create(env, gw, http_server_options(env, b, o, *keys, *max_body, *chat_template));
  if (!server.ok()) return fail(server.status());
  Status started = (*server)->start();
  if (!started.ok()) return fail(started);
  announce_listening(o, b, **keys, (*server)->port(), *chat_template);

  stop_serving(gw, **server, o.grace_s);
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeCliOptions>();
  CLI::App* sub = app.add_subcommand("serve",
                                     "Serve an OpenAI-compatible HTTP API over one or more execution paths "
                                     "(GPU, hybrid, CPU fallback) with per-request admission");
  // Every flag is also a key of the TOML file given with --config (the same
  // name without the leading dashes, e.g. `cpu-queue = 8`); flags given on
  // the command line win. `--dump-config` prints every key with its default.
  // Added before the other options: see add_config_file_options.
  add_config_file_options(*sub);
  add_serve_options(*sub, *o);
  sub->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace spw::app
