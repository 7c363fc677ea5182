#include "gateway/builder.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <variant>

#include "admission/bandwidth.h"
#include "admission/estimator.h"
#include "admission/prior.h"
#include "backend/cpu/kernel_probe.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/vulkan/device_spec.h"
#include "core/cpu_features.h"
#include "device/host_memory.h"
#include "gateway/composition.h"
#include "engine/embedding.h"
#include "gguf/gguf.h"
#include "serve/engine_executor.h"
#include "serve/journal_observer.h"

namespace spw::gateway {
namespace {

using admission::format_bytes;

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
  Placement where = Placement::hybrid(n, gpu.vulkan_device);
  where.cpu_experts = gpu.cpu_experts;  // the GPU path's upload of the model, experts where it keeps them
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

// What one build_gateway call knows as it goes: the options, the model files
// while the plans are made, each path's plan, the paths built so far. Each
// step below reads what the steps before it set and adds its own part.
struct Composition {
  Composition(Env& e, const GatewayOptions& opts, BuiltGateway& b) : env(e), o(opts), out(b) {}
  Env& env;
  const GatewayOptions& o;
  BuiltGateway& out;
  int n_threads = 1;
  HostCpuInfo host_cpu;  // the CPU and its kernel variant: read once, for the log, status and each path
  // Read by read_model_files (released before the engines load the model).
  std::unique_ptr<gguf::GgufFile> file, fallback_file;
  LlamaHparams hp, cpu_hp;
  int32_t n_ctx = 0;         // the first path's context, resolved
  int32_t n_gpu_layers = 0;  // 0: the first path is the CPU's
  // The GPU-side paths' placement: --device, or with a mixture of experts
  // whose experts do not fit the device, the same with +cpu-experts
  // (plan_gpu_path). The offload path keeps its experts where this does
  // (they share the backend's upload of the model).
  Placement gpu_where;
  PathShape cpu_shape;       // the CPU path's (first-choice or fallback)
  admission::EstimatorConfig cfg;
  // The memory plans.
  PathPlan gpu;
  PathPlan offload;  // the hybrid path beside a full-GPU path (offload_layers)
  PathPlan cpu;
  bool device_on_host = false;  // the Vulkan device computes from host memory
  std::vector<PathNotBuilt> not_built;
  // The paths.
  std::shared_ptr<serve::RequestObserver> journal_observer;  // null without a journal
  std::shared_ptr<const Tokenizer> tok;
  std::vector<ExecutionPath> paths;
  // The GPU-side paths' breaker and device control (catalogue models on the
  // device share them).
  std::shared_ptr<CircuitBreaker> gpu_breaker;
  std::shared_ptr<DeviceControl> gpu_device;
  // Re-reads observed usage into the ledgers (make_observe): the gateway's
  // and the catalogue's residency's.
  std::function<void()> observe;
  // Rate priors: the host's bandwidth, measured at most once.
  std::map<size_t, double> host_bw;  // probe buffer bytes -> bytes/s (0: failed; key 0: the given figure)
  std::string host_bw_why;
  // The decode kernels' rates for the host shares (kernel_rates()): the
  // types probed so far, the reference figures for the rest.
  admission::KernelRates kernels = admission::reference_kernel_rates();
  std::array<bool, admission::KernelRates::kTypes> kernel_tried{};

  bool cpu_primary() const { return n_gpu_layers == 0; }
  bool full_gpu() const { return n_gpu_layers == hp.n_layer; }
};

// Opens the model (and the fallback model) file, reads their
// hyperparameters and resolves what depends on them: the first path's
// context, the layers on the GPU, the CPU path's shape. InvalidArgument
// naming the option for a context, offload or fallback model that does not
// fit the model; the loader's error for a file that does not open.
Status read_model_files(Composition& c) {
  const GatewayOptions& o = c.o;
  SPW_ASSIGN_OR_RETURN(c.file, gguf::GgufFile::open(c.env, o.model));
  SPW_ASSIGN_OR_RETURN(c.hp, read_llama_hparams(*c.file));
  c.n_ctx = o.ctx > 0 ? o.ctx : c.hp.n_ctx_train;
  if (c.n_ctx < 2 || c.n_ctx > c.hp.n_ctx_train) {
    return invalid_field("ctx", "ctx must be in [2, " + std::to_string(c.hp.n_ctx_train) +
                                    "] (the model's context_length), got " + std::to_string(c.n_ctx));
  }
  c.n_gpu_layers = o.device.gpu_layer_count(c.hp.n_layer);
  if (o.device.cpu_experts && !c.hp.moe())
    return invalid_field("device", "device " + o.device.spec() + ": the " + c.hp.arch +
                                       " model has no experts to put on the CPU (drop +cpu-experts)");
  c.gpu_where = o.device;
  if (!o.fallback_model.empty() && c.n_gpu_layers == 0) {
    return invalid_field("fallback-model", "fallback-model serves the CPU fallback of a GPU path; with device " +
                                               o.device.spec() + " the model itself is served on the CPU");
  }
  if (o.offload_layers > 0 && (!c.full_gpu() || o.offload_layers >= c.hp.n_layer)) {
    return invalid_field("offload-layers", "offload-layers N needs a full-GPU device (vulkan) and N in [1, " +
                                               std::to_string(c.hp.n_layer - 1) + "] (the model has " +
                                               std::to_string(c.hp.n_layer) + " layers), got " +
                                               std::to_string(o.offload_layers) + " with device " + o.device.spec());
  }
  // The CPU path's model file: the fallback model, or the same file.
  c.cpu_hp = c.hp;
  if (!o.fallback_model.empty()) {
    auto f = gguf::GgufFile::open(c.env, o.fallback_model);
    if (!f.ok()) return f.status().with_context("fallback-model");
    c.fallback_file = std::move(*f);
    auto fhp = read_llama_hparams(*c.fallback_file);
    if (!fhp.ok()) return fhp.status().with_context("fallback-model " + o.fallback_model);
    c.cpu_hp = *fhp;
    SPW_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_gguf(*c.file));
    auto ftok = Tokenizer::from_gguf(*c.fallback_file);
    if (!ftok.ok()) return ftok.status().with_context("fallback-model " + o.fallback_model);
    if ((*ftok)->fingerprint() != tok->fingerprint()) {
      return invalid_field("fallback-model",
                           "fallback-model " + o.fallback_model + ": its tokenizer differs from " + o.model +
                               "'s; a fallback model must share the tokenizer (same prompt tokens, template and "
                               "stop rules), e.g. a smaller model of the same family");
    }
  }
  if (c.cpu_primary()) {
    c.cpu_shape = path_shape(o, admission::PathRole::kPrimary, c.n_ctx);
  } else {
    c.cpu_shape = path_shape(o, admission::PathRole::kFallback, c.n_ctx);
    c.cpu_shape.ctx = std::min(c.cpu_shape.ctx, c.cpu_hp.n_ctx_train);
  }
  return Status::ok_status();
}

// The device side of a GPU first path: opens the Vulkan device and makes its
// DeviceLedger (capacity = device_memory or the largest device-local heap,
// headroom, the declared co-tenants, a first heap reading). A device that
// does not open, or a model it cannot compute, leaves the GPU path unbuilt
// (reason kept; returns OK with out.device_ledger null). Errors: a headroom
// or co-tenant the ledger refuses.
Status open_device_ledger(Composition& c) {
  const GatewayOptions& o = c.o;
  VulkanBackendOptions vo;
  vo.device = o.device.vulkan_device;
  vo.memory_budget_bytes = o.device_memory.value_or(0);
  vo.host_threads = c.n_threads;  // a mixture of experts' experts run on the host
  // A model with matrices the shaders do not compute (a type the CPU does
  // not load either, so in practice a file refused later) leaves the GPU
  // paths unbuilt, reported with the tensor and type.
  const Status types = vulkan_check_weight_types(*c.file);
  auto v = types.ok() ? VulkanBackend::create(vo) : Result<std::shared_ptr<VulkanBackend>>(types);
  if (!v.ok()) {
    c.not_built.push_back(
        {"gpu", types.ok() ? "device " + o.device.spec() + ": " + v.status().to_string() : types.message()});
    return Status::ok_status();
  }
  c.out.vulkan = std::move(*v);
  const std::string& type = c.out.vulkan->device_info().type;
  c.device_on_host = type == "cpu" || type == "integrated-gpu";
  c.cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(c.out.vulkan->device_info());
  admission::HeadroomPolicy headroom;
  headroom.fraction = o.device_headroom_share;
  headroom.bytes = o.device_headroom;
  auto ledger =
      admission::DeviceLedger::create(c.out.vulkan->name(), c.out.vulkan->memory_stats().budget_bytes, headroom);
  if (!ledger.ok()) return ledger.status().with_context("device-headroom / device-headroom-share");
  c.out.device_ledger = std::shared_ptr<admission::DeviceLedger>(std::move(*ledger));
  for (const CoTenant& ct : o.co_tenants) {
    auto t = c.out.device_ledger->declare({admission::OwnerKind::kCoTenant, ct.name}, ct.bytes);
    if (!t.ok()) return t.status().with_context("co-tenant " + ct.name);
  }
  (void)observe_device(*c.out.vulkan, *c.out.device_ledger);
  return Status::ok_status();
}

// The GPU path's memory plan on an open device ledger: its KV pool sized to
// what the ledger has left after weights and scratch, min(wanted, what fits),
// after the offload path's device KV is set aside (when offload_layers > 0
// and the GPU pool still gets at least 2 blocks; else that path is not
// built). Reserves one device ticket for both, then the host side of the
// plan in the host ledger; any that does not fit leaves the GPU-side paths
// unbuilt with the reason (OK). Errors: the estimator's.
Status plan_gpu_path(Composition& c) {
  const GatewayOptions& o = c.o;
  const Placement spec = c.gpu_where;
  const size_t not_built_before = c.not_built.size();
  const std::string& owner = c.out.model_name;
  auto estimate = [&](int32_t blocks) {
    return admission::estimate(*c.file, path_plan(spec, c.n_ctx, o.parallel, blocks, c.n_threads, o.kv_type), c.cfg);
  };
  SPW_ASSIGN_OR_RETURN(admission::Estimate e1, estimate(1));
  SPW_ASSIGN_OR_RETURN(admission::Estimate e2, estimate(2));
  const uint64_t per_block = std::max<uint64_t>(1, e2.gpu().total() - e1.gpu().total());
  const uint64_t fixed = e1.gpu().total() - std::min(e1.gpu().total(), per_block);
  const uint64_t available_all = c.out.device_ledger->available();
  const int32_t want =
      wanted_kv_blocks(o, admission::PathRole::kPrimary, path_shape(o, admission::PathRole::kPrimary, c.n_ctx));
  auto fit_in = [&](uint64_t available) {
    const int64_t fit = available > fixed ? static_cast<int64_t>((available - fixed) / per_block) : 0;
    return static_cast<int32_t>(std::min<int64_t>(want, fit));
  };
  // The offload path's device KV comes out of the budget first: it is
  // what serves the prompts the GPU pool cannot hold.
  if (o.offload_layers > 0) {
    SPW_ASSIGN_OR_RETURN(
        c.offload, plan_offload(*c.file, spec, o.offload_layers, c.n_ctx, kBlockTokens, c.n_threads, o.kv_type, c.cfg));
    if (fit_in(available_all > c.offload.device_bytes ? available_all - c.offload.device_bytes : 0) < 2) {
      c.not_built.push_back({"hybrid", "its KV for one full context on " + std::to_string(o.offload_layers) +
                                           " GPU layers (" + format_bytes(c.offload.device_bytes) +
                                           ") would leave the GPU path no room for its KV pool"});
      c.offload = PathPlan{};
    } else {
      c.offload.built = true;
    }
  }
  const uint64_t available = available_all > c.offload.device_bytes ? available_all - c.offload.device_bytes : 0;
  const int32_t blocks = fit_in(available);
  if (blocks < want && c.hp.moe() && !spec.cpu_experts) {
    // A mixture of experts whose experts leave no room for the KV pool it
    // wants: the experts of the first K layers on the CPU (most of the
    // bytes, few of the FLOPs), the fewest K with which the pool gets its
    // blocks, else every layer's; before giving up the device. (The offload
    // path's device KV is planned again with the new placement.)
    const int32_t n_gpu = spec.gpu_layer_count(c.hp.n_layer);
    Placement where = spec.with_cpu_experts();
    for (int32_t k = 1; k < n_gpu; ++k) {
      auto ek = admission::estimate(*c.file, path_plan(spec.with_cpu_experts(k), c.n_ctx, o.parallel, 1, c.n_threads,
                                                       o.kv_type), c.cfg);
      if (!ek.ok()) break;
      const uint64_t fixed_k = ek->gpu().total() - std::min(ek->gpu().total(), per_block);
      if (available > fixed_k && static_cast<int64_t>((available - fixed_k) / per_block) >= want) {
        where = spec.with_cpu_experts(k);
        break;
      }
    }
    if (blocks < 2 || where.cpu_expert_layers > 0) {
      c.out.log.push_back("gpu path: " + spec.name() + " needs " + format_bytes(fixed) + " plus " +
                          format_bytes(per_block) + " per KV block, " + format_bytes(available) +
                          " available: planning " +
                          (where.cpu_expert_layers > 0 ? "the experts of its first " +
                                                             std::to_string(where.cpu_expert_layers) + " layers"
                                                       : std::string("its experts")) +
                          " on the CPU (" + where.name() + ")");
      c.not_built.resize(not_built_before);
      c.offload = PathPlan{};
      c.gpu_where = where;
      return plan_gpu_path(c);
    }
  }
  if (blocks < 2) {
    c.not_built.push_back({"gpu", "weights and scratch need " + format_bytes(fixed) + " plus " +
                                      format_bytes(per_block) + " per KV block; the device ledger has " +
                                      format_bytes(available) + " available (" + c.out.device_ledger->name() +
                                      ", device-memory / device-headroom / co-tenants)"});
    return Status::ok_status();
  }
  SPW_ASSIGN_OR_RETURN(admission::Estimate e, estimate(blocks));
  // One device ticket for the GPU path and the offload path beside it.
  const uint64_t device_bytes = e.gpu().total() + c.offload.device_bytes;
  auto t = c.out.device_ledger->reserve({admission::OwnerKind::kModelWeights, owner}, device_bytes);
  if (!t.ok()) {
    c.not_built.push_back({"gpu", t.status().message()});
    c.offload = PathPlan{};
    return Status::ok_status();
  }
  PathPlan& gpu = c.gpu;
  gpu.built = true;
  gpu.kv_blocks = blocks;
  gpu.shares = admission::stream_shares(*c.file, e);
  gpu.device_ticket = *t;
  gpu.device_bytes = device_bytes;
  gpu.host_bytes = host_bytes_beyond_baseline(e, c.cfg) + c.offload.host_bytes + (c.device_on_host ? device_bytes : 0);
  c.out.log.push_back("gpu path: " + std::to_string(blocks) + " KV blocks of " + std::to_string(kBlockTokens) +
                      " tokens (" + (blocks < want ? "bounded by device memory, " : "") + "wanted " +
                      std::to_string(want) + "), device plan " + format_bytes(gpu.device_bytes) + " of " +
                      format_bytes(c.out.device_ledger->snapshot().limit) + " on " + c.out.device_ledger->name());
  // The host side of the plan (CPU layers, scratch; on a device computing
  // from host memory, its device bytes too).
  auto h =
      c.out.host_ledger->reserve({admission::OwnerKind::kModelWeights, owner}, std::max<uint64_t>(1, gpu.host_bytes));
  if (!h.ok()) {
    c.not_built.push_back({"gpu", "host side of the GPU plan: " + h.status().message()});
    (void)c.out.device_ledger->release(gpu.device_ticket);
    gpu.built = false;
    c.offload = PathPlan{};
  } else {
    gpu.host_ticket = *h;
  }
  return Status::ok_status();
}

// The CPU path's memory plan (the first-choice path with a cpu device, else
// the fallback unless cpu_fallback is false): its KV pool for the shape's
// workers and context, its scratch, and its weights unless they are the GPU
// path's mapping of the same file, reserved in the host ledger. Not built
// (reason kept, OK) when the host cannot hold it. Errors: the estimator's.
Status plan_cpu_path(Composition& c) {
  const GatewayOptions& o = c.o;
  if (!c.cpu_primary() && !o.cpu_fallback) return Status::ok_status();
  const admission::PathRole role = c.cpu_primary() ? admission::PathRole::kPrimary : admission::PathRole::kFallback;
  const PathShape& shape = c.cpu_shape;
  const int32_t blocks = wanted_kv_blocks(o, role, shape);
  const gguf::GgufFile& file = c.fallback_file ? *c.fallback_file : *c.file;
  SPW_ASSIGN_OR_RETURN(
      admission::Estimate e,
      admission::estimate(file, path_plan(Placement::cpu(), shape.ctx, shape.workers, blocks, c.n_threads, o.kv_type),
                          c.cfg));
  uint64_t need = host_bytes_beyond_baseline(e, c.cfg);
  // The same file's mapping is shared with the GPU path: counted there
  // already. A fallback model's weights are its own, whatever its replica
  // mode: the path must be able to run when work is sent to it.
  if (c.gpu.built && !c.fallback_file) need -= std::min(need, e.host().weights.bytes);
  const std::string& model_owner = c.out.model_name;
  const std::string owner = c.cpu_primary()   ? model_owner
                            : c.fallback_file ? model_name_from_path(o.fallback_model) + " (cpu path)"
                                              : model_owner + " (cpu path)";
  auto t = c.out.host_ledger->reserve({admission::OwnerKind::kModelWeights, owner}, std::max<uint64_t>(1, need));
  if (!t.ok()) {
    c.not_built.push_back(
        {"cpu", "its plan needs " + format_bytes(need) + " of host memory: " + t.status().message() +
                    ". Lower --cpu-ctx or --cpu-parallel, or raise --host-memory-share / --host-budget"});
    return Status::ok_status();
  }
  c.cpu.built = true;
  c.cpu.kv_blocks = blocks;
  c.cpu.shares = admission::stream_shares(file, e);
  c.cpu.host_ticket = *t;
  c.cpu.host_bytes = need;
  return Status::ok_status();
}

// The host's read bandwidth for a share whose decode step reads
// `working_set` weight bytes: host_bandwidth when given; else measured over a
// buffer of that size (between the probe's 1 MiB floor and its 64 MiB
// default), as a decode step rereads its weights every step: a model that
// fits in the caches is read from them, not from DRAM (the bundled 1 MB
// model: a 64 MiB probe priced its steps 2-3x too slow). Each buffer size is
// measured once, with the paths' thread count, and kept; 0 when the
// measurement fails (host_bw_why says why). Logged either way.
double host_bandwidth(Composition& c, uint64_t working_set) {
  if (c.o.host_bandwidth > 0) {
    if (c.host_bw.empty()) {
      c.out.log.push_back("host read bandwidth " + std::to_string(static_cast<int64_t>(c.o.host_bandwidth / 1e6)) +
                          " MB/s (given)");
      c.host_bw[0] = c.o.host_bandwidth;
    }
    return c.o.host_bandwidth;
  }
  admission::BandwidthProbeOptions bo;
  bo.n_threads = c.n_threads;
  bo.buffer_bytes = std::clamp<size_t>(working_set, size_t{1} << 20, bo.buffer_bytes);
  if (auto it = c.host_bw.find(bo.buffer_bytes); it != c.host_bw.end()) return it->second;
  const int64_t t0 = c.env.now_ns();
  Result<double> bw = admission::measure_read_bandwidth(c.env, bo);
  if (!bw.ok()) {
    c.host_bw[bo.buffer_bytes] = 0.0;
    c.host_bw_why = "host bandwidth not measured: " + bw.status().message();
    c.out.log.push_back(c.host_bw_why);
    return 0;
  }
  c.host_bw[bo.buffer_bytes] = *bw;
  c.out.log.push_back("host read bandwidth " + std::to_string(static_cast<int64_t>(*bw / 1e6)) + " MB/s measured (" +
                      std::to_string(c.n_threads) + " threads over " + format_bytes(bo.buffer_bytes) + ", " +
                      std::to_string((c.env.now_ns() - t0) / 1000000) + " ms)");
  return *bw;
}

std::string format_rate(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB/s", bytes_per_s / 1e9);
  return buf;
}

// The decode kernels' rates for a host share's weight types: each type
// probed once on this host (backend/cpu/kernel_probe.h, a few ms each) and
// kept; a type whose probe fails (a simulated clock) keeps the reference
// machine's figure. A given host_bandwidth means no start-up probes: the
// kernels take the reference figures too. Logged.
const admission::KernelRates& kernel_rates(Composition& c, const admission::StreamShare& sh) {
  if (c.o.host_bandwidth > 0) return c.kernels;
  std::string measured, failed;
  const int64_t t0 = c.env.now_ns();
  for (const admission::TypeBytes& tb : sh.matrix_bytes) {
    if (tb.ggml_type >= admission::KernelRates::kTypes || c.kernel_tried[tb.ggml_type]) continue;
    c.kernel_tried[tb.ggml_type] = true;
    const std::string name = gguf::ggml_type_name(tb.ggml_type);
    Result<double> r = cpu::measure_decode_kernel_rate(c.env, static_cast<gguf::GgmlType>(tb.ggml_type));
    if (!r.ok()) {
      failed += (failed.empty() ? "" : "; ") + name + ": " + r.status().message();
      continue;
    }
    c.kernels.bytes_per_s[tb.ggml_type] = *r;
    c.kernels.measured[tb.ggml_type] = true;
    measured += (measured.empty() ? "" : ", ") + name + " " + format_rate(*r);
  }
  if (!measured.empty()) {
    c.out.log.push_back("decode kernels measured (1 thread, matrix in cache): " + measured + " (" +
                        std::to_string((c.env.now_ns() - t0) / 1000000) + " ms)");
  }
  if (!failed.empty()) c.out.log.push_back("decode kernels not measured, reference figures kept: " + failed);
  return c.kernels;
}

// A path's rate prior (admission/prior.h) from what its decode step streams.
// A GPU's memory: lavapipe's ("cpu") and an integrated GPU's are the host's
// DRAM, so they take the host figure (lavapipe runs its shaders on the
// host's cores; an integrated GPU may reach somewhat more or less than the
// cores do); a discrete GPU's is not measured (no device-side probe yet):
// its paths start from the default rates unless device_bandwidth is given.
admission::RatePrior rate_prior(Composition& c, std::vector<admission::StreamShare> shares) {
  const GatewayOptions& o = c.o;
  admission::RatePrior rp;
  rp.constants = o.prior_constants;
  std::string why;
  for (admission::StreamShare& sh : shares) {
    if (sh.device == admission::DeviceKind::kHost) {
      sh.bandwidth = rp.host_bandwidth = host_bandwidth(c, sh.weight_bytes);
      if (sh.bandwidth <= 0) why = c.host_bw_why;
      const admission::KernelRates& kr = kernel_rates(c, sh);
      sh.compute_s = admission::kernel_seconds(sh, kr);
      for (const admission::TypeBytes& tb : sh.matrix_bytes)
        rp.kernels.push_back({tb.ggml_type, kr.rate(tb.ggml_type), kr.is_measured(tb.ggml_type)});
    } else if (o.device_bandwidth > 0) {
      sh.bandwidth = rp.device_bandwidth = o.device_bandwidth;
      rp.device_bandwidth_source = "given";
    } else if (c.device_on_host) {
      sh.bandwidth = rp.device_bandwidth = host_bandwidth(c, sh.weight_bytes);
      rp.device_bandwidth_source =
          "host memory (the Vulkan device is of type " + c.out.vulkan->device_info().type + ")";
      if (sh.bandwidth <= 0) why = c.host_bw_why;
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
}

// One path to build: its scheduler over `model` (or, with on_demand, over a
// model loaded by its first request).
struct PathSpec {
  std::string name;
  Placement where;
  admission::PathRole role = admission::PathRole::kPrimary;
  PathShape shape;
  int32_t blocks = 0;
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
  std::shared_ptr<ModelResidency> residency;                   // a catalogue model's: around every run
};

// A path spec of the first path's model (its name, tokenizer).
PathSpec model_path_spec(const Composition& c, std::string name, Placement where, admission::PathRole role,
                         PathShape shape) {
  PathSpec ps;
  ps.name = std::move(name);
  ps.where = std::move(where);
  ps.role = role;
  ps.shape = shape;
  ps.model = c.out.model;
  ps.tokenizer = c.tok;
  ps.model_name = c.out.model_name;
  return ps;
}

// Builds one path: its engine scheduler (scheduler_options() for its shape,
// the journal's and its breaker's observer, the KV gate on its blocks, the
// options' batching), warms it up when its model is loaded and warmup is on,
// and adds it to c.paths with a log line. Errors: the engine's.
Status make_path(Composition& c, PathSpec ps) {
  const GatewayOptions& o = c.o;
  const serve::SchedulerOptions sched =
      scheduler_options(o, ps.name, ps.shape, path_observer(c.journal_observer, ps.breaker));
  serve::EngineServeOptions so;
  so.device = ps.where;
  so.vulkan = c.out.vulkan;
  so.n_workers = ps.shape.workers;
  so.n_threads = c.n_threads;
  so.n_ctx = sched.n_ctx;
  so.kv_blocks = ps.blocks;
  so.kv_block_tokens = sched.kv_block_tokens;
  so.kv_type = o.kv_type;
  // A path without a device gets an injector for its cores' slow faults.
  std::shared_ptr<FaultInjector> cpu_faults = ps.device ? nullptr : std::make_shared<FaultInjector>();
  so.cpu_faults = cpu_faults.get();
  so.queue_capacity = sched.queue_capacity;
  so.observer = sched.observer;
  so.path_name = sched.path;
  so.kv_gate = true;
  so.checkpoint_every = sched.checkpoint_every;
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
  const int64_t t0 = c.env.now_ns();
  auto replica = std::make_shared<Replica>(ps.replica);
  serve::EngineServing serving;
  if (ps.model) {
    SPW_ASSIGN_OR_RETURN(serving, serve::make_engine_scheduler(c.env, ps.model, so));
  } else {
    serve::OnDemandModel odm;
    odm.load = ps.load;
    odm.tokenizer = ps.tokenizer;
    odm.hparams = ps.hparams;
    odm.on_loaded = [replica](double ms) { replica->mark_loaded(ms); };
    if (ps.residency) {
      // A catalogue model: its memory is reserved (room made) before its
      // load, given back by eviction (residency.h).
      // The residency's unit is the path.
      std::weak_ptr<ModelResidency> weak = ps.residency;
      const std::string unit = ps.name;
      odm.on_loaded = [weak, unit](double ms) {
        if (auto r = weak.lock()) r->loaded(unit, ms);
      };
      odm.begin_run = [weak, unit](const std::atomic<bool>& cancel) {
        auto r = weak.lock();
        return r ? r->begin_run(unit, cancel) : Status::ok_status();
      };
      odm.end_run = [weak, unit](bool loaded) {
        if (auto r = weak.lock()) r->end_run(unit, loaded);
      };
    }
    SPW_ASSIGN_OR_RETURN(serving, serve::make_on_demand_scheduler(c.env, std::move(odm), so));
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
  {
    const LlamaHparams& hp = ps.model ? ps.model->hparams() : ps.hparams;
    if (embedding_support(hp).ok()) p.pooling = hp.pooling;
    p.embedding_dims = hp.n_embd;
  }
  p.cpu_kernels = c.host_cpu.kernels;
  p.prior = ps.prior;
  p.kv_type = std::string(kv_type_name(o.kv_type));
  p.scheduler = std::move(serving.scheduler);
  p.batcher = serving.batcher;
  p.unload = std::move(serving.unload);
  // An on-demand path is not warmed up: that would load it.
  if (o.warmup && ps.model) warm_up(c.env, *p.scheduler);
  p.startup_ms = static_cast<double>(c.env.now_ns() - t0) / 1e6;
  c.out.log.push_back(ps.name + " path: " + serving.placement_detail + ", model " + ps.model_name + ", " +
                      std::to_string(ps.shape.workers) + " workers, queue " + std::to_string(ps.shape.queue) +
                      ", ctx " + std::to_string(ps.shape.ctx) + ", " + std::to_string(ps.blocks) + " KV blocks (" +
                      std::string(kv_type_name(o.kv_type)) + "), replica " + ps.replica.mode +
                      (ps.replica.why.empty() ? "" : " (" + ps.replica.why + ")") + ", ready in " +
                      std::to_string(static_cast<int64_t>(p.startup_ms)) + " ms");
  c.paths.push_back(std::move(p));
  return Status::ok_status();
}

// The GPU-side paths of a built GPU plan: the first-choice path ("gpu", or
// "hybrid" for a hybrid:N device) and the offload path beside it, sharing
// one CircuitBreaker (breaker_options) and one DeviceControl for the device
// (they fail together: same device, same uploaded weights). Then commits
// the plan's tickets: the device ticket at what the backend holds now, if
// more than planned. Errors: the engine's, the ledgers'.
Status build_gpu_paths(Composition& c) {
  const GatewayOptions& o = c.o;
  SPW_ASSIGN_OR_RETURN(const BreakerOptions breaker_opts, breaker_options(o));
  SPW_ASSIGN_OR_RETURN(std::shared_ptr<CircuitBreaker> breaker,
                       CircuitBreaker::create(c.env, c.out.vulkan->name(), breaker_opts));
  std::shared_ptr<DeviceControl> device = make_device_control(c.env, c.out.vulkan);
  c.gpu_breaker = breaker;
  c.gpu_device = device;
  PathSpec ps = model_path_spec(c, c.full_gpu() ? "gpu" : "hybrid", c.gpu_where, admission::PathRole::kPrimary,
                                path_shape(o, admission::PathRole::kPrimary, c.n_ctx));
  ps.breaker = breaker;
  ps.device = device;
  ps.blocks = c.gpu.kv_blocks;
  ps.ledger = c.out.device_ledger;
  ps.prior = rate_prior(c, c.gpu.shares);
  ps.replica.mode = "warm";
  ps.replica.why = "the first-choice path: its layers' weights uploaded at start";
  SPW_RETURN_IF_ERROR(make_path(c, std::move(ps)));
  if (c.offload.built) {
    Placement offload_where = Placement::hybrid(o.offload_layers, o.device.vulkan_device);
    offload_where.cpu_experts = c.gpu_where.cpu_experts;
    PathSpec hs = model_path_spec(c, "hybrid", offload_where,
                                  admission::PathRole::kOffload, path_shape(o, admission::PathRole::kOffload, c.n_ctx));
    hs.blocks = c.offload.kv_blocks;
    hs.prior = rate_prior(c, c.offload.shares);
    hs.ledger = c.out.device_ledger;
    hs.breaker = breaker;
    hs.device = device;
    hs.replica.why = "the GPU path's model: its first " + std::to_string(o.offload_layers) +
                     " layers' uploaded weights and the mapping for the rest";
    SPW_RETURN_IF_ERROR(make_path(c, std::move(hs)));
  }
  const uint64_t held = std::max(c.gpu.device_bytes, c.out.vulkan->memory_stats().used_bytes);
  SPW_RETURN_IF_ERROR(c.out.device_ledger->commit(c.gpu.device_ticket, held));
  SPW_RETURN_IF_ERROR(c.out.host_ledger->commit(c.gpu.host_ticket, std::max<uint64_t>(1, c.gpu.host_bytes)));
  return Status::ok_status();
}

// The CPU path of a built CPU plan, with its replica: warm as the first
// choice; as the fallback, chosen by choose_replica() (options.replica) when
// it has a model of its own or the same file as a full-GPU path without an
// offload path (whose host pages it may then drop), else shared with the
// GPU-side paths' mapping. Commits its host ticket. Errors: the replica
// measurement's, the engine's, the ledger's.
Status build_cpu_path(Composition& c) {
  const GatewayOptions& o = c.o;
  const admission::PathRole role = c.gpu.built ? admission::PathRole::kFallback : admission::PathRole::kPrimary;
  PathSpec cs = model_path_spec(c, "cpu", Placement::cpu(), role, c.cpu_shape);
  cs.blocks = c.cpu.kv_blocks;
  cs.ledger = c.out.host_ledger;
  cs.prior = rate_prior(c, c.cpu.shares);
  if (c.cpu_primary()) {
    cs.replica.mode = "warm";
    cs.replica.why = "the first-choice path: mapped and read in at start";
  } else if (!o.fallback_model.empty() || (c.gpu.built && c.full_gpu() && !c.offload.built)) {
    // A replica of its own, or the same file whose host pages a full-GPU
    // path does not need: the mode decides what stays resident.
    const bool same_file = o.fallback_model.empty();
    const std::string file = same_file ? o.model : o.fallback_model;
    SPW_ASSIGN_OR_RETURN(ReplicaChoice rc, choose_replica(c.env, file, o.replica, o.recovery_budget_ms,
                                                          same_file ? c.out.model : nullptr));
    cs.replica = rc.info;
    cs.model = rc.model;
    cs.tokenizer = rc.tokenizer;
    cs.hparams = rc.hparams;
    cs.load = [&env = c.env, file]() { return Model::load(env, file); };
    // On demand, the same file is the same model (its load checks the
    // tokenizer); another file's fingerprint is not known until loaded.
    if (same_file) cs.fingerprint = c.out.model->fingerprint();
    if (!same_file) {
      cs.model_name = model_name_from_path(o.fallback_model);
      cs.fallback_model = true;
    }
  } else {
    cs.replica.mode = "shared";
    cs.replica.why = c.gpu.built ? "the GPU-side paths run CPU layers from the same mapping, resident for them"
                                 : "the model's mapping (no GPU path was built)";
  }
  SPW_RETURN_IF_ERROR(make_path(c, std::move(cs)));
  SPW_RETURN_IF_ERROR(c.out.host_ledger->commit(c.cpu.host_ticket, std::max<uint64_t>(1, c.cpu.host_bytes)));
  return Status::ok_status();
}

// The ledgers' observed usage re-read now (host readings, the device heap),
// with out.observe_host / observe_device set for /health: made once
// (Composition::observe), the gateway's observe and the residency's after
// an eviction.
std::function<void()> make_observe(Composition& c) {
  BuiltGateway& out = c.out;
  auto host_ledger = out.host_ledger;
  out.observe_host = [&env = c.env, host_ledger] {
    if (auto r = host_readings(env); r.ok()) host_ledger->update(*r);
  };
  if (out.vulkan && out.device_ledger) {
    out.observe_device = [device_ledger = out.device_ledger, vulkan = out.vulkan] {
      return observe_device(*vulkan, *device_ledger);
    };
  }
  return [observe_host = out.observe_host, observe_device = out.observe_device] {
    observe_host();
    if (observe_device) (void)observe_device();
  };
}

Status add_models_dir(const GatewayOptions& o, std::vector<CatalogueModel>& out);

// The catalogue beyond the first model: options.models, then models_dir's
// *.gguf files (sorted; the first model's and the fallback model's files
// skipped), each named by CatalogueModel::name or its file's stem.
Result<std::vector<CatalogueModel>> catalogue_models(const GatewayOptions& o) {
  namespace fs = std::filesystem;
  std::vector<CatalogueModel> out = o.models;
  if (!o.models_dir.empty()) SPW_RETURN_IF_ERROR(add_models_dir(o, out));
  // The settings by name: pinned, preloaded, keep-alive.
  auto find = [&](const std::string& name, const char* field) -> Result<CatalogueModel*> {
    for (CatalogueModel& m : out) {
      if ((m.name.empty() ? model_name_from_path(m.path) : m.name) == name) return &m;
    }
    return invalid_field(field, std::string(field) + " " + name + ": no catalogue model has this name (the served " +
                                    "model is always loaded)");
  };
  for (const std::string& n : o.pin) {
    SPW_ASSIGN_OR_RETURN(CatalogueModel * m, find(n, "pin"));
    m->pinned = true;
  }
  for (const std::string& n : o.preload) {
    SPW_ASSIGN_OR_RETURN(CatalogueModel * m, find(n, "preload"));
    m->preload = true;
  }
  for (const auto& [n, s] : o.model_keep_alive) {
    SPW_ASSIGN_OR_RETURN(CatalogueModel * m, find(n, "model-keep-alive"));
    m->keep_alive_s = s;
  }
  return out;
}

// models_dir's *.gguf files not already in `out`, the served model's and the
// fallback model's skipped, sorted by name.
Status add_models_dir(const GatewayOptions& o, std::vector<CatalogueModel>& out) {
  namespace fs = std::filesystem;
  SPW_ASSIGN_OR_RETURN(const std::vector<std::string> files, models_dir_files(o.models_dir));
  auto same = [](const std::string& a, const std::string& b) {
    std::error_code e2;
    return !b.empty() && fs::equivalent(a, b, e2);
  };
  for (const std::string& f : files) {
    if (same(f, o.model) || same(f, o.fallback_model)) continue;
    bool listed = false;
    for (const CatalogueModel& m : o.models) listed = listed || same(f, m.path);
    if (listed) continue;
    CatalogueModel m;
    m.path = f;
    m.from_dir = true;
    out.push_back(std::move(m));
  }
  return Status::ok_status();
}

// One path of a catalogue model and its plan (build_catalogue_model).
struct CatalogueUnit {
  std::string name;  // "gpu/coder", "cpu/coder"
  Placement where;
  bool gpu_side = false;  // some layers on the device
  admission::PathRole role = admission::PathRole::kPrimary;
  PathShape shape;
  int32_t blocks = 0;
  std::vector<ModelCharge> charges;
  std::vector<admission::StreamShare> shares;
  double predicted_ms = 0;
};

// One catalogue model: its file read (hyperparameters, tokenizer, template),
// its paths' memory plans (weights, KV for the path's workers' full contexts,
// scratch; device bytes on the device ledger, the rest on the host ledger,
// and on a device computing from host memory its device bytes there too),
// each path registered with the residency as a unit: the first-choice path
// on the served model's placement ("gpu/NAME", "hybrid/NAME" or "cpu/NAME")
// and, beside a GPU one, a CPU fallback "cpu/NAME" (cpu_parallel workers,
// cpu_queue, cpu_ctx) unless cpu_fallback is off. A file that cannot be
// served is an error naming the entry, or with from_dir an unavailable entry
// (OK).
Status build_catalogue_model(Composition& c, const CatalogueModel& cm, std::set<std::string>& names) {
  const GatewayOptions& o = c.o;
  CatalogueEntry entry;
  entry.path = cm.path;
  entry.name = cm.name.empty() ? model_name_from_path(cm.path) : cm.name;
  auto refuse = [&](const std::string& why) -> Status {
    if (!cm.from_dir) return invalid_field("model", "model " + entry.name + " (" + cm.path + "): " + why);
    entry.reason = why;
    c.out.log.push_back("model " + entry.name + " (" + cm.path + ") unavailable: " + why);
    c.out.catalogue.push_back(std::move(entry));
    return Status::ok_status();
  };
  if (!names.insert(entry.name).second) return refuse("another model of the catalogue has this name");
  auto file = gguf::GgufFile::open(c.env, cm.path);
  if (!file.ok()) return refuse(file.status().message());
  auto hp = read_llama_hparams(**file);
  if (!hp.ok()) return refuse(hp.status().message());
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok.ok()) return refuse(tok.status().message());
  if (const gguf::Value* v = (*file)->find("tokenizer.chat_template");
      v != nullptr && std::holds_alternative<std::string>(v->v)) {
    entry.chat_template = std::get<std::string>(v->v);
  }
  // Its placement: the first path's device when the first model's GPU-side
  // path was built there, else the CPU; beside a GPU path, a CPU fallback
  // path too (unless --no-cpu-fallback), a residency unit of its own.
  const bool on_device = c.gpu.built && c.out.device_ledger && c.out.vulkan;
  if (on_device) {
    if (Status types = vulkan_check_weight_types(**file); !types.ok()) return refuse(types.message());
  }
  const int32_t ctx = std::min(o.ctx > 0 ? o.ctx : hp->n_ctx_train, hp->n_ctx_train);
  CatalogueUnit first;
  first.where = on_device ? o.device : Placement::cpu();
  first.where.cpu_experts = first.where.cpu_experts && hp->moe();  // a dense model has none to move
  first.role = admission::PathRole::kPrimary;
  first.shape = path_shape(o, admission::PathRole::kPrimary, ctx);
  first.shape.ctx = ctx;
  first.name = std::string(on_device ? (c.full_gpu() ? "gpu/" : "hybrid/") : "cpu/") + entry.name;
  std::vector<CatalogueUnit> units{first};
  if (on_device && o.cpu_fallback) {
    CatalogueUnit cpu;
    cpu.where = Placement::cpu();
    cpu.role = admission::PathRole::kFallback;
    cpu.shape = path_shape(o, admission::PathRole::kFallback, ctx);
    cpu.shape.ctx = std::min(cpu.shape.ctx, hp->n_ctx_train);
    cpu.name = "cpu/" + entry.name;
    units.push_back(cpu);
  }
  // Each unit's plan, checked against its ledgers' limits before anything
  // is registered (a plan that can never fit refuses the whole entry).
  for (CatalogueUnit& u : units) {
    u.gpu_side = u.where.gpu_layer_count(hp->n_layer) > 0;
    u.blocks = u.shape.workers * ((u.shape.ctx + kBlockTokens - 1) / kBlockTokens);
    auto e = admission::estimate(**file, path_plan(u.where, u.shape.ctx, u.shape.workers, u.blocks, c.n_threads,
                                                   o.kv_type), c.cfg);
    if (!e.ok()) return refuse(e.status().message());
    const uint64_t device_bytes = u.gpu_side ? e->gpu().total() : 0;
    const uint64_t host_bytes = host_bytes_beyond_baseline(*e, c.cfg) + (c.device_on_host ? device_bytes : 0);
    if (device_bytes > 0) u.charges.push_back({c.out.device_ledger, device_bytes});
    u.charges.push_back({c.out.host_ledger, std::max<uint64_t>(1, host_bytes)});
    for (const ModelCharge& ch : u.charges) {
      const uint64_t limit = ch.ledger->snapshot().limit;
      if (ch.bytes > limit) {
        return refuse("its " + u.name + " plan needs " + format_bytes(ch.bytes) + " on " + ch.ledger->name() +
                      ", whose limit is " + format_bytes(limit) +
                      " (lower --ctx or --parallel, or raise the memory budget)");
      }
    }
    u.shares = admission::stream_shares(**file, *e);
    // The load's prior: reading the file at ~1 GB/s (a cold page cache),
    // plus the upload of its device bytes at the same rate; the first
    // load's measured time replaces it.
    u.predicted_ms = 20.0 + static_cast<double>((*file)->file_size() + device_bytes) / 1e6;
  }
  const std::optional<double> keep_alive = cm.pinned ? std::optional<double>(-1.0) : cm.keep_alive_s;
  auto tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tok));
  // Its compatibility fingerprint, as a load would compute it (binding the
  // mapping reads a few sampled bytes per tensor, not the weights): what a
  // checkpoint of this model carries, so a resume finds these paths.
  std::string fingerprint;
  if (auto probe = Model::load_from(std::move(*file)); probe.ok()) fingerprint = (*probe)->fingerprint();
  for (const CatalogueUnit& u : units) {
    // Pinned and preloaded: the first-choice unit only (the CPU copy loads
    // when work is sent to it).
    const bool first_choice = u.role == admission::PathRole::kPrimary;
    SPW_RETURN_IF_ERROR(c.out.residency->add(u.name, entry.name, u.charges, cm.pinned && first_choice, keep_alive,
                                             u.predicted_ms));
    PathSpec ps;
    ps.name = u.name;
    ps.where = u.where;
    ps.role = u.role;
    ps.shape = u.shape;
    ps.blocks = u.blocks;
    ps.ledger = u.gpu_side ? std::shared_ptr<admission::MemoryLedger>(c.out.device_ledger)
                           : std::shared_ptr<admission::MemoryLedger>(c.out.host_ledger);
    ps.tokenizer = tokenizer;
    ps.hparams = *hp;
    ps.model_name = entry.name;
    ps.fingerprint = fingerprint;
    ps.load = [&env = c.env, path = cm.path]() { return Model::load(env, path); };
    ps.prior = rate_prior(c, u.shares);
    if (u.gpu_side) {
      ps.breaker = c.gpu_breaker;
      ps.device = c.gpu_device;
    }
    ps.replica.mode = "on-demand";
    ps.replica.why = !first_choice ? "catalogue model, CPU fallback: loaded when work is sent to it, evicted when "
                                     "idle for room or after its keep-alive"
                     : cm.pinned  ? "catalogue model, pinned: loaded at start, never evicted"
                     : cm.preload ? "catalogue model: loaded at start, evicted when idle for room or after its "
                                    "keep-alive"
                                  : "catalogue model: loaded by its first request, evicted when idle for room or "
                                    "after its keep-alive";
    ps.replica.recovery_ms = u.predicted_ms;
    ps.replica.loaded = false;
    ps.residency = c.out.residency;
    SPW_RETURN_IF_ERROR(make_path(c, std::move(ps)));
    ExecutionPath& path = c.paths.back();
    c.out.residency->bind(u.name, path.unload, path.replica);
    if (first_choice && (cm.pinned || cm.preload) && o.warmup) warm_up(c.env, *path.scheduler);
  }
  entry.available = true;
  c.out.catalogue.push_back(std::move(entry));
  return Status::ok_status();
}

// The catalogue's models beyond the first, under one ModelResidency over
// the shared ledgers (none: nothing to do).
Status build_catalogue(Composition& c) {
  const GatewayOptions& o = c.o;
  SPW_ASSIGN_OR_RETURN(const std::vector<CatalogueModel> models, catalogue_models(o));
  if (models.empty()) return Status::ok_status();
  ResidencyOptions ro;
  ro.keep_alive_s = o.keep_alive_s;
  ro.min_residency_s = o.min_residency_s;
  ro.observe = c.observe;
  ro.log = [](const std::string& line) { std::fprintf(stderr, "spillway serve: %s\n", line.c_str()); };
  c.out.residency = std::make_shared<ModelResidency>(c.env, std::move(ro));
  std::set<std::string> names{c.out.model_name};
  if (!o.fallback_model.empty()) names.insert(model_name_from_path(o.fallback_model));
  for (const CatalogueModel& m : models) SPW_RETURN_IF_ERROR(build_catalogue_model(c, m, names));
  c.out.residency->start_expiry();
  return Status::ok_status();
}

// The CPU and its kernel variant (backend/cpu/kernel_variant.h), for status.
HostCpuInfo host_cpu_info() {
  const CpuFeatures& f = host_cpu_features();
  const cpu::KernelVariantInfo v = cpu::active_kernel_variant();
  HostCpuInfo h{f.brand, f.usable(), v.name, v.isa, {}};
  for (const cpu::KernelVariantInfo& b : cpu::kernel_variants()) h.built.push_back(b.name);
  return h;
}

// The gateway over the built paths: gateway_policy() of the options, with
// the ledgers' readings (out.observe_host / observe_device) as its observe,
// stderr as its log and the journal as its equivalence store; then, with
// warmup, the equivalence check migration needs (the policy's log prints
// each result).
Status start_gateway(Composition& c) {
  BuiltGateway& out = c.out;
  GatewayPolicy policy = gateway_policy(c.o);
  policy.log = [](const std::string& line) { std::fprintf(stderr, "spillway serve: %s\n", line.c_str()); };
  policy.host_cpu = c.host_cpu;
  policy.observe = c.observe;
  policy.residency = out.residency;
  for (const auto& n : c.not_built) out.log.push_back(n.name + " path not built: " + n.reason);
  if (out.journal) policy.equivalence_store = journal_equivalence_store(out.journal, out.vulkan.get());
  SPW_ASSIGN_OR_RETURN(out.gateway,
                       Gateway::create(c.env, std::move(c.paths), std::move(c.not_built), std::move(policy)));
  // Migration between the GPU-side and CPU paths needs their equivalence
  // verified: kept in the journal from an earlier start with the same model,
  // placements, device and binary, or checked now (an on-demand replica
  // loaded for it, then given back).
  if (c.o.warmup) (void)out.gateway->verify_equivalence();
  return Status::ok_status();
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

Result<std::vector<std::string>> models_dir_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::error_code fe;
    if (e.path().extension() == ".gguf" && e.is_regular_file(fe)) files.push_back(e.path().string());
  }
  if (ec) return invalid_field("models-dir", "models-dir " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::string model_name_from_path(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

Result<BuiltGateway> build_gateway(Env& env, const GatewayOptions& o) {
  BuiltGateway out;
  SPW_RETURN_IF_ERROR(check_options(o));
  Composition c(env, o, out);
  c.n_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  out.model_name = model_name_from_path(o.model);
  SPW_RETURN_IF_ERROR(read_model_files(c));
  SPW_ASSIGN_OR_RETURN(out.host_ledger, make_host_ledger(env, o));
  if (const auto rss = device::HostMemoryProbe(env).read().process_rss_bytes; rss.known()) {
    c.cfg.host.fixed_overhead = rss.value();
  }
  c.cfg.host_kernels.q8_0_x16 = cpu::active_kernel_traits().q8_0_x16;
  c.host_cpu = host_cpu_info();
  out.log.push_back("CPU kernels: " + c.host_cpu.kernels + " (" +
                    (c.host_cpu.kernels_isa.empty() ? "scalar" : c.host_cpu.kernels_isa) + ")" +
                    (c.host_cpu.brand.empty() ? "" : " on " + c.host_cpu.brand));
  // The plans, GPU side first: the CPU path counts the shared mapping only
  // when no GPU path holds it.
  if (c.n_gpu_layers > 0) {
    SPW_RETURN_IF_ERROR(open_device_ledger(c));
    if (out.device_ledger) SPW_RETURN_IF_ERROR(plan_gpu_path(c));
  }
  SPW_RETURN_IF_ERROR(plan_cpu_path(c));
  if (!c.gpu.built && !c.cpu.built) {
    std::string why;
    for (const auto& n : c.not_built) why += (why.empty() ? "" : "; ") + n.name + ": " + n.reason;
    return Status(StatusCode::kResourceExhausted, "no execution path fits: " + why, FailureReason::kNoPath);
  }
  c.file.reset();
  c.fallback_file.reset();

  SPW_ASSIGN_OR_RETURN(out.journal, open_journal(env, o));
  {
    SPW_ASSIGN_OR_RETURN(auto m, Model::load(env, o.model));
    out.model = std::shared_ptr<const Model>(std::move(m));
  }
  if (out.journal) c.journal_observer = std::make_shared<serve::JournalObserver>(out.journal);
  c.tok = std::shared_ptr<const Tokenizer>(out.model, &out.model->tokenizer());
  if (c.gpu.built) SPW_RETURN_IF_ERROR(build_gpu_paths(c));
  if (c.cpu.built) SPW_RETURN_IF_ERROR(build_cpu_path(c));
  c.observe = make_observe(c);
  SPW_RETURN_IF_ERROR(build_catalogue(c));
  SPW_RETURN_IF_ERROR(start_gateway(c));
  return out;
}

}  // namespace spw::gateway
