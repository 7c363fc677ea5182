#include "gateway/builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "admission/bandwidth.h"
#include "admission/estimator.h"
#include "admission/prior.h"
#include "backend/vulkan/device_spec.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "gguf/gguf.h"
#include "serve/engine_executor.h"
#include "serve/fan_out_observer.h"
#include "serve/journal_observer.h"

namespace spw::gateway {
namespace {

using admission::format_bytes;

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

Result<std::shared_ptr<journal::Journal>> open_journal(Env& env, const GatewayOptions& o) {
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
  jo.max_bytes = o.journal_max_bytes;
  jo.max_body_bytes_kept = o.journal_max_body_bytes;
  SPW_ASSIGN_OR_RETURN(std::unique_ptr<journal::Journal> j, journal::Journal::open(env, path, jo));
  return std::shared_ptr<journal::Journal>(std::move(j));
}

// The estimator's plan for one path of the serving layout (ubatch 64 or the
// context when smaller; last row of logits per eval).
// estimate() resolves the placement for the model, as the engine runs it.
admission::Plan path_plan(const Placement& where, int32_t n_ctx, int32_t workers, int32_t kv_blocks, int n_threads,
                          KvType kv_type) {
  admission::Plan plan;
  plan.kv_type = kv_type;
  plan.placement = where;
  plan.n_ctx = n_ctx;
  plan.n_parallel = workers;
  plan.n_threads = n_threads;
  plan.kv_blocks = kv_blocks;
  plan.n_batch = n_ctx;
  plan.n_ubatch = std::min(64, n_ctx);
  return plan;
}

// The host bytes an estimate adds to what the process already holds (the
// estimate's overhead starts from the observed RSS, already in the readings).
uint64_t host_bytes_beyond_baseline(const admission::Estimate& e, const admission::EstimatorConfig& cfg) {
  const uint64_t h = e.host().total();
  return h > cfg.host.fixed_overhead ? h - cfg.host.fixed_overhead : 0;
}

// One path's memory plan as the builder sizes it.
struct PathPlan {
  bool built = false;
  int32_t kv_blocks = 0;
  uint64_t host_bytes = 0;
  uint64_t device_bytes = 0;
  admission::Ticket host_ticket, device_ticket;
  // What a decode step streams, per memory, for the path's rate prior.
  std::vector<admission::StreamShare> shares;
};

// The offload path's plan beside a full-GPU path: one worker, one full
// context, layers [0, n) on the GPU. The GPU path's uploaded weights and the
// backend's scratch are shared (same model, same backend), so its device cost
// is its KV: the estimate's difference over its blocks. Its host cost is the
// CPU layers' KV and scratch; their weights are the shared mapping.
Result<PathPlan> plan_offload(const gguf::GgufFile& file, const Placement& gpu, int32_t n, int32_t n_ctx,
                              int32_t block_tokens, int n_threads, KvType kv_type,
                              const admission::EstimatorConfig& cfg) {
  const Placement where = Placement::hybrid(n, gpu.vulkan_device);
  const int32_t blocks = admission::kv_blocks_for(n_ctx, block_tokens);
  SPW_ASSIGN_OR_RETURN(admission::Estimate e0,
                       admission::estimate(file, path_plan(where, n_ctx, 1, 1, n_threads, kv_type), cfg));
  SPW_ASSIGN_OR_RETURN(admission::Estimate e,
                       admission::estimate(file, path_plan(where, n_ctx, 1, blocks + 1, n_threads, kv_type), cfg));
  PathPlan p;
  p.kv_blocks = blocks;
  p.device_bytes = e.gpu().total() - std::min(e.gpu().total(), e0.gpu().total());
  const uint64_t host = host_bytes_beyond_baseline(e, cfg);
  p.host_bytes = host - std::min(host, e.host().weights.bytes);
  p.shares = admission::stream_shares(file, e);
  return p;
}

// Observed device heap into the ledger (VK_EXT_memory_budget: the budget is
// what this process may still reach, so used = size - budget + our usage).
HeapReading observe_device(VulkanBackend& vk, admission::DeviceLedger& ledger) {
  const DeviceMemoryStats ms = vk.memory_stats();
  const VulkanHeapInfo* heap = nullptr;
  for (const auto& h : ms.heaps)
    if (h.device_local && (!heap || h.size_bytes > heap->size_bytes)) heap = &h;
  if (!heap || heap->budget_bytes < 0 || heap->usage_bytes < 0) {
    return {std::nullopt,
            !heap ? "no device-local heap" : "VK_EXT_memory_budget not supported by " + vk.device_info().driver};
  }
  const auto budget = static_cast<uint64_t>(heap->budget_bytes);
  const auto usage = static_cast<uint64_t>(heap->usage_bytes);
  const uint64_t used = std::min((heap->size_bytes > budget ? heap->size_bytes - budget : 0) + usage, heap->size_bytes);
  ledger.observe_heap(heap->size_bytes, used);
  return {used, ""};
}

// Runs one tiny greedy request through a path and waits for it: shaders are
// compiled and pages touched before the first client, and the path's rates
// get a first measurement. Returns the wall time it took (ms).
double warm_up(Env& env, serve::Scheduler& s) {
  serve::GenerationRequest g;
  g.internal = true;  // not a client's: latency histograms and the breaker skip it
  g.prompt = "Once upon a time";
  g.max_tokens = std::min(8, std::max(1, s.n_ctx() / 4));
  const int64_t t0 = env.now_ns();
  auto t = s.submit(g);
  if (!t.ok()) return 0;
  serve::RequestEvent ev;
  for (int i = 0; i < 600; ++i) {
    const serve::PopResult r = (*t)->next_event(ev, std::chrono::milliseconds(100));
    if (r == serve::PopResult::kClosed) break;
    if (r == serve::PopResult::kItem && ev.kind == serve::RequestEvent::Kind::kFinished) break;
  }
  return static_cast<double>(env.now_ns() - t0) / 1e6;
}

// The CPU fallback's replica: how its model is held and what making it
// ready costs. Measures, on the file as the page cache holds it now, the
// load (map, parse, bind) and the page-in (read every page) of a fresh
// mapping; `requested` auto takes the lightest mode whose recovery fits
// budget_ms: on-demand (load + page-in), else mmap (page-in), else warm.
// With `same_file` (the first path's model, whose host pages a full-GPU path
// does not need) that model is used and its pages are dropped for mmap and
// on-demand; on-demand then loads a model of its own at the first request.
struct ReplicaChoice {
  ReplicaInfo info;
  std::shared_ptr<const Model> model;  // null: on demand
  std::shared_ptr<const Tokenizer> tokenizer;
  LlamaHparams hparams;
};

Result<ReplicaChoice> choose_replica(Env& env, const std::string& path, ReplicaMode requested, double budget_ms,
                                     std::shared_ptr<const Model> same_file) {
  ReplicaChoice c;
  const int64_t t0 = env.now_ns();
  SPW_ASSIGN_OR_RETURN(std::shared_ptr<const Model> probe, Model::load(env, path, ModelLoadOptions{false}));
  const int64_t t1 = env.now_ns();
  SPW_RETURN_IF_ERROR(probe->file().page_in());
  const int64_t t2 = env.now_ns();
  ReplicaInfo& r = c.info;
  r.load_ms = static_cast<double>(t1 - t0) / 1e6;
  r.page_in_ms = static_cast<double>(t2 - t1) / 1e6;
  char figures[160];
  std::snprintf(figures, sizeof figures, "load %.0f ms + page-in %.0f ms measured, recovery budget %.0f ms", r.load_ms,
                r.page_in_ms, budget_ms);
  if (requested == ReplicaMode::kAuto) {
    r.mode = r.load_ms + r.page_in_ms <= budget_ms ? "on-demand" : r.page_in_ms <= budget_ms ? "mmap" : "warm";
    r.why = "auto: " + std::string(figures);
  } else {
    r.mode = std::string(replica_mode_name(requested));
    r.why = "--replica " + r.mode + " (" + figures + ")";
  }
  r.recovery_ms = r.mode == "on-demand" ? r.load_ms + r.page_in_ms : r.mode == "mmap" ? r.page_in_ms : 0.0;
  r.loaded = r.mode != "on-demand";
  c.hparams = probe->hparams();
  if (same_file) {
    probe.reset();
    c.tokenizer = std::shared_ptr<const Tokenizer>(same_file, &same_file->tokenizer());
    if (r.mode != "warm") SPW_RETURN_IF_ERROR(same_file->file().page_out());
    if (r.mode != "on-demand") c.model = std::move(same_file);
    return c;
  }
  if (r.mode == "on-demand") {
    // A tokenizer of its own (it copies the vocabulary): the mapping goes.
    SPW_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::from_gguf(probe->file()));
    c.tokenizer = std::shared_ptr<const Tokenizer>(std::move(tok));
    return c;
  }
  if (r.mode == "mmap") SPW_RETURN_IF_ERROR(probe->file().page_out());
  c.tokenizer = std::shared_ptr<const Tokenizer>(probe, &probe->tokenizer());
  c.model = std::move(probe);
  return c;
}

// The GPU device's breaker options from the serve flags; InvalidArgument
// naming the flag when one is out of range.
Result<BreakerOptions> breaker_options(const GatewayOptions& o) {
  BreakerOptions b;
  b.consecutive_failures = o.breaker_consecutive_failures;
  b.failure_share = o.breaker_failure_share;
  b.min_requests = o.breaker_min_requests;
  b.window_s = o.breaker_window_s;
  b.base_cooldown_s = o.breaker_cooldown_s;
  b.max_cooldown_s = o.breaker_max_cooldown_s;
  b.probes = o.breaker_probes;
  const Status st = validate_breaker_options(b);
  if (st.ok()) return b;
  const std::string& f = st.field();
  const std::string key = f == "consecutive_failures" ? "breaker-consecutive-failures"
                          : f == "failure_share"      ? "breaker-failure-share"
                          : f == "min_requests"       ? "breaker-min-requests"
                          : f == "window_s"           ? "breaker-window-s"
                          : f == "base_cooldown_s"    ? "breaker-cooldown-s"
                          : f == "max_cooldown_s"     ? "breaker-max-cooldown-s"
                          : f == "probes"             ? "breaker-probes"
                                                      : "breaker-" + f;
  return invalid_field(key, key + ": " + st.message());
}

// What besides the model's fingerprint and the placements decides an
// equivalence check: the device (name and driver: another card, or another
// driver version, may round differently) and the binary (its kernels and
// shaders; identified by the executable's size and modification time, so
// a rebuilt or upgraded spillway checks again).
std::string equivalence_scope(const VulkanBackend* vulkan) {
  std::string scope;
  if (vulkan != nullptr) scope += vulkan->device_info().name + " / " + vulkan->device_info().driver;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto size = std::filesystem::file_size(exe, ec);
    const auto mtime = std::filesystem::last_write_time(exe, ec);
    if (!ec) {
      scope +=
          " | " + exe.string() + " " + std::to_string(size) + " " + std::to_string(mtime.time_since_epoch().count());
    }
  }
  return scope;
}

// Equivalence verdicts kept in the journal database (Journal::
// load_equivalence). A journal error only costs the check being run again.
EquivalenceStore journal_equivalence_store(std::shared_ptr<journal::Journal> j, const VulkanBackend* vulkan) {
  EquivalenceStore store;
  store.scope = equivalence_scope(vulkan);
  store.load = [j](const std::string& key) -> std::optional<EquivalenceInfo> {
    Result<std::optional<journal::EquivalenceVerdict>> r = j->load_equivalence(key);
    if (!r.ok() || !r->has_value()) return std::nullopt;
    EquivalenceInfo info;
    info.passed = (*r)->passed;
    info.detail = (*r)->detail;
    info.ms = (*r)->ms;
    info.checked_ms = (*r)->checked_ms;
    return info;
  };
  store.save = [j](const std::string& key, const EquivalenceInfo& info) {
    journal::EquivalenceVerdict v;
    v.passed = info.passed;
    v.detail = info.detail;
    v.ms = info.ms;
    v.checked_ms = info.checked_ms;
    (void)j->save_equivalence(key, v);
  };
  return store;
}

}  // namespace

std::string_view replica_mode_name(ReplicaMode m) {
  switch (m) {
    case ReplicaMode::kAuto:
      return "auto";
    case ReplicaMode::kWarm:
      return "warm";
    case ReplicaMode::kMmap:
      return "mmap";
    case ReplicaMode::kOnDemand:
      return "on-demand";
  }
  return "auto";
}

Result<ReplicaMode> parse_replica_mode(std::string_view name) {
  for (ReplicaMode m : {ReplicaMode::kAuto, ReplicaMode::kWarm, ReplicaMode::kMmap, ReplicaMode::kOnDemand}) {
    if (replica_mode_name(m) == name) return m;
  }
  return Status::invalid_argument("must be auto, warm, mmap or on-demand, got '" + std::string(name) + "'");
}

Result<std::string> default_journal_path() {
  std::string base;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && x[0] == '/')
    base = x;
  else if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/')
    base = std::string(h) + "/.local/state";
  else
    return Status::invalid_argument(
        "no HOME or XDG_STATE_HOME to put the journal in: pass --journal PATH or --journal none");
  return base + "/spillway/journal.sqlite";
}

std::string model_name_from_path(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

Result<BuiltGateway> build_gateway(Env& env, const GatewayOptions& o) {
  BuiltGateway out;
  const int n_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.parallel < 1) return invalid_field("parallel", "parallel must be >= 1, got " + std::to_string(o.parallel));
  if (o.cpu_parallel < 1) {
    return invalid_field("cpu-parallel", "cpu-parallel must be >= 1, got " + std::to_string(o.cpu_parallel));
  }
  if (o.queue < 0 || o.cpu_queue < 0) return invalid_field("queue", "queue and cpu-queue must be >= 0");
  if (o.ctx < 0 || o.cpu_ctx < 0 || o.kv_blocks < 0) {
    return invalid_field("ctx", "ctx, cpu-ctx and kv-blocks must be >= 0");
  }
  if (!(o.pressure_threshold > 0) || !(o.max_delay_s >= 0) || o.min_shrink_tokens < 1 || !(o.observe_interval_s >= 0)) {
    return invalid_field("pressure-threshold",
                         "pressure-threshold must be > 0, max-delay-s and observe-interval-s >= 0, "
                         "min-shrink-tokens >= 1");
  }
  const KvType kv_type = o.kv_type;
  if (!(o.recovery_budget_ms >= 0)) return invalid_field("recovery-budget-ms", "recovery-budget-ms must be >= 0");
  if (o.offload_layers < 0 || o.offload_queue < 0) {
    return invalid_field("offload-layers", "offload-layers and offload-queue must be >= 0");
  }
  SPW_ASSIGN_OR_RETURN(const BreakerOptions breaker_opts, breaker_options(o));
  if (!(o.health_interval_s >= 0)) {
    return invalid_field("health-interval-s",
                         "health-interval-s must be >= 0 (0: off), got " + std::to_string(o.health_interval_s));
  }
  if (!(o.host_bandwidth >= 0) || !(o.device_bandwidth >= 0) || !std::isfinite(o.host_bandwidth) ||
      !std::isfinite(o.device_bandwidth)) {
    return invalid_field("host-bandwidth", "host-bandwidth and device-bandwidth must be finite and >= 0 (0: measured)");
  }
  if (!(o.health_timeout_s > 0)) {
    return invalid_field("health-timeout-s", "health-timeout-s must be > 0, got " + std::to_string(o.health_timeout_s));
  }
  const Placement* spec = &o.device;
  if (kv_type == KvType::kQ8_0 && spec->on_gpu()) {
    return invalid_field(
        "kv-type", "kv-type q8_0 is CPU only (the Vulkan backend stores f32 or f16), got device " + o.device.spec());
  }
  const uint64_t device_memory = o.device_memory.value_or(0);
  out.model_name = model_name_from_path(o.model);

  std::unique_ptr<gguf::GgufFile> file;
  {
    auto f = gguf::GgufFile::open(env, o.model);
    if (!f.ok()) return f.status();
    file = std::move(*f);
  }
  SPW_ASSIGN_OR_RETURN(LlamaHparams hp, read_llama_hparams(*file));
  const int32_t n_ctx = o.ctx > 0 ? o.ctx : hp.n_ctx_train;
  if (n_ctx < 2 || n_ctx > hp.n_ctx_train) {
    return invalid_field("ctx", "ctx must be in [2, " + std::to_string(hp.n_ctx_train) +
                                    "] (the model's context_length), got " + std::to_string(n_ctx));
  }
  constexpr int32_t kBlockTokens = 16;
  const int32_t n_gpu_layers = spec->gpu_layer_count(hp.n_layer);
  if (!o.fallback_model.empty() && n_gpu_layers == 0) {
    return invalid_field("fallback-model", "fallback-model serves the CPU fallback of a GPU path; with device " +
                                               o.device.spec() + " the model itself is served on the CPU");
  }
  if (o.offload_layers > 0 && (n_gpu_layers != hp.n_layer || o.offload_layers >= hp.n_layer)) {
    return invalid_field("offload-layers", "offload-layers N needs a full-GPU device (vulkan) and N in [1, " +
                                               std::to_string(hp.n_layer - 1) + "] (the model has " +
                                               std::to_string(hp.n_layer) + " layers), got " +
                                               std::to_string(o.offload_layers) + " with device " + o.device.spec());
  }
  // The CPU path's model file: the fallback model, or the same file.
  std::unique_ptr<gguf::GgufFile> fallback_file;
  LlamaHparams cpu_hp = hp;
  if (!o.fallback_model.empty()) {
    auto f = gguf::GgufFile::open(env, o.fallback_model);
    if (!f.ok()) return f.status().with_context("fallback-model");
    fallback_file = std::move(*f);
    auto fhp = read_llama_hparams(*fallback_file);
    if (!fhp.ok()) return fhp.status().with_context("fallback-model " + o.fallback_model);
    cpu_hp = *fhp;
    SPW_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_gguf(*file));
    auto ftok = Tokenizer::from_gguf(*fallback_file);
    if (!ftok.ok()) return ftok.status().with_context("fallback-model " + o.fallback_model);
    if ((*ftok)->fingerprint() != tok->fingerprint()) {
      return invalid_field("fallback-model",
                           "fallback-model " + o.fallback_model + ": its tokenizer differs from " + o.model +
                               "'s; a fallback model must share the tokenizer (same prompt tokens, template and "
                               "stop rules), e.g. a smaller model of the same family");
    }
  }
  const int32_t cpu_ctx = std::min(o.cpu_ctx > 0 ? o.cpu_ctx : n_ctx, cpu_hp.n_ctx_train);
  const gguf::GgufFile& cpu_file = fallback_file ? *fallback_file : *file;

  // Host ledger: everything this server holds in host memory.
  admission::HostBudgetPolicy hpol;
  hpol.mem_available_share = o.host_memory_share;
  if (o.host_budget) hpol.cap_bytes = *o.host_budget;
  SPW_ASSIGN_OR_RETURN(admission::HostReadings readings, host_readings(env));
  {
    SPW_ASSIGN_OR_RETURN(auto hl, admission::HostLedger::create("host", hpol, readings));
    out.host_ledger = std::shared_ptr<admission::HostLedger>(std::move(hl));
  }
  admission::EstimatorConfig cfg;
  if (const auto rss = device::HostMemoryProbe(env).read().process_rss_bytes; rss.known()) {
    cfg.host.fixed_overhead = rss.value();
  }
  const std::string model_owner = out.model_name;
  std::vector<PathNotBuilt> not_built;

  // --- The first-choice path's memory plan.
  PathPlan gpu;
  PathPlan offload;  // the hybrid path beside a full-GPU path (offload_layers)
  bool device_on_host = false;
  if (n_gpu_layers > 0) {
    VulkanBackendOptions vo;
    vo.device = spec->vulkan_device;
    vo.memory_budget_bytes = device_memory;
    // A model with matrices the shaders do not compute (a type the CPU does
    // not load either, so in practice a file refused later) leaves the GPU
    // paths unbuilt, reported with the tensor and type.
    const Status types = vulkan_check_weight_types(*file);
    auto v = types.ok() ? VulkanBackend::create(vo) : Result<std::shared_ptr<VulkanBackend>>(types);
    if (!v.ok()) {
      not_built.push_back(
          {"gpu", types.ok() ? "device " + o.device.spec() + ": " + v.status().to_string() : types.message()});
    } else {
      out.vulkan = std::move(*v);
      device_on_host = out.vulkan->device_info().type == "cpu" || out.vulkan->device_info().type == "integrated-gpu";
      cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(out.vulkan->device_info());
      admission::HeadroomPolicy headroom;
      headroom.fraction = o.device_headroom_share;
      headroom.bytes = o.device_headroom;
      auto ledger =
          admission::DeviceLedger::create(out.vulkan->name(), out.vulkan->memory_stats().budget_bytes, headroom);
      if (!ledger.ok()) return ledger.status().with_context("device-headroom / device-headroom-share");
      out.device_ledger = std::shared_ptr<admission::DeviceLedger>(std::move(*ledger));
      for (const CoTenant& ct : o.co_tenants) {
        auto t = out.device_ledger->declare({admission::OwnerKind::kCoTenant, ct.name}, ct.bytes);
        if (!t.ok()) return t.status().with_context("co-tenant " + ct.name);
      }
      (void)observe_device(*out.vulkan, *out.device_ledger);
      // Size the pool to what the device has left after weights and scratch.
      SPW_ASSIGN_OR_RETURN(admission::Estimate e1,
                           admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, 1, n_threads, kv_type), cfg));
      SPW_ASSIGN_OR_RETURN(admission::Estimate e2,
                           admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, 2, n_threads, kv_type), cfg));
      const uint64_t per_block = std::max<uint64_t>(1, e2.gpu().total() - e1.gpu().total());
      const uint64_t fixed = e1.gpu().total() - std::min(e1.gpu().total(), per_block);
      const uint64_t available_all = out.device_ledger->available();
      const int32_t want = o.kv_blocks > 0 ? o.kv_blocks : o.parallel * admission::kv_blocks_for(n_ctx, kBlockTokens);
      auto fit_in = [&](uint64_t available) {
        const int64_t fit = available > fixed ? static_cast<int64_t>((available - fixed) / per_block) : 0;
        return static_cast<int32_t>(std::min<int64_t>(want, fit));
      };
      // The offload path's device KV comes out of the budget first: it is
      // what serves the prompts the GPU pool cannot hold.
      if (o.offload_layers > 0) {
        SPW_ASSIGN_OR_RETURN(
            offload, plan_offload(*file, *spec, o.offload_layers, n_ctx, kBlockTokens, n_threads, kv_type, cfg));
        if (fit_in(available_all > offload.device_bytes ? available_all - offload.device_bytes : 0) < 2) {
          not_built.push_back({"hybrid", "its KV for one full context on " + std::to_string(o.offload_layers) +
                                             " GPU layers (" + format_bytes(offload.device_bytes) +
                                             ") would leave the GPU path no room for its KV pool"});
          offload = PathPlan{};
        } else {
          offload.built = true;
        }
      }
      const uint64_t available = available_all > offload.device_bytes ? available_all - offload.device_bytes : 0;
      const int32_t blocks = fit_in(available);
      if (blocks < 2) {
        not_built.push_back({"gpu", "weights and scratch need " + format_bytes(fixed) + " plus " +
                                        format_bytes(per_block) + " per KV block; the device ledger has " +
                                        format_bytes(available) + " available (" + out.device_ledger->name() +
                                        ", device-memory / device-headroom / co-tenants)"});
      } else {
        SPW_ASSIGN_OR_RETURN(
            admission::Estimate e,
            admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, blocks, n_threads, kv_type), cfg));
        // One device ticket for the GPU path and the offload path beside it.
        const uint64_t device_bytes = e.gpu().total() + offload.device_bytes;
        auto t = out.device_ledger->reserve({admission::OwnerKind::kModelWeights, model_owner}, device_bytes);
        if (!t.ok()) {
          not_built.push_back({"gpu", t.status().message()});
          offload = PathPlan{};
        } else {
          gpu.built = true;
          gpu.kv_blocks = blocks;
          gpu.shares = admission::stream_shares(*file, e);
          gpu.device_ticket = *t;
          gpu.device_bytes = device_bytes;
          gpu.host_bytes =
              host_bytes_beyond_baseline(e, cfg) + offload.host_bytes + (device_on_host ? device_bytes : 0);
          out.log.push_back("gpu path: " + std::to_string(blocks) + " KV blocks of " + std::to_string(kBlockTokens) +
                            " tokens (" + (blocks < want ? "bounded by device memory, " : "") + "wanted " +
                            std::to_string(want) + "), device plan " + format_bytes(gpu.device_bytes) + " of " +
                            format_bytes(out.device_ledger->snapshot().limit) + " on " + out.device_ledger->name());
        }
      }
    }
  }
  if (gpu.built) {
    auto t = out.host_ledger->reserve({admission::OwnerKind::kModelWeights, model_owner},
                                      std::max<uint64_t>(1, gpu.host_bytes));
    if (!t.ok()) {
      not_built.push_back({"gpu", "host side of the GPU plan: " + t.status().message()});
      (void)out.device_ledger->release(gpu.device_ticket);
      gpu.built = false;
      offload = PathPlan{};
    } else {
      gpu.host_ticket = *t;
    }
  }

  // --- The CPU path: the first-choice path when --device cpu, else the fallback.
  const bool cpu_primary = n_gpu_layers == 0;
  const bool want_cpu = cpu_primary || o.cpu_fallback;
  PathPlan cpu;
  const int32_t cpu_workers = cpu_primary ? o.parallel : o.cpu_parallel;
  const int32_t cpu_n_ctx = cpu_primary ? n_ctx : cpu_ctx;
  if (want_cpu) {
    const int32_t blocks =
        cpu_primary && o.kv_blocks > 0 ? o.kv_blocks : cpu_workers * admission::kv_blocks_for(cpu_n_ctx, kBlockTokens);
    SPW_ASSIGN_OR_RETURN(
        admission::Estimate e,
        admission::estimate(cpu_primary ? *file : cpu_file,
                            path_plan(Placement::cpu(), cpu_n_ctx, cpu_workers, blocks, n_threads, kv_type), cfg));
    uint64_t need = host_bytes_beyond_baseline(e, cfg);
    // The same file's mapping is shared with the GPU path: counted there
    // already. A fallback model's weights are its own, whatever its replica
    // mode: the path must be able to run when work is sent to it.
    if (gpu.built && !fallback_file) need -= std::min(need, e.host().weights.bytes);
    const std::string owner = cpu_primary     ? model_owner
                              : fallback_file ? model_name_from_path(o.fallback_model) + " (cpu path)"
                                              : model_owner + " (cpu path)";
    auto t = out.host_ledger->reserve({admission::OwnerKind::kModelWeights, owner}, std::max<uint64_t>(1, need));
    if (!t.ok()) {
      not_built.push_back(
          {"cpu", "its plan needs " + format_bytes(need) + " of host memory: " + t.status().message() +
                      ". Lower --cpu-ctx or --cpu-parallel, or raise --host-memory-share / --host-budget"});
    } else {
      cpu.built = true;
      cpu.kv_blocks = blocks;
      cpu.shares = admission::stream_shares(cpu_primary ? *file : cpu_file, e);
      cpu.host_ticket = *t;
      cpu.host_bytes = need;
    }
  }
  if (!gpu.built && !cpu.built) {
    std::string why;
    for (const auto& n : not_built) why += (why.empty() ? "" : "; ") + n.name + ": " + n.reason;
    return Status(StatusCode::kResourceExhausted, "no execution path fits: " + why, FailureReason::kNoPath);
  }
  file.reset();
  fallback_file.reset();

  SPW_ASSIGN_OR_RETURN(out.journal, open_journal(env, o));
  {
    SPW_ASSIGN_OR_RETURN(auto m, Model::load(env, o.model));
    out.model = std::shared_ptr<const Model>(std::move(m));
  }
  std::shared_ptr<serve::RequestObserver> observer;
  if (out.journal) observer = std::make_shared<serve::JournalObserver>(out.journal);
  std::shared_ptr<const Tokenizer> tok(out.model, &out.model->tokenizer());

  std::vector<ExecutionPath> paths;
  // One path: its scheduler over `model` (or, with on_demand, over a model
  // loaded by its first request), warmed up when it is loaded.
  struct PathSpec {
    std::string name;
    Placement where;
    int32_t workers = 1, queue = 0, ctx = 0, blocks = 0;
    admission::PathRole role = admission::PathRole::kPrimary;
    std::shared_ptr<admission::MemoryLedger> ledger;
    std::shared_ptr<const Model> model;  // null: on demand
    std::shared_ptr<const Tokenizer> tokenizer;
    std::string model_name;
    bool fallback_model = false;
    ReplicaInfo replica;
    std::function<Result<std::shared_ptr<const Model>>()> load;  // on demand
    LlamaHparams hparams;                                        // on demand
    std::shared_ptr<CircuitBreaker> breaker;                     // GPU-side paths: the device's
    std::shared_ptr<DeviceControl> device;                       // GPU-side paths: the device's
    std::string fingerprint;                                     // "" when not known at start
    admission::RatePrior prior;                                  // rate_prior(its plan's shares)
  };
  // Rate priors (admission/prior.h). The host's read bandwidth is measured
  // once, with the paths' thread count, when a path streams from host memory
  // (unless given). A GPU's memory: lavapipe's ("cpu") and an integrated
  // GPU's are the host's DRAM, so they take the host figure (lavapipe runs
  // its shaders on the host's cores; an integrated GPU may reach somewhat
  // more or less than the cores do); a discrete GPU's is not measured (no
  // device-side probe yet): its paths start from the default rates unless
  // device_bandwidth is given.
  std::optional<double> host_bw;
  std::string host_bw_why;
  auto host_bandwidth = [&]() -> double {
    if (host_bw) return *host_bw;
    host_bw = o.host_bandwidth;
    if (*host_bw > 0) {
      out.log.push_back("host read bandwidth " + std::to_string(static_cast<int64_t>(*host_bw / 1e6)) +
                        " MB/s (given)");
      return *host_bw;
    }
    admission::BandwidthProbeOptions bo;
    bo.n_threads = n_threads;
    const int64_t t0 = env.now_ns();
    Result<double> bw = admission::measure_read_bandwidth(env, bo);
    if (!bw.ok()) {
      host_bw = 0.0;
      host_bw_why = "host bandwidth not measured: " + bw.status().message();
      out.log.push_back(host_bw_why);
      return 0;
    }
    host_bw = *bw;
    out.log.push_back("host read bandwidth " + std::to_string(static_cast<int64_t>(*bw / 1e6)) + " MB/s measured (" +
                      std::to_string(n_threads) + " threads over " + std::to_string(bo.buffer_bytes >> 20) + " MiB, " +
                      std::to_string((env.now_ns() - t0) / 1000000) + " ms)");
    return *host_bw;
  };
  auto rate_prior = [&](std::vector<admission::StreamShare> shares) {
    admission::RatePrior rp;
    rp.constants = o.prior_constants;
    std::string why;
    for (admission::StreamShare& sh : shares) {
      if (sh.device == admission::DeviceKind::kHost) {
        sh.bandwidth = rp.host_bandwidth = host_bandwidth();
        if (sh.bandwidth <= 0) why = host_bw_why;
      } else if (o.device_bandwidth > 0) {
        sh.bandwidth = rp.device_bandwidth = o.device_bandwidth;
        rp.device_bandwidth_source = "given";
      } else if (device_on_host) {
        sh.bandwidth = rp.device_bandwidth = host_bandwidth();
        rp.device_bandwidth_source =
            "host memory (the Vulkan device is of type " + out.vulkan->device_info().type + ")";
        if (sh.bandwidth <= 0) why = host_bw_why;
      } else {
        why = "a discrete GPU's bandwidth is not measured: give device_bandwidth (--device-bandwidth)";
      }
      rp.weight_bytes_per_token += sh.weight_bytes;
      rp.kv_bytes_per_position += sh.kv_bytes_per_position;
      rp.compute_s_per_token += sh.compute_s;
    }
    Result<admission::PathRates> r = admission::prior_rates(shares, o.prior_constants);
    if (r.ok()) {
      rp.computed = true;
      rp.rates = *r;
    } else {
      rp.why = why.empty() ? r.status().message() : why;
    }
    return rp;
  };
  auto make_path = [&](PathSpec ps) -> Status {
    serve::EngineServeOptions so;
    so.device = ps.where;
    so.vulkan = out.vulkan;
    so.n_workers = ps.workers;
    so.n_threads = n_threads;
    so.n_ctx = ps.ctx;
    so.kv_blocks = ps.blocks;
    so.kv_block_tokens = kBlockTokens;
    so.kv_type = kv_type;
    // A path without a device gets an injector for its cores' slow faults.
    std::shared_ptr<FaultInjector> cpu_faults = ps.device ? nullptr : std::make_shared<FaultInjector>();
    so.cpu_faults = cpu_faults.get();
    so.queue_capacity = ps.queue;
    // The journal and, on a GPU-side path, the device's breaker hear every
    // request's outcome.
    so.observer =
        serve::FanOutObserver::make({observer, ps.breaker ? std::make_shared<BreakerObserver>(ps.breaker) : nullptr});
    so.path_name = ps.name;
    so.kv_gate = true;
    so.checkpoint_every = o.checkpoint_every;
    so.batching = o.batching;
    so.batch_max_wait_us = o.batch_max_wait_us;
    so.step_tokens = o.step_tokens;
    if (ps.prior.computed) so.prior_rates = ps.prior.rates;
    ps.prior.rates = so.prior_rates;  // what the path starts from, for status
    if (ps.device) {
      // The session group re-opens itself after the device was
      // re-initialised; its time is part of the recovery shown in status.
      so.on_reopened = [device = ps.device, name = ps.name](const Status& st, double ms) {
        device->record_reopen(name, st, ms);
      };
    }
    const int64_t t0 = env.now_ns();
    auto replica = std::make_shared<Replica>(ps.replica);
    serve::EngineServing serving;
    if (ps.model) {
      SPW_ASSIGN_OR_RETURN(serving, serve::make_engine_scheduler(env, ps.model, so));
    } else {
      serve::OnDemandModel odm;
      odm.load = ps.load;
      odm.tokenizer = ps.tokenizer;
      odm.hparams = ps.hparams;
      odm.on_loaded = [replica](double ms) { replica->mark_loaded(ms); };
      SPW_ASSIGN_OR_RETURN(serving, serve::make_on_demand_scheduler(env, std::move(odm), so));
    }
    ExecutionPath p;
    p.name = ps.name;
    p.placement = serving.scheduler->placement();
    p.model = ps.model_name;
    p.fallback_model = ps.fallback_model;
    p.role = ps.role;
    p.replica = replica;
    p.tokenizer = ps.tokenizer;
    p.ledger = std::move(ps.ledger);
    p.breaker = ps.breaker;
    p.device = ps.device;
    p.cpu_faults = std::move(cpu_faults);
    p.fingerprint = ps.model ? ps.model->fingerprint() : ps.fingerprint;
    p.prior = ps.prior;
    p.kv_type = std::string(kv_type_name(kv_type));
    p.scheduler = std::move(serving.scheduler);
    p.batcher = serving.batcher;
    p.unload = std::move(serving.unload);
    // An on-demand path is not warmed up: that would load it.
    if (o.warmup && ps.model) warm_up(env, *p.scheduler);
    p.startup_ms = static_cast<double>(env.now_ns() - t0) / 1e6;
    out.log.push_back(ps.name + " path: " + serving.placement_detail + ", model " + ps.model_name + ", " +
                      std::to_string(ps.workers) + " workers, queue " + std::to_string(ps.queue) + ", ctx " +
                      std::to_string(ps.ctx) + ", " + std::to_string(ps.blocks) + " KV blocks (" +
                      std::string(kv_type_name(kv_type)) + "), replica " + ps.replica.mode +
                      (ps.replica.why.empty() ? "" : " (" + ps.replica.why + ")") + ", ready in " +
                      std::to_string(static_cast<int64_t>(p.startup_ms)) + " ms");
    paths.push_back(std::move(p));
    return Status::ok_status();
  };
  auto primary_spec = [&](std::string name, Placement where) {
    PathSpec ps;
    ps.name = std::move(name);
    ps.where = std::move(where);
    ps.model = out.model;
    ps.tokenizer = tok;
    ps.model_name = out.model_name;
    return ps;
  };
  if (gpu.built) {
    // One breaker per device: the GPU path and the offload path beside it
    // fail together (same device, same uploaded weights).
    SPW_ASSIGN_OR_RETURN(std::shared_ptr<CircuitBreaker> breaker,
                         CircuitBreaker::create(env, out.vulkan->name(), breaker_opts));
    // What the gateway may do to the device: its health probe, re-initialising
    // it after a fault (before the breaker's probes) and the admin API's
    // armed faults. Weak: the paths' session groups hold the backend.
    DeviceHooks hooks;
    hooks.name = out.vulkan->name();
    std::weak_ptr<VulkanBackend> weak_vk = out.vulkan;
    hooks.health_check = [weak_vk] {
      auto vk = weak_vk.lock();
      return vk ? vk->health_check()
                : Status(StatusCode::kUnavailable, "the Vulkan backend is gone", FailureReason::kUnhealthy);
    };
    hooks.healthy = [weak_vk] {
      auto vk = weak_vk.lock();
      return vk && vk->healthy();
    };
    hooks.reinitialize = [weak_vk] {
      auto vk = weak_vk.lock();
      return vk ? vk->reinitialize()
                : Status(StatusCode::kUnavailable, "the Vulkan backend is gone", FailureReason::kUnhealthy);
    };
    hooks.faults = &out.vulkan->faults();
    auto device = std::make_shared<DeviceControl>(env, std::move(hooks));
    PathSpec ps = primary_spec(n_gpu_layers == hp.n_layer ? "gpu" : "hybrid", *spec);
    ps.breaker = breaker;
    ps.device = device;
    ps.workers = o.parallel;
    ps.queue = o.queue;
    ps.ctx = n_ctx;
    ps.blocks = gpu.kv_blocks;
    ps.ledger = out.device_ledger;
    ps.prior = rate_prior(gpu.shares);
    ps.replica.mode = "warm";
    ps.replica.why = "the first-choice path: its layers' weights uploaded at start";
    SPW_RETURN_IF_ERROR(make_path(std::move(ps)));
    if (offload.built) {
      PathSpec hs = primary_spec("hybrid", Placement::hybrid(o.offload_layers, spec->vulkan_device));
      hs.workers = 1;
      hs.queue = o.offload_queue;
      hs.ctx = n_ctx;
      hs.blocks = offload.kv_blocks;
      hs.role = admission::PathRole::kOffload;
      hs.prior = rate_prior(offload.shares);
      hs.ledger = out.device_ledger;
      hs.breaker = breaker;
      hs.device = device;
      hs.replica.why = "the GPU path's model: its first " + std::to_string(o.offload_layers) +
                       " layers' uploaded weights and the mapping for the rest";
      SPW_RETURN_IF_ERROR(make_path(std::move(hs)));
    }
    const uint64_t held = std::max(gpu.device_bytes, out.vulkan->memory_stats().used_bytes);
    SPW_RETURN_IF_ERROR(out.device_ledger->commit(gpu.device_ticket, held));
    SPW_RETURN_IF_ERROR(out.host_ledger->commit(gpu.host_ticket, std::max<uint64_t>(1, gpu.host_bytes)));
  }
  if (cpu.built) {
    PathSpec cs = primary_spec("cpu", Placement::cpu());
    cs.workers = cpu_workers;
    cs.queue = cpu_primary ? o.queue : o.cpu_queue;
    cs.ctx = cpu_n_ctx;
    cs.blocks = cpu.kv_blocks;
    cs.role = gpu.built ? admission::PathRole::kFallback : admission::PathRole::kPrimary;
    cs.ledger = out.host_ledger;
    cs.prior = rate_prior(cpu.shares);
    if (cpu_primary) {
      cs.replica.mode = "warm";
      cs.replica.why = "the first-choice path: mapped and read in at start";
    } else if (!o.fallback_model.empty() || (gpu.built && n_gpu_layers == hp.n_layer && !offload.built)) {
      // A replica of its own, or the same file whose host pages a full-GPU
      // path does not need: the mode decides what stays resident.
      const bool same_file = o.fallback_model.empty();
      SPW_ASSIGN_OR_RETURN(ReplicaChoice rc, choose_replica(env, same_file ? o.model : o.fallback_model, o.replica,
                                                            o.recovery_budget_ms, same_file ? out.model : nullptr));
      cs.replica = rc.info;
      cs.model = rc.model;
      cs.tokenizer = rc.tokenizer;
      cs.hparams = rc.hparams;
      const std::string file = same_file ? o.model : o.fallback_model;
      cs.load = [&env, file]() { return Model::load(env, file); };
      // On demand, the same file is the same model (its load checks the
      // tokenizer); another file's fingerprint is not known until loaded.
      if (same_file) cs.fingerprint = out.model->fingerprint();
      if (!same_file) {
        cs.model_name = model_name_from_path(o.fallback_model);
        cs.fallback_model = true;
      }
    } else {
      cs.replica.mode = "shared";
      cs.replica.why = gpu.built ? "the GPU-side paths run CPU layers from the same mapping, resident for them"
                                 : "the model's mapping (no GPU path was built)";
    }
    SPW_RETURN_IF_ERROR(make_path(std::move(cs)));
    SPW_RETURN_IF_ERROR(out.host_ledger->commit(cpu.host_ticket, std::max<uint64_t>(1, cpu.host_bytes)));
  }

  GatewayPolicy policy;
  policy.admission.pressure_threshold = o.pressure_threshold;
  policy.admission.max_delay_s = o.max_delay_s;
  policy.admission.allow_shrink = o.allow_shrink;
  policy.admission.min_shrink_tokens = o.min_shrink_tokens;
  policy.observe_interval_s = o.observe_interval_s;
  policy.overflow = o.overflow;
  policy.health_interval_s = o.health_interval_s;
  policy.health_timeout_s = o.health_timeout_s;
  policy.reservation_max_share = o.reservation_max_share;
  policy.log = [](const std::string& line) { std::fprintf(stderr, "spillway serve: %s\n", line.c_str()); };
  auto host_ledger = out.host_ledger;
  auto device_ledger = out.device_ledger;
  auto vulkan = out.vulkan;
  out.observe_host = [&env, host_ledger] {
    if (auto r = host_readings(env); r.ok()) host_ledger->update(*r);
  };
  if (vulkan && device_ledger) {
    out.observe_device = [device_ledger, vulkan] { return observe_device(*vulkan, *device_ledger); };
  }
  policy.observe = [observe_host = out.observe_host, observe_device = out.observe_device] {
    observe_host();
    if (observe_device) (void)observe_device();
  };
  for (const auto& n : not_built) out.log.push_back(n.name + " path not built: " + n.reason);
  if (out.journal) policy.equivalence_store = journal_equivalence_store(out.journal, out.vulkan.get());
  SPW_ASSIGN_OR_RETURN(out.gateway, Gateway::create(env, std::move(paths), std::move(not_built), std::move(policy)));
  // Migration between the GPU-side and CPU paths needs their equivalence
  // verified (the policy's log prints each result): kept in the journal from
  // an earlier start with the same model, placements, device and binary, or
  // checked now (an on-demand replica loaded for it, then given back).
  if (o.warmup) (void)out.gateway->verify_equivalence();
  return out;
}

}  // namespace spw::gateway
