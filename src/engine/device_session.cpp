#include "engine/device_session.h"

#include <algorithm>

namespace spw {
namespace {

KvPoolOptions pool_options(const Model& m, int32_t layer_begin, int32_t layer_end, const DeviceSessionOptions& o,
                           int32_t n_ctx) {
  KvPoolOptions kv;
  kv.layer_begin = layer_begin;
  kv.layer_end = layer_end;
  kv.n_embd_kv = m.hparams().n_embd_kv();
  kv.block_tokens = o.kv_block_tokens;
  kv.n_blocks = (n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens;
  return kv;
}

std::string layer_range(int32_t begin, int32_t end) {
  return end - begin == 1 ? std::to_string(begin) : std::to_string(begin) + "-" + std::to_string(end - 1);
}

}  // namespace

Result<DeviceSession> open_device_session(std::shared_ptr<const Model> model, const DeviceSessionOptions& o) {
  if (o.kv_block_tokens < 1) return Status::invalid_argument("kv_block_tokens must be >= 1");
  const Model& m = *model;
  const int32_t n_layer = m.hparams().n_layer;
  const int32_t n_ctx = o.n_ctx > 0 ? o.n_ctx : m.hparams().n_ctx_train;
  SessionOptions so;
  so.n_ctx = n_ctx;
  so.n_ubatch = o.n_ubatch;

  // Layers [0, n_gpu) on Vulkan, the rest on the CPU.
  int32_t n_gpu = 0;
  switch (o.device.kind) {
    case DeviceSpec::Kind::kCpu: n_gpu = 0; break;
    case DeviceSpec::Kind::kVulkan: n_gpu = n_layer; break;
    case DeviceSpec::Kind::kHybrid: n_gpu = std::clamp(o.device.gpu_layers, 0, n_layer); break;
  }

  DeviceSession ds;
  std::vector<SessionStage> stages;
  if (n_gpu > 0) {
    VulkanBackendOptions vo;
    vo.device = o.device.vulkan_device;
    vo.memory_budget_bytes = o.device_memory_bytes;
    SPW_ASSIGN_OR_RETURN(ds.vulkan, VulkanBackend::create(vo));
    SPW_ASSIGN_OR_RETURN(auto pool, ds.vulkan->create_kv_pool(pool_options(m, 0, n_gpu, o, n_ctx), "session"));
    stages.push_back({ds.vulkan, std::move(pool), 0, n_gpu});
  }
  if (n_gpu < n_layer) {
    ds.cpu = std::make_shared<CpuBackend>(o.n_threads);
    SPW_ASSIGN_OR_RETURN(auto pool, KvPool::create(pool_options(m, n_gpu, n_layer, o, n_ctx)));
    stages.push_back({ds.cpu, std::move(pool), n_gpu, n_layer});
  }
  SPW_ASSIGN_OR_RETURN(ds.session, Session::create_staged(std::move(model), std::move(stages), so));

  const std::string vk_name = ds.vulkan ? "vulkan (" + ds.vulkan->device_info().name + ")" : "";
  if (n_gpu == 0) {
    ds.placement = "cpu";
  } else if (n_gpu == n_layer) {
    ds.placement = vk_name;
  } else {
    ds.placement = "hybrid: layers " + layer_range(0, n_gpu) + " " + vk_name + ", " + layer_range(n_gpu, n_layer) +
                   " cpu";
  }
  return ds;
}

Result<KvPoolOptions> cpu_session_group_pool(const Model& model, const CpuSessionGroupOptions& o) {
  auto bad = [](const std::string& what, int64_t v, const std::string& rule) {
    return Status::invalid_argument(what + " must be " + rule + ", got " + std::to_string(v));
  };
  if (o.n_sessions < 1) return bad("n_sessions", o.n_sessions, ">= 1");
  if (o.n_threads < 1) return bad("n_threads", o.n_threads, ">= 1");
  if (o.kv_block_tokens < 1) return bad("kv_block_tokens", o.kv_block_tokens, ">= 1");
  if (o.kv_blocks < 0) return bad("kv_blocks", o.kv_blocks, ">= 0");
  const LlamaHparams& hp = model.hparams();
  const int32_t n_ctx = o.n_ctx == 0 ? hp.n_ctx_train : o.n_ctx;
  if (n_ctx < 2 || n_ctx > hp.n_ctx_train) {
    return bad("n_ctx", n_ctx, "in [2, " + std::to_string(hp.n_ctx_train) + "] (the model's context_length)");
  }
  KvPoolOptions po;
  po.layer_begin = 0;
  po.layer_end = hp.n_layer;
  po.n_embd_kv = hp.n_embd_kv();
  po.block_tokens = o.kv_block_tokens;
  const int32_t full = (n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens * o.n_sessions;
  po.n_blocks = o.kv_blocks == 0 ? full : o.kv_blocks;
  return po;
}

Result<CpuSessionGroup> open_cpu_session_group(std::shared_ptr<const Model> model, const CpuSessionGroupOptions& o,
                                               std::shared_ptr<KvPool> pool) {
  if (!model) return Status::invalid_argument("open_cpu_session_group: no model");
  SPW_ASSIGN_OR_RETURN(KvPoolOptions po, cpu_session_group_pool(*model, o));
  const LlamaHparams& hp = model->hparams();
  CpuSessionGroup g;
  g.n_ctx = o.n_ctx == 0 ? hp.n_ctx_train : o.n_ctx;
  const int32_t full = (g.n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens * o.n_sessions;
  if (pool) {
    if (pool->n_blocks() != po.n_blocks || pool->block_tokens() != po.block_tokens) {
      return Status::invalid_argument("open_cpu_session_group: the given pool does not match the options");
    }
    g.pool = std::move(pool);
  } else {
    SPW_ASSIGN_OR_RETURN(g.pool, KvPool::create(po));
  }
  g.full_pool = g.pool->n_blocks() >= full;
  g.backend = std::make_shared<CpuBackend>(o.n_threads);
  SPW_RETURN_IF_ERROR(g.backend->prepare(*model, 0, hp.n_layer, true, true));
  SessionOptions so;
  so.n_ctx = g.n_ctx;
  so.n_ubatch = o.n_ubatch;
  for (int32_t i = 0; i < o.n_sessions; ++i) {
    SPW_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create(model, g.backend, g.pool, so));
    g.sessions.push_back(std::move(s));
  }
  return g;
}

}  // namespace spw
