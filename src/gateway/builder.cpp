#include "gateway/builder.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "admission/estimator.h"
#include "backend/vulkan/device_spec.h"
#include "device/cgroup.h"
#include "device/host_memory.h"
#include "gguf/gguf.h"
#include "serve/engine_executor.h"
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
  SPW_ASSIGN_OR_RETURN(std::unique_ptr<journal::Journal> j, journal::Journal::open(env, path, jo));
  return std::shared_ptr<journal::Journal>(std::move(j));
}

// The estimator's plan for one path of the serving layout (ubatch 64 or the
// context when smaller; last row of logits per eval).
// estimate() resolves the placement for the model, as the engine runs it.
admission::Plan path_plan(const Placement& where, int32_t n_ctx, int32_t workers, int32_t kv_blocks, int n_threads) {
  admission::Plan plan;
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

}  // namespace

Result<std::string> default_journal_path() {
  std::string base;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && x[0] == '/') base = x;
  else if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') base = std::string(h) + "/.local/state";
  else return Status::invalid_argument("no HOME or XDG_STATE_HOME to put the journal in: pass --journal PATH or --journal none");
  return base + "/spillway/journal.sqlite";
}

std::string model_name_from_path(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

Result<BuiltGateway> build_gateway(Env& env, const GatewayOptions& o) {
  BuiltGateway out;
  const int n_threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.parallel < 1) return invalid_field("parallel", "--parallel must be >= 1, got " + std::to_string(o.parallel));
  if (o.cpu_parallel < 1) {
    return invalid_field("cpu-parallel", "--cpu-parallel must be >= 1, got " + std::to_string(o.cpu_parallel));
  }
  if (o.queue < 0 || o.cpu_queue < 0) return invalid_field("queue", "--queue and --cpu-queue must be >= 0");
  if (o.ctx < 0 || o.cpu_ctx < 0 || o.kv_blocks < 0) {
    return invalid_field("ctx", "--ctx, --cpu-ctx and --kv-blocks must be >= 0");
  }
  if (!(o.pressure_threshold > 0) || !(o.max_delay_s >= 0) || o.min_shrink_tokens < 1 || !(o.observe_interval_s >= 0)) {
    return invalid_field("pressure-threshold",
                         "--pressure-threshold must be > 0, --max-delay-s and --observe-interval-s >= 0, "
                         "--min-shrink-tokens >= 1");
  }
  auto spec = Placement::parse(o.device);
  if (!spec.ok()) return spec.status().with_context("--device");
  uint64_t device_memory = 0;
  if (!o.device_memory.empty()) {
    SPW_ASSIGN_OR_RETURN(device_memory, parse_memory_size(o.device_memory));
  }
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
    return invalid_field("ctx", "--ctx must be in [2, " + std::to_string(hp.n_ctx_train) +
                                    "] (the model's context_length), got " + std::to_string(n_ctx));
  }
  const int32_t cpu_ctx = std::min(o.cpu_ctx > 0 ? o.cpu_ctx : n_ctx, hp.n_ctx_train);
  constexpr int32_t kBlockTokens = 16;
  const int32_t n_gpu_layers = spec->gpu_layer_count(hp.n_layer);

  // Host ledger: everything this server holds in host memory.
  admission::HostBudgetPolicy hpol;
  hpol.mem_available_share = o.host_memory_share;
  if (!o.host_budget.empty()) {
    auto cap = parse_memory_size(o.host_budget);
    if (!cap.ok()) return cap.status().with_context("--host-budget " + o.host_budget);
    hpol.cap_bytes = *cap;
  }
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
  struct PathPlan {
    bool built = false;
    int32_t kv_blocks = 0;
    uint64_t host_bytes = 0;
    uint64_t device_bytes = 0;
    admission::Ticket host_ticket, device_ticket;
  };
  PathPlan gpu;
  bool device_on_host = false;
  if (n_gpu_layers > 0) {
    VulkanBackendOptions vo;
    vo.device = spec->vulkan_device;
    vo.memory_budget_bytes = device_memory;
    auto v = VulkanBackend::create(vo);
    if (!v.ok()) {
      not_built.push_back({"gpu", "--device " + o.device + ": " + v.status().to_string()});
    } else {
      out.vulkan = std::move(*v);
      device_on_host = out.vulkan->device_info().type == "cpu" || out.vulkan->device_info().type == "integrated-gpu";
      cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(out.vulkan->device_info());
      admission::HeadroomPolicy headroom;
      headroom.fraction = o.device_headroom_share;
      if (o.device_headroom != "0") {
        auto h = parse_memory_size(o.device_headroom);
        if (!h.ok()) return h.status().with_context("--device-headroom " + o.device_headroom);
        headroom.bytes = *h;
      }
      auto ledger = admission::DeviceLedger::create(out.vulkan->name(), out.vulkan->memory_stats().budget_bytes, headroom);
      if (!ledger.ok()) return ledger.status().with_context("--device-headroom / --device-headroom-share");
      out.device_ledger = std::shared_ptr<admission::DeviceLedger>(std::move(*ledger));
      for (const std::string& ct : o.co_tenants) {
        const size_t eq = ct.find('=');
        if (eq == 0 || eq == std::string::npos) {
          return invalid_field("co-tenant", "--co-tenant " + ct + ": expected NAME=SIZE, e.g. whisper=3GiB");
        }
        auto bytes = parse_memory_size(ct.substr(eq + 1));
        if (!bytes.ok()) return bytes.status().with_context("--co-tenant " + ct);
        auto t = out.device_ledger->declare({admission::OwnerKind::kCoTenant, ct.substr(0, eq)}, *bytes);
        if (!t.ok()) return t.status().with_context("--co-tenant " + ct);
      }
      (void)observe_device(*out.vulkan, *out.device_ledger);
      // Size the pool to what the device has left after weights and scratch.
      SPW_ASSIGN_OR_RETURN(admission::Estimate e1,
                           admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, 1, n_threads), cfg));
      SPW_ASSIGN_OR_RETURN(admission::Estimate e2,
                           admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, 2, n_threads), cfg));
      const uint64_t per_block = std::max<uint64_t>(1, e2.gpu().total() - e1.gpu().total());
      const uint64_t fixed = e1.gpu().total() - std::min(e1.gpu().total(), per_block);
      const uint64_t available = out.device_ledger->available();
      const int32_t want = o.kv_blocks > 0 ? o.kv_blocks : o.parallel * admission::kv_blocks_for(n_ctx, kBlockTokens);
      const int64_t fit = available > fixed ? static_cast<int64_t>((available - fixed) / per_block) : 0;
      const int32_t blocks = static_cast<int32_t>(std::min<int64_t>(want, fit));
      if (blocks < 2) {
        not_built.push_back(
            {"gpu", "weights and scratch need " + format_bytes(fixed) + " plus " + format_bytes(per_block) +
                        " per KV block; the device ledger has " + format_bytes(available) + " available (" +
                        out.device_ledger->name() + ", --device-memory / --device-headroom / co-tenants)"});
      } else {
        SPW_ASSIGN_OR_RETURN(admission::Estimate e,
                             admission::estimate(*file, path_plan(*spec, n_ctx, o.parallel, blocks, n_threads), cfg));
        auto t = out.device_ledger->reserve({admission::OwnerKind::kModelWeights, model_owner}, e.gpu().total());
        if (!t.ok()) {
          not_built.push_back({"gpu", t.status().message()});
        } else {
          gpu.built = true;
          gpu.kv_blocks = blocks;
          gpu.device_ticket = *t;
          gpu.device_bytes = e.gpu().total();
          gpu.host_bytes = host_bytes_beyond_baseline(e, cfg) + (device_on_host ? e.gpu().total() : 0);
          out.log.push_back("gpu path: " + std::to_string(blocks) + " KV blocks of " + std::to_string(kBlockTokens) +
                            " tokens (" + (blocks < want ? "bounded by device memory, " : "") + "wanted " +
                            std::to_string(want) + "), device plan " + format_bytes(gpu.device_bytes) + " of " +
                            format_bytes(out.device_ledger->snapshot().limit) + " on " + out.device_ledger->name());
        }
      }
    }
  }
  if (gpu.built) {
    auto t = out.host_ledger->reserve({admission::OwnerKind::kModelWeights, model_owner}, std::max<uint64_t>(1, gpu.host_bytes));
    if (!t.ok()) {
      not_built.push_back({"gpu", "host side of the GPU plan: " + t.status().message()});
      (void)out.device_ledger->release(gpu.device_ticket);
      gpu.built = false;
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
    const int32_t blocks = cpu_primary && o.kv_blocks > 0 ? o.kv_blocks
                                                          : cpu_workers * admission::kv_blocks_for(cpu_n_ctx, kBlockTokens);
    SPW_ASSIGN_OR_RETURN(
        admission::Estimate e,
        admission::estimate(*file, path_plan(Placement::cpu(), cpu_n_ctx, cpu_workers, blocks, n_threads), cfg));
    uint64_t need = host_bytes_beyond_baseline(e, cfg);
    // The mapping is shared with the GPU path: counted there already.
    if (gpu.built) need -= std::min(need, e.host().weights.bytes);
    auto t = out.host_ledger->reserve({admission::OwnerKind::kModelWeights, model_owner + (cpu_primary ? "" : " (cpu path)")},
                                      std::max<uint64_t>(1, need));
    if (!t.ok()) {
      not_built.push_back({"cpu", "its plan needs " + format_bytes(need) + " of host memory: " + t.status().message() +
                                      ". Lower --cpu-ctx or --cpu-parallel, or raise --host-memory-share / --host-budget"});
    } else {
      cpu.built = true;
      cpu.kv_blocks = blocks;
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

  SPW_ASSIGN_OR_RETURN(out.journal, open_journal(env, o));
  {
    SPW_ASSIGN_OR_RETURN(auto m, Model::load(env, o.model));
    out.model = std::shared_ptr<const Model>(std::move(m));
  }
  std::shared_ptr<serve::RequestObserver> observer;
  if (out.journal) observer = std::make_shared<serve::JournalObserver>(out.journal);
  std::shared_ptr<const Tokenizer> tok(out.model, &out.model->tokenizer());

  std::vector<ExecutionPath> paths;
  auto make_path = [&](const std::string& name, Placement where, int32_t workers, int32_t queue, int32_t ctx,
                       int32_t blocks, admission::PathRole role,
                       std::shared_ptr<admission::MemoryLedger> ledger) -> Status {
    serve::EngineServeOptions so;
    so.device = std::move(where);
    so.vulkan = out.vulkan;
    so.n_workers = workers;
    so.n_threads = n_threads;
    so.n_ctx = ctx;
    so.kv_blocks = blocks;
    so.kv_block_tokens = kBlockTokens;
    so.queue_capacity = queue;
    so.observer = observer;
    so.path_name = name;
    so.kv_gate = true;
    const int64_t t0 = env.now_ns();
    SPW_ASSIGN_OR_RETURN(serve::EngineServing serving, serve::make_engine_scheduler(env, out.model, so));
    ExecutionPath p;
    p.name = name;
    p.placement = serving.scheduler->placement();
    p.model = out.model_name;
    p.role = role;
    p.replica = "shared";
    p.tokenizer = tok;
    p.ledger = std::move(ledger);
    p.scheduler = std::move(serving.scheduler);
    if (o.warmup) warm_up(env, *p.scheduler);
    p.recovery_ms = static_cast<double>(env.now_ns() - t0) / 1e6;
    out.log.push_back(name + " path: " + serving.placement_detail + ", " + std::to_string(workers) + " workers, queue " +
                      std::to_string(queue) + ", ctx " + std::to_string(ctx) + ", " + std::to_string(blocks) +
                      " KV blocks, ready in " + std::to_string(static_cast<int64_t>(p.recovery_ms)) + " ms");
    paths.push_back(std::move(p));
    return Status::ok_status();
  };
  if (gpu.built) {
    SPW_RETURN_IF_ERROR(make_path(n_gpu_layers == hp.n_layer ? "gpu" : "hybrid", *spec, o.parallel, o.queue, n_ctx,
                                  gpu.kv_blocks, admission::PathRole::kPrimary, out.device_ledger));
    const uint64_t held = std::max(gpu.device_bytes, out.vulkan->memory_stats().used_bytes);
    SPW_RETURN_IF_ERROR(out.device_ledger->commit(gpu.device_ticket, held));
    SPW_RETURN_IF_ERROR(out.host_ledger->commit(gpu.host_ticket, std::max<uint64_t>(1, gpu.host_bytes)));
  }
  if (cpu.built) {
    SPW_RETURN_IF_ERROR(make_path("cpu", Placement::cpu(), cpu_workers, cpu_primary ? o.queue : o.cpu_queue, cpu_n_ctx,
                                  cpu.kv_blocks, gpu.built ? admission::PathRole::kFallback : admission::PathRole::kPrimary,
                                  out.host_ledger));
    SPW_RETURN_IF_ERROR(out.host_ledger->commit(cpu.host_ticket, std::max<uint64_t>(1, cpu.host_bytes)));
  }

  GatewayPolicy policy;
  policy.admission.pressure_threshold = o.pressure_threshold;
  policy.admission.max_delay_s = o.max_delay_s;
  policy.admission.allow_shrink = o.allow_shrink;
  policy.admission.min_shrink_tokens = o.min_shrink_tokens;
  policy.observe_interval_s = o.observe_interval_s;
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
  SPW_ASSIGN_OR_RETURN(out.gateway, Gateway::create(env, std::move(paths), std::move(not_built), std::move(policy)));
  return out;
}

}  // namespace spw::gateway
