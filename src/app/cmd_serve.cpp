// `spillway serve --model M`: the OpenAI-compatible HTTP server over the CPU
// engine. Prints "spillway: listening on http://HOST:PORT model=..." once it
// accepts connections; SIGINT/SIGTERM stop it gracefully (running and queued
// requests get --grace seconds to finish, a second signal cancels them), then
// it exits 0. Before loading the model it checks that the plan (weights,
// KV pool, every worker's scratch) fits the host memory budget, and refuses to
// start, naming the numbers, when it does not.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "admission/estimator.h"
#include "admission/ledger.h"
#include "app/commands.h"
#include "backend/vulkan/device_spec.h"
#include "core/env.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "gguf/gguf.h"
#include "http/server.h"
#include "model/model.h"
#include "serve/cpu_executor.h"

namespace spw::app {
namespace {

struct ServeCliOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int threads = 0;  // 0: hardware threads
  int32_t ctx = 0;
  int32_t parallel = 1;
  int32_t queue = 64;
  int32_t kv_blocks = 0;
  std::string chat_template;
  double grace_s = 10;
  bool log_requests = false;
  double host_memory_share = 0.5;  // of MemAvailable (and 0.8 of the cgroup's room)
  std::string host_budget;         // fixed ceiling, e.g. "2GiB"; empty = none
};

std::string model_name_from_path(const std::string& path);

// The host ledger's inputs from the probes; a figure the probes cannot read is
// an error (serving without knowing the host's memory is what we refuse).
Result<admission::HostReadings> host_readings(Env& env) {
  const device::HostMemory hm = device::HostMemoryProbe(env).read();
  if (!hm.mem_available_bytes.known()) {
    return Status::unavailable("host memory budget: MemAvailable unknown: " + hm.mem_available_bytes.reason());
  }
  admission::HostReadings r;
  r.mem_available = hm.mem_available_bytes.value();
  const device::CgroupMemory cg = device::CgroupProbe(env).read();
  if (cg.effective_max.known() && !cg.effective_max.value().unlimited && cg.current_bytes.known()) {
    r.cgroup_max = cg.effective_max.value().bytes;
    r.cgroup_current = cg.current_bytes.value();
  }
  return r;
}

// Reserves the plan's host memory before anything is loaded: weights (the
// whole prefaulted mapping), the KV pool, the model's heap and every worker's
// scratch, from the estimator, minus what the process already holds (it is
// already out of MemAvailable). The ledger stays with the server.
struct HostPlan {
  std::unique_ptr<admission::HostLedger> ledger;
  admission::Ticket ticket;
  uint64_t bytes = 0;
};

Result<HostPlan> reserve_host_plan(Env& env, const ServeCliOptions& o, int n_threads, std::string& summary) {
  admission::Plan plan;
  plan.placement = admission::Placement::kCpu;
  plan.n_ctx = o.ctx;
  plan.n_parallel = o.parallel;
  plan.n_threads = n_threads;
  plan.kv_blocks = o.kv_blocks;
  admission::EstimatorConfig cfg;
  const auto rss = device::HostMemoryProbe(env).read().process_rss_bytes;
  if (rss.known()) cfg.host.fixed_overhead = rss.value();
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(env, o.model));
  {
    // The server's sessions: ubatch 64 (or the context when smaller), the
    // last row of logits per eval.
    SPW_ASSIGN_OR_RETURN(LlamaHparams hp, read_llama_hparams(*file));
    const int32_t n_ctx = o.ctx > 0 ? o.ctx : hp.n_ctx_train;
    plan.n_batch = n_ctx;
    plan.n_ubatch = std::min(64, n_ctx);
  }
  SPW_ASSIGN_OR_RETURN(admission::Estimate est, admission::estimate(*file, plan, cfg));
  admission::HostBudgetPolicy pol;
  pol.mem_available_share = o.host_memory_share;
  if (!o.host_budget.empty()) {
    auto cap = parse_memory_size(o.host_budget);
    if (!cap.ok()) return cap.status().with_context("--host-budget " + o.host_budget);
    pol.cap_bytes = *cap;
  }
  SPW_ASSIGN_OR_RETURN(admission::HostReadings readings, host_readings(env));
  SPW_ASSIGN_OR_RETURN(auto ledger, admission::HostLedger::create("host", pol, readings));
  const admission::DeviceEstimate& h = est.host();
  const uint64_t need = h.total() > cfg.host.fixed_overhead ? h.total() - cfg.host.fixed_overhead : 0;
  auto ticket = ledger->reserve({admission::OwnerKind::kModelWeights, model_name_from_path(o.model)}, need);
  if (!ticket.ok()) {
    return Status::resource_exhausted(
        "the plan does not fit in host memory: it needs " + admission::format_bytes(need) + " (weights " +
        admission::format_bytes(h.weights.bytes) + ", KV " + admission::format_bytes(h.kv.bytes) + " for " +
        std::to_string(est.plan.n_parallel) + " x ctx " + std::to_string(est.plan.n_ctx) + ", scratch " +
        admission::format_bytes(h.scratch.bytes + h.logits.bytes) + ", allowance " +
        admission::format_bytes(h.allowance()) + "); " + ticket.status().message() +
        ". Lower --ctx, --parallel or --kv-blocks, or raise --host-memory-share / --host-budget");
  }
  const admission::LedgerSnapshot snap = ledger->snapshot();
  summary = "host memory: plan reserves " + admission::format_bytes(need) + " of a " +
            admission::format_bytes(snap.limit) + " budget (bound by " + ledger->binding_limit() + ")";
  return HostPlan{std::move(ledger), *ticket, need};
}

// /health's host_memory: fresh readings into the ledger, then its figures and
// the process's own RSS.
http::HealthMemory host_memory_status(Env& env, admission::HostLedger& ledger) {
  if (auto r = host_readings(env); r.ok()) ledger.update(*r);
  const admission::LedgerSnapshot snap = ledger.snapshot();
  http::HealthMemory m;
  m.budget = snap.limit;
  m.reserved = snap.reserved_ours;
  m.available = snap.available;
  m.bound_by = ledger.binding_limit();
  const device::HostMemory hm = device::HostMemoryProbe(env).read();
  auto opt = [](const device::Reading<uint64_t>& v) {
    return v.known() ? std::optional<uint64_t>(v.value()) : std::nullopt;
  };
  m.process_rss = opt(hm.process_rss_bytes);
  m.process_rss_anon = opt(hm.process_rss_anon_bytes);
  m.process_rss_file = opt(hm.process_rss_file_bytes);
  return m;
}

std::string model_name_from_path(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.starts_with("127.");
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
  const int n_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string memory_summary;
  auto host_plan = reserve_host_plan(env, o, n_threads, memory_summary);
  if (!host_plan.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", host_plan.status().to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "spillway serve: %s\n", memory_summary.c_str());
  auto model = Model::load(env, o.model);
  if (!model.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", model.status().to_string().c_str());
    return 1;
  }
  auto chat_template = http::resolve_chat_template((*model)->file(), o.chat_template);
  if (!chat_template.ok()) {
    std::fprintf(stderr, "spillway serve: --chat-template: %s\n", chat_template.status().message().c_str());
    return 1;
  }

  serve::CpuServeOptions so;
  so.n_workers = o.parallel;
  so.n_threads = n_threads;
  so.n_ctx = o.ctx;
  so.kv_blocks = o.kv_blocks;
  so.queue_capacity = o.queue;
  auto scheduler = serve::make_cpu_scheduler(env, *model, so);
  if (!scheduler.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", scheduler.status().to_string().c_str());
    return 1;
  }

  // The plan is allocated now (weights mapped resident, KV pool committed):
  // later readings include it, so the ledger holds it as committed.
  admission::HostLedger& ledger = *host_plan->ledger;
  if (Status c = ledger.commit(host_plan->ticket, host_plan->bytes); !c.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", c.to_string().c_str());
    return 1;
  }

  http::HttpServerOptions ho;
  ho.host_memory = [&env, &ledger] { return host_memory_status(env, ledger); };
  ho.host = o.host;
  ho.port = o.port;
  ho.model_name = model_name_from_path(o.model);
  ho.chat_template = *chat_template;
  ho.log_requests = o.log_requests;
  auto server = http::HttpServer::create(env, **scheduler, ho);
  if (!server.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", server.status().to_string().c_str());
    return 1;
  }
  Status started = (*server)->start();
  if (!started.ok()) {
    std::fprintf(stderr, "spillway serve: %s\n", started.to_string().c_str());
    return 1;
  }
  if (!is_loopback(o.host)) {
    std::fprintf(stderr, "spillway serve: warning: listening on %s without authentication\n", o.host.c_str());
  }
  const std::string tmpl = *chat_template ? std::string(chat_template_name(**chat_template)) : "none";
  std::printf("spillway: listening on http://%s:%d model=%s ctx=%d workers=%d queue=%d threads=%d chat_template=%s\n",
              o.host.c_str(), (*server)->port(), ho.model_name.c_str(), (*scheduler)->n_ctx(), so.n_workers,
              so.queue_capacity, so.n_threads, tmpl.c_str());
  std::fflush(stdout);

  const int sig = wait_stop_signal(-1);
  std::fprintf(stderr, "spillway serve: %s received, stopping (grace %.0f s; signal again to cancel)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_s);
  serve::Scheduler* sched = scheduler->get();
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
  std::thread drainer([sched, grace] { sched->shutdown(grace); });
  // Wait for the drain, but a second signal cuts the grace short.
  for (;;) {
    const serve::SchedulerStats st = sched->stats();
    if (st.running == 0 && st.queue_depth == 0) break;
    if (wait_stop_signal(100) != 0) {
      std::fprintf(stderr, "spillway serve: cancelling in-flight requests\n");
      sched->shutdown(std::chrono::milliseconds(0));
      break;
    }
  }
  drainer.join();
  // Handlers have their final events by now; let them write them, then close.
  (*server)->stop();
  const serve::SchedulerStats st = sched->stats();
  std::fprintf(stderr, "spillway serve: stopped (done %llu, cancelled %llu, failed %llu, rejected %llu)\n",
               static_cast<unsigned long long>(st.done), static_cast<unsigned long long>(st.cancelled),
               static_cast<unsigned long long>(st.failed), static_cast<unsigned long long>(st.rejected));
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeCliOptions>();
  CLI::App* sub = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API over the CPU engine");
  sub->add_option("--model,-m", o->model, "GGUF model file")->required();
  sub->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", o->port, "Port (0 = pick a free one)")->capture_default_str()->check(CLI::Range(0, 65535));
  sub->add_option("--threads,-t", o->threads, "CPU threads for the engine (0 = all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--ctx,-c", o->ctx, "Context positions per request (0 = the model's context_length)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--parallel", o->parallel, "Requests generated at once (workers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--queue", o->queue, "Requests that may wait for a worker; more get HTTP 429")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--kv-blocks", o->kv_blocks, "KV cache blocks of 16 positions (0 = parallel full contexts)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--chat-template", o->chat_template,
                  "Chat template for /v1/chat/completions, overriding the model's tokenizer.chat_template "
                  "(e.g. chatml, llama2, llama3, mistral, zephyr, gemma)");
  sub->add_option("--grace", o->grace_s, "Seconds in-flight requests get to finish on SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--log-requests", o->log_requests, "Log one line per HTTP request to stderr");
  sub->add_option("--host-memory-share", o->host_memory_share,
                  "Share of MemAvailable the plan may use (the cgroup's room counts at 0.8)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  sub->add_option("--host-budget", o->host_budget, "Fixed ceiling on the host memory budget, e.g. 2GiB");
  sub->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace spw::app
