// `spillway serve --model M [--device cpu|vulkan[:i]|hybrid:N]`: the
// OpenAI-compatible HTTP server over the engine, placed on the CPU, one Vulkan
// device or split between them. Prints "spillway: listening on
// http://HOST:PORT model=..." once it accepts connections; SIGINT/SIGTERM stop
// it gracefully (running and queued requests get --grace seconds to finish, a
// second signal cancels them), then it exits 0. Before loading the model it
// checks that the plan (weights, KV pools, every worker's scratch) fits the
// host memory budget and, for a GPU placement, the device ledger (capacity
// minus headroom, co-tenants' declared reservations, others' use observed
// through VK_EXT_memory_budget), and refuses to start, naming the numbers,
// when it does not.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
#include "journal/journal.h"
#include "serve/engine_executor.h"
#include "serve/journal_observer.h"

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
  std::string device = "cpu";      // cpu | vulkan[:i] | hybrid:N[:i]
  std::string device_memory;       // Vulkan budget, e.g. "8GiB"; empty = the largest device-local heap
  std::string device_headroom = "0";   // absolute device headroom
  double device_headroom_share = 0.05;  // of the device ledger's capacity
  std::vector<std::string> co_tenants;  // NAME=SIZE: other services' declared device memory
  std::string journal;                  // SQLite file; "" = the default place; "none" = no journal
  double journal_retention_hours = 168;
};

// $XDG_STATE_HOME/spillway/journal.sqlite, else ~/.local/state/spillway/...
Result<std::string> default_journal_path() {
  std::string base;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && x[0] == '/') base = x;
  else if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') base = std::string(h) + "/.local/state";
  else return Status::invalid_argument("no HOME or XDG_STATE_HOME to put the journal in: pass --journal PATH or --journal none");
  return base + "/spillway/journal.sqlite";
}

// Opens (creating its folder) the request journal; null for "none".
Result<std::shared_ptr<journal::Journal>> open_journal(Env& env, const ServeCliOptions& o) {
  if (o.journal == "none") return std::shared_ptr<journal::Journal>();
  std::string path = o.journal;
  if (path.empty()) {
    SPW_ASSIGN_OR_RETURN(path, default_journal_path());
  }
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Status::io_error("journal folder " + parent.string() + ": " + ec.message());
  journal::JournalOptions jo;
  jo.retention_ms = static_cast<int64_t>(o.journal_retention_hours * 3600 * 1000);
  SPW_ASSIGN_OR_RETURN(std::unique_ptr<journal::Journal> j, journal::Journal::open(env, path, jo));
  return std::shared_ptr<journal::Journal>(std::move(j));
}

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

// The serving plan's estimate: the server's sessions (ubatch 64, or the
// context when smaller; the last row of logits per eval) placed as --device
// says, with the host baseline observed now and the GPU's buffer limit from
// the opened device.
Result<admission::Estimate> serving_estimate(Env& env, const gguf::GgufFile& file, const ServeCliOptions& o,
                                             int n_threads, int32_t n_gpu_layers, const VulkanBackend* vulkan,
                                             admission::EstimatorConfig& cfg) {
  SPW_ASSIGN_OR_RETURN(LlamaHparams hp, read_llama_hparams(file));
  admission::Plan plan;
  plan.placement = n_gpu_layers == 0           ? admission::Placement::kCpu
                   : n_gpu_layers == hp.n_layer ? admission::Placement::kGpu
                                                : admission::Placement::kHybrid;
  if (plan.placement == admission::Placement::kHybrid) plan.n_gpu_layers = n_gpu_layers;
  plan.n_ctx = o.ctx;
  plan.n_parallel = o.parallel;
  plan.n_threads = n_threads;
  plan.kv_blocks = o.kv_blocks;
  const int32_t n_ctx = o.ctx > 0 ? o.ctx : hp.n_ctx_train;
  plan.n_batch = n_ctx;
  plan.n_ubatch = std::min(64, n_ctx);
  const auto rss = device::HostMemoryProbe(env).read().process_rss_bytes;
  if (rss.known()) cfg.host.fixed_overhead = rss.value();
  if (vulkan) cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(vulkan->device_info());
  return admission::estimate(file, plan, cfg);
}

// `device_on_host`: the GPU's memory is host RAM (lavapipe, integrated GPUs
// share the system's memory), so the GPU part of the plan is host memory too.
Result<HostPlan> reserve_host_plan(Env& env, const ServeCliOptions& o, const admission::Estimate& est,
                                   const admission::EstimatorConfig& cfg, bool device_on_host,
                                   std::string& summary) {
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
  const uint64_t gpu_on_host = device_on_host ? est.gpu().total() : 0;
  const uint64_t need =
      (h.total() > cfg.host.fixed_overhead ? h.total() - cfg.host.fixed_overhead : 0) + gpu_on_host;
  auto ticket = ledger->reserve({admission::OwnerKind::kModelWeights, model_name_from_path(o.model)}, need);
  if (!ticket.ok()) {
    return Status::resource_exhausted(
        "the plan does not fit in host memory: it needs " + admission::format_bytes(need) + " (weights " +
        admission::format_bytes(h.weights.bytes) + ", KV " + admission::format_bytes(h.kv.bytes) + " for " +
        std::to_string(est.plan.n_parallel) + " x ctx " + std::to_string(est.plan.n_ctx) + ", scratch " +
        admission::format_bytes(h.scratch.bytes + h.logits.bytes) + ", allowance " +
        admission::format_bytes(h.allowance()) +
        (device_on_host ? ", the GPU's share, which is host memory on this device, " + admission::format_bytes(gpu_on_host)
                        : std::string()) +
        "); " + ticket.status().message() +
        ". Lower --ctx, --parallel or --kv-blocks, or raise --host-memory-share / --host-budget");
  }
  const admission::LedgerSnapshot snap = ledger->snapshot();
  summary = "host memory: plan reserves " + admission::format_bytes(need) + " of a " +
            admission::format_bytes(snap.limit) + " budget (bound by " + ledger->binding_limit() + ")" +
            (device_on_host ? ", the GPU's share included (its memory is host memory)" : "");
  return HostPlan{std::move(ledger), *ticket, need};
}

// The device side: a DeviceLedger over the backend's budget (--device-memory
// or the largest device-local heap) with the headroom and the co-tenants'
// declared reservations, fed the heap reading when the driver has
// VK_EXT_memory_budget, holding the plan's GPU total (every category's peak).
struct DevicePlan {
  std::shared_ptr<VulkanBackend> vulkan;
  std::unique_ptr<admission::DeviceLedger> ledger;
  admission::Ticket ticket;
  uint64_t bytes = 0;
  std::mutex mu;                     // observe_device() runs on /health's threads
  std::optional<uint64_t> heap_used;  // the last heap reading (everyone's use)
  std::string heap_unknown;           // why there is none
};

// Re-reads the device-local heap the allocator draws from (the largest) and
// feeds the ledger: used = heap size - budget + our usage, since
// VK_EXT_memory_budget's budget is what this process may still reach.
void observe_device(DevicePlan& d) {
  const DeviceMemoryStats ms = d.vulkan->memory_stats();
  const VulkanHeapInfo* heap = nullptr;
  for (const auto& h : ms.heaps)
    if (h.device_local && (!heap || h.size_bytes > heap->size_bytes)) heap = &h;
  std::lock_guard<std::mutex> lk(d.mu);
  if (!heap || heap->budget_bytes < 0 || heap->usage_bytes < 0) {
    d.heap_used.reset();
    d.heap_unknown = !heap ? "no device-local heap" : "VK_EXT_memory_budget not supported by " + d.vulkan->device_info().driver;
    return;
  }
  const uint64_t budget = static_cast<uint64_t>(heap->budget_bytes);
  const uint64_t usage = static_cast<uint64_t>(heap->usage_bytes);
  const uint64_t used = (heap->size_bytes > budget ? heap->size_bytes - budget : 0) + usage;
  d.heap_used = std::min(used, heap->size_bytes);
  d.heap_unknown.clear();
  d.ledger->observe_heap(heap->size_bytes, *d.heap_used);
}

Result<std::unique_ptr<DevicePlan>> reserve_device_plan(const ServeCliOptions& o, const admission::Estimate& est,
                                                        std::shared_ptr<VulkanBackend> vulkan, std::string& summary) {
  auto d = std::make_unique<DevicePlan>();
  d->vulkan = std::move(vulkan);
  admission::HeadroomPolicy headroom;
  headroom.fraction = o.device_headroom_share;
  if (o.device_headroom != "0") {
    auto h = parse_memory_size(o.device_headroom);
    if (!h.ok()) return h.status().with_context("--device-headroom " + o.device_headroom);
    headroom.bytes = *h;
  }
  const uint64_t capacity = d->vulkan->memory_stats().budget_bytes;
  auto ledger = admission::DeviceLedger::create(d->vulkan->name(), capacity, headroom);
  if (!ledger.ok()) return ledger.status().with_context("--device-headroom / --device-headroom-share");
  d->ledger = std::move(*ledger);
  for (const std::string& ct : o.co_tenants) {
    const size_t eq = ct.find('=');
    if (eq == 0 || eq == std::string::npos) {
      return Status::invalid_argument("--co-tenant " + ct + ": expected NAME=SIZE, e.g. whisper=3GiB");
    }
    auto bytes = parse_memory_size(ct.substr(eq + 1));
    if (!bytes.ok()) return bytes.status().with_context("--co-tenant " + ct);
    auto t = d->ledger->reserve({admission::OwnerKind::kCoTenant, ct.substr(0, eq)}, *bytes);
    if (!t.ok()) return t.status().with_context("--co-tenant " + ct);
  }
  observe_device(*d);
  const admission::DeviceEstimate& g = est.gpu();
  d->bytes = g.total();
  auto ticket = d->ledger->reserve({admission::OwnerKind::kModelWeights, model_name_from_path(o.model)}, d->bytes);
  if (!ticket.ok()) {
    return Status::resource_exhausted(
        "the plan does not fit in device memory on " + d->vulkan->name() + " (" + d->vulkan->device_info().name +
        "): it needs " + admission::format_bytes(d->bytes) + " (weights " + admission::format_bytes(g.weights.bytes) +
        ", KV " + admission::format_bytes(g.kv.bytes) + " for " + std::to_string(est.plan.n_parallel) + " x ctx " +
        std::to_string(est.plan.n_ctx) + ", scratch " + admission::format_bytes(g.scratch.bytes) +
        ", staging and overhead " + admission::format_bytes(g.overhead.bytes) + "); " + ticket.status().message() +
        ". Lower --ctx, --parallel or --kv-blocks, put fewer layers on the GPU (--device hybrid:N), or raise "
        "--device-memory");
  }
  d->ticket = *ticket;
  const admission::LedgerSnapshot snap = d->ledger->snapshot();
  summary = "device memory: plan reserves " + admission::format_bytes(d->bytes) + " of " +
            admission::format_bytes(snap.limit) + " on " + d->vulkan->name() + " (capacity " +
            admission::format_bytes(snap.capacity) + " - headroom " + admission::format_bytes(snap.headroom) +
            "; co-tenants " + admission::format_bytes(snap.reserved[static_cast<int>(admission::OwnerKind::kCoTenant)]) +
            ")";
  return d;
}

// /health's device_memory: a fresh heap reading into the ledger, its figures
// and the allocator's.
http::HealthDeviceMemory device_memory_status(DevicePlan& d) {
  observe_device(d);
  const admission::LedgerSnapshot snap = d.ledger->snapshot();
  const DeviceMemoryStats ms = d.vulkan->memory_stats();
  http::HealthDeviceMemory m;
  m.device = d.vulkan->name() + " (" + d.vulkan->device_info().name + ")";
  m.healthy = d.vulkan->healthy();
  m.health_reason = d.vulkan->health_reason();
  m.capacity = snap.capacity;
  m.headroom = snap.headroom;
  m.reserved = snap.reserved_ours;
  m.co_tenant_reserved = snap.reserved[static_cast<int>(admission::OwnerKind::kCoTenant)];
  m.others_observed = snap.others;
  m.available = snap.available;
  {
    std::lock_guard<std::mutex> lk(d.mu);
    m.observed_heap_used = d.heap_used;
    m.observed_unknown = d.heap_unknown;
  }
  m.allocated = ms.used_bytes;
  m.allocated_peak = ms.peak_bytes;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    m.allocated_by_category.emplace_back(memory_category_name(static_cast<MemoryCategory>(c)), ms.used_by_category[c]);
  }
  return m;
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
  auto fail = [](const Status& st, const std::string& what = "") {
    std::fprintf(stderr, "spillway serve: %s%s\n", what.c_str(), st.to_string().c_str());
    return 1;
  };
  auto spec = parse_device_spec(o.device);
  if (!spec.ok()) return fail(spec.status(), "--device: ");
  uint64_t device_memory = 0;
  if (!o.device_memory.empty()) {
    auto b = parse_memory_size(o.device_memory);
    if (!b.ok()) return fail(b.status(), "--device-memory: ");
    device_memory = *b;
  }
  auto file = gguf::GgufFile::open(env, o.model);
  if (!file.ok()) return fail(file.status());
  auto hp = read_llama_hparams(**file);
  if (!hp.ok()) return fail(hp.status());
  const int32_t n_gpu_layers = gpu_layer_count(*spec, hp->n_layer);
  // The device is opened (no model memory yet) before the plan is checked:
  // its budget and buffer limits are part of the estimate.
  std::shared_ptr<VulkanBackend> vulkan;
  if (n_gpu_layers > 0) {
    VulkanBackendOptions vo;
    vo.device = spec->vulkan_device;
    vo.memory_budget_bytes = device_memory;
    auto v = VulkanBackend::create(vo);
    if (!v.ok()) return fail(v.status(), "--device " + o.device + ": ");
    vulkan = std::move(*v);
  }
  admission::EstimatorConfig cfg;
  auto est = serving_estimate(env, **file, o, n_threads, n_gpu_layers, vulkan.get(), cfg);
  if (!est.ok()) return fail(est.status());
  file->reset();
  std::string memory_summary;
  const bool device_on_host =
      vulkan && (vulkan->device_info().type == "cpu" || vulkan->device_info().type == "integrated-gpu");
  auto host_plan = reserve_host_plan(env, o, *est, cfg, device_on_host, memory_summary);
  if (!host_plan.ok()) return fail(host_plan.status());
  std::fprintf(stderr, "spillway serve: %s\n", memory_summary.c_str());
  std::unique_ptr<DevicePlan> device_plan;
  if (vulkan) {
    auto d = reserve_device_plan(o, *est, vulkan, memory_summary);
    if (!d.ok()) return fail(d.status());
    device_plan = std::move(*d);
    std::fprintf(stderr, "spillway serve: %s\n", memory_summary.c_str());
  }
  auto journal = open_journal(env, o);
  if (!journal.ok()) return fail(journal.status(), "--journal: ");
  if (*journal) {
    std::fprintf(stderr, "spillway serve: journal %s (%lld interrupted requests from an earlier run marked failed, resumable)\n",
                 (*journal)->path().c_str(), static_cast<long long>((*journal)->recovered()));
  }
  auto model = Model::load(env, o.model);
  if (!model.ok()) return fail(model.status());
  auto chat_template = http::resolve_chat_template((*model)->file(), o.chat_template);
  if (!chat_template.ok()) {
    std::fprintf(stderr, "spillway serve: --chat-template: %s\n", chat_template.status().message().c_str());
    return 1;
  }

  serve::EngineServeOptions so;
  so.device = *spec;
  so.vulkan = vulkan;
  so.n_workers = o.parallel;
  so.n_threads = n_threads;
  so.n_ctx = o.ctx;
  so.kv_blocks = o.kv_blocks;
  so.queue_capacity = o.queue;
  if (*journal) so.observer = std::make_shared<serve::JournalObserver>(*journal);
  auto serving = serve::make_engine_scheduler(env, *model, so);
  if (!serving.ok()) return fail(serving.status());
  std::unique_ptr<serve::Scheduler>& scheduler = serving->scheduler;

  // The plan is allocated now (weights mapped resident, KV pools committed,
  // weights uploaded): later readings include it, so the ledgers hold it as
  // committed.
  admission::HostLedger& ledger = *host_plan->ledger;
  if (Status c = ledger.commit(host_plan->ticket, host_plan->bytes); !c.ok()) return fail(c);
  if (device_plan) {
    // What the allocator holds now, if the estimate fell short of it.
    const uint64_t held = std::max(device_plan->bytes, vulkan->memory_stats().used_bytes);
    if (Status c = device_plan->ledger->commit(device_plan->ticket, held); !c.ok()) return fail(c);
  }

  http::HttpServerOptions ho;
  ho.host_memory = [&env, &ledger] { return host_memory_status(env, ledger); };
  if (device_plan) ho.device_memory = [d = device_plan.get()] { return device_memory_status(*d); };
  ho.journal = *journal;
  ho.host = o.host;
  ho.port = o.port;
  ho.model_name = model_name_from_path(o.model);
  ho.chat_template = *chat_template;
  ho.log_requests = o.log_requests;
  auto server = http::HttpServer::create(env, *scheduler, ho);
  if (!server.ok()) return fail(server.status());
  Status started = (*server)->start();
  if (!started.ok()) return fail(started);
  if (!is_loopback(o.host)) {
    std::fprintf(stderr, "spillway serve: warning: listening on %s without authentication\n", o.host.c_str());
  }
  const std::string tmpl = *chat_template ? std::string(chat_template_name(**chat_template)) : "none";
  std::printf(
      "spillway: listening on http://%s:%d model=%s ctx=%d workers=%d queue=%d threads=%d chat_template=%s "
      "placement=%s\n",
      o.host.c_str(), (*server)->port(), ho.model_name.c_str(), scheduler->n_ctx(), so.n_workers, so.queue_capacity,
      so.n_threads, tmpl.c_str(), scheduler->placement().c_str());
  std::fprintf(stderr, "spillway serve: placement %s\n", serving->placement_detail.c_str());
  std::fflush(stdout);

  const int sig = wait_stop_signal(-1);
  std::fprintf(stderr, "spillway serve: %s received, stopping (grace %.0f s; signal again to cancel)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", o.grace_s);
  serve::Scheduler* sched = scheduler.get();
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
  CLI::App* sub = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (CPU, Vulkan or hybrid placement)");
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
  sub->add_option("--device", o->device, "cpu, vulkan[:i|:name] or hybrid:N[:i] (embedding and first N layers on Vulkan)")
      ->capture_default_str();
  sub->add_option("--device-memory", o->device_memory,
                  "Device memory Spillway may use, e.g. 8GiB (default: the largest device-local heap)");
  sub->add_option("--device-headroom", o->device_headroom,
                  "Device memory always kept free, e.g. 512MiB (on top of --device-headroom-share)")
      ->capture_default_str();
  sub->add_option("--device-headroom-share", o->device_headroom_share,
                  "Share of the device capacity always kept free (kernels, driver, bursts)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.95));
  sub->add_option("--journal", o->journal,
                  "SQLite request journal (default $XDG_STATE_HOME or ~/.local/state /spillway/journal.sqlite; "
                  "'none' for no journal, no Idempotency-Key and no GET /v1/requests/{id})");
  sub->add_option("--journal-retention-hours", o->journal_retention_hours,
                  "How long finished requests stay in the journal")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 24.0 * 3650));
  sub->add_option("--co-tenant", o->co_tenants,
                  "Another service's device memory, NAME=SIZE (repeatable), e.g. whisper=3GiB: reserved in the "
                  "device ledger before the plan");
  sub->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace spw::app
