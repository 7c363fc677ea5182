#include "engine/device_session.h"

#include <algorithm>

namespace spw {
namespace {

std::string layer_range(int32_t begin, int32_t end) {
  return end - begin == 1 ? std::to_string(begin) : std::to_string(begin) + "-" + std::to_string(end - 1);
}

// The checks shared by the pool options and the group; returns n_ctx.
Result<int32_t> check_group(const Model& model, const SessionGroupOptions& o) {
  auto bad = [](const std::string& what, int64_t v, const std::string& rule) {
    return Status::invalid_argument(what + " must be " + rule + ", got " + std::to_string(v));
  };
  if (o.n_sessions < 1) return bad("n_sessions", o.n_sessions, ">= 1");
  if (o.n_threads < 1) return bad("n_threads", o.n_threads, ">= 1");
  if (o.kv_block_tokens < 1) return bad("kv_block_tokens", o.kv_block_tokens, ">= 1");
  if (o.kv_blocks < 0) return bad("kv_blocks", o.kv_blocks, ">= 0");
  const LlamaHparams& hp = model.hparams();
  // Past context_length is the caller's choice (generate allows it, as
  // llama.cpp does); the server refuses it before it gets here.
  const int32_t n_ctx = o.n_ctx == 0 ? hp.n_ctx_train : o.n_ctx;
  if (n_ctx < 1) return bad("n_ctx", n_ctx, ">= 1 (0: the model's context_length)");
  return n_ctx;
}

int32_t full_blocks(const SessionGroupOptions& o, int32_t n_ctx) {
  return (n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens * o.n_sessions;
}

KvPoolOptions stage_pool(const Model& m, const SessionGroupOptions& o, int32_t n_ctx, int32_t begin, int32_t end) {
  KvPoolOptions po;
  po.layer_begin = begin;
  po.layer_end = end;
  po.n_embd_kv = m.hparams().n_embd_kv();
  po.block_tokens = o.kv_block_tokens;
  po.n_blocks = o.kv_blocks == 0 ? full_blocks(o, n_ctx) : o.kv_blocks;
  po.type = o.kv_type;
  po.head_dim = m.hparams().head_dim();
  // Sliding-window layers (Gemma): their K/V in the window plane, a ring of
  // blocks per session instead of the whole context (kv_cache.h).
  const LlamaHparams& hp = m.hparams();
  const int32_t per_seq = kv_window_blocks_per_seq(hp.n_swa, o.kv_block_tokens, o.n_ubatch, n_ctx);
  std::vector<int32_t> swa = hp.swa_layers(begin, end);
  if (per_seq > 0 && !swa.empty()) {
    po.window = hp.n_swa;
    po.swa_layers = std::move(swa);
    po.max_chunk = o.n_ubatch;
    po.n_window_blocks = o.kv_blocks == 0 ? per_seq * o.n_sessions : std::min(o.kv_blocks, per_seq * o.n_sessions);
  }
  return po;
}

}  // namespace

Result<KvPoolOptions> session_group_host_pool(const Model& model, const SessionGroupOptions& o) {
  SPW_ASSIGN_OR_RETURN(const int32_t n_ctx, check_group(model, o));
  const int32_t n_layer = model.hparams().n_layer;
  const int32_t n_gpu = o.device.gpu_layer_count(n_layer);
  if (n_gpu == n_layer) return Status::invalid_argument("session group: every layer is on Vulkan, no CPU stage");
  return stage_pool(model, o, n_ctx, n_gpu, n_layer);
}

Result<SessionGroup> open_session_group(std::shared_ptr<const Model> model, const SessionGroupOptions& o,
                                        std::shared_ptr<KvPool> host_pool) {
  if (!model) return Status::invalid_argument("open_session_group: no model");
  const Model& m = *model;
  SPW_ASSIGN_OR_RETURN(const int32_t n_ctx, check_group(m, o));
  const int32_t n_layer = m.hparams().n_layer;
  if (o.device.cpu_experts && !m.hparams().moe())
    return Status::invalid_argument("placement " + o.device.name() + ": " + m.hparams().arch +
                                    " model has no experts to put on the CPU (drop +cpu-experts)");
  SessionGroup g;
  g.n_ctx = n_ctx;
  g.n_gpu_layers = o.device.gpu_layer_count(n_layer);

  std::vector<SessionStage> stages;
  if (g.n_gpu_layers > 0) {
    if (o.vulkan) {
      g.vulkan = o.vulkan;
    } else {
      VulkanBackendOptions vo;
      vo.device = o.device.vulkan_device;
      vo.memory_budget_bytes = o.device_memory_bytes;
      vo.host_threads = o.n_threads;  // a mixture of experts' experts run on the host
      SPW_ASSIGN_OR_RETURN(g.vulkan, VulkanBackend::create(vo));
    }
    // A mixture's experts on the device or the host, before anything uploads.
    if (m.hparams().moe()) {
      SPW_RETURN_IF_ERROR(g.vulkan->set_cpu_experts(m, o.device.cpu_experts, o.device.cpu_expert_layers));
    }
    SPW_ASSIGN_OR_RETURN(auto pool,
                         g.vulkan->create_kv_pool(stage_pool(m, o, n_ctx, 0, g.n_gpu_layers), "sessions"));
    stages.push_back({g.vulkan, pool, 0, g.n_gpu_layers});
    g.pools.push_back(std::move(pool));
  }
  if (g.n_gpu_layers < n_layer) {
    const KvPoolOptions po = stage_pool(m, o, n_ctx, g.n_gpu_layers, n_layer);
    if (host_pool) {
      const KvPoolOptions& have = host_pool->options();
      if (have.n_blocks != po.n_blocks || have.block_tokens != po.block_tokens ||
          have.layer_begin != po.layer_begin || have.layer_end != po.layer_end || have.type != po.type ||
          have.window != po.window || have.n_window_blocks != po.n_window_blocks) {
        return Status::invalid_argument("open_session_group: the given host pool does not match the options");
      }
    } else {
      SPW_ASSIGN_OR_RETURN(host_pool, KvPool::create(po));
    }
    g.cpu = std::make_shared<CpuBackend>(o.n_threads);
    g.cpu->set_faults(o.cpu_faults);
    stages.push_back({g.cpu, host_pool, g.n_gpu_layers, n_layer});
    g.pools.push_back(std::move(host_pool));
  }
  g.full_pool = true;
  for (const auto& p : g.pools) g.full_pool = g.full_pool && p->n_blocks() >= full_blocks(o, n_ctx);

  SessionOptions so;
  so.n_ctx = n_ctx;
  so.n_ubatch = o.n_ubatch;
  for (int32_t i = 0; i < o.n_sessions; ++i) {
    SPW_ASSIGN_OR_RETURN(std::unique_ptr<Session> s, Session::create_staged(model, stages, so));
    g.sessions.push_back(std::move(s));
  }

  const std::string vk_name = g.vulkan ? "vulkan (" + g.vulkan->device_info().name + ")" : "";
  if (g.n_gpu_layers == 0) {
    g.placement = "cpu";
  } else if (g.n_gpu_layers == n_layer) {
    g.placement = vk_name;
  } else {
    g.placement = "hybrid: layers " + layer_range(0, g.n_gpu_layers) + " " + vk_name + ", " +
                  layer_range(g.n_gpu_layers, n_layer) + " cpu";
  }
  if (g.n_gpu_layers > 0 && o.device.cpu_experts) {
    const int32_t k = o.device.cpu_expert_layers;
    g.placement += k > 0 && k < g.n_gpu_layers ? ", experts of layers " + layer_range(0, k) + " on the cpu"
                                                : ", experts on the cpu";
  }
  return g;
}

Result<DeviceSession> open_device_session(std::shared_ptr<const Model> model, const DeviceSessionOptions& o) {
  if (o.n_sessions != 1) {
    return Status::invalid_argument("open_device_session: n_sessions must be 1, got " + std::to_string(o.n_sessions) +
                                    " (use open_session_group)");
  }
  SPW_ASSIGN_OR_RETURN(SessionGroup g, open_session_group(std::move(model), o));
  DeviceSession ds;
  ds.cpu = std::move(g.cpu);
  ds.vulkan = std::move(g.vulkan);
  ds.session = std::move(g.sessions.front());
  ds.placement = std::move(g.placement);
  return ds;
}

}  // namespace spw
