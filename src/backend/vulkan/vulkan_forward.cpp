// The forward pass: the embedding lookup (embed, on the host: cpu::embed_tokens),
// the layers on the device (forward_layers / forward_batch, recorded step by
// step by BatchPass) and the output head (output).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/moe.h"
#include "backend/vulkan/vulkan_backend_internal.h"

namespace spw {

// A row gather on the host (cpu_backend.h): the hidden states go to the device
// with the layers' inputs anyway, so an embedding pass on it was one more
// submission and host round trip per step, and a device copy of token_embd
// that only a tied head needs.
Status VulkanBackend::embed(const Model& model, std::span<const TokenId> tokens, float* hidden) {
  return cpu::embed_tokens(model, tokens, hidden);
}

namespace {

using Recorder = VulkanBackend::Impl::Recorder;

// forward_batch over the rows of one KV pool, in its steps: build_rows, bind,
// size_scratch, upload_inputs, then record, which records each layer as
// record_qkv, record_attention and record_ffn. The members are what the
// steps share, grouped by the step that sets them.
struct BatchPass {
  BatchPass(VulkanBackend::Impl& impl, const Model& m, std::span<const SeqSlice> sl)
      : im(impl), model(m), hp(m.hparams()), slices(sl) {}

  void build_rows();
  Status bind(int32_t layer_begin, int32_t layer_end);
  Status size_scratch();
  void upload_inputs(const float* hidden);
  Status record(int32_t layer_begin, int32_t layer_end, float* hidden);
  void record_qkv(Recorder& rec, const DevLayer& L, int32_t il);
  void record_attention(Recorder& rec, const DevLayer& L, size_t lp, int32_t il);
  void record_ffn(Recorder& rec, const DevLayer& L);
  Status host_experts(std::optional<Recorder>& rec, const DevLayer& L, int32_t il);
  Status device_experts(std::optional<Recorder>& rec, const DevLayer& L);
  void expert_ffn(Recorder& rec, VkBuffer in, uint32_t rows, const DevMatrix& gate, const DevMatrix& up,
                  const DevMatrix& down, uint32_t first, uint32_t weights);
  void swiglu_ffn(Recorder& rec, VkBuffer in, uint32_t rows, const DevMatrix& gate, const DevMatrix& up,
                  const DevMatrix& down, VkBuffer y);
  void rms(Recorder& rec, VkBuffer w);
  // Adds `from` to the residual, through Gemma's post-norm `w` when it has one.
  void add_normed(Recorder& rec, VkBuffer from, const DeviceBuffer& w);
  // Whether the sliding layers have their own RoPE table (Gemma 3).
  bool local_rope() const { return hp.has_local_rope() && half > 0; }
  void add(Recorder& rec, VkBuffer from, uint64_t count);

  VulkanBackend::Impl& im;
  const Model& model;
  const LlamaHparams& hp;
  std::span<const SeqSlice> slices;
  KvPool* pool = slices[0].kv.pool;
  const KvPoolOptions& kvo = pool->options();
  const int32_t bt = pool->block_tokens();
  Scratch& s = im.scratch;
  // Set by build_rows.
  // The row table (position and block-table offset per row, kv_write.comp)
  // followed by each slice's block ids; per plane of the pool (kv_cache.h:
  // the sliding-window layers' blocks are the second's).
  std::vector<int32_t> table, window_table;
  uint64_t n = 0, max_pos = 0;
  // Set by bind.
  VulkanKvStorage* kvs = nullptr;
  bool kv_f16 = false;
  ModelWeights* mw = nullptr;
  bool dev_experts = false;  // some layer's experts are on the device
  // The host side of the pass's MoE layers, made by the first such layer
  // and reused by the rest: host_experts' rows, gate, up and cpu::moe_ffn's
  // scratch (uninitialised, as the CPU backend's: every element is written
  // first), device_experts' routing (cpu::moe_route, cpu::moe_group).
  std::unique_ptr<float[]> host_x, host_gate, host_up;
  std::unique_ptr<std::byte[]> host_scratch;
  struct Routing {
    std::vector<float> probs, weight, gate_logit;
    std::vector<int32_t> id, order, first, cursor;
  } route;
  // Set by size_scratch.
  uint64_t E = 0, KV = 0, FF = 0, Q = 0;
  uint32_t hd = 0, half = 0;
  uint64_t n_pos = 0, row_bytes = 0, tc = 0;
  // Set by record.
  uint32_t eps_bits = 0, scale_bits = 0, nt = 0;
};

void BatchPass::build_rows() {
  for (const SeqSlice& sl : slices) {
    n += static_cast<uint64_t>(sl.n_tokens);
    max_pos = std::max<uint64_t>(max_pos, static_cast<uint64_t>(sl.pos0) + static_cast<uint64_t>(sl.n_tokens));
  }
  for (int plane = 0; plane < (pool->has_window() ? 2 : 1); ++plane) {
    std::vector<int32_t>& t = plane == 0 ? table : window_table;
    uint64_t n_block_ids = 0;
    for (const SeqSlice& sl : slices) n_block_ids += sl.kv.table->blocks(plane).size();
    t.reserve(2 * n + n_block_ids);
    t.resize(2 * n);
    size_t row = 0;
    for (const SeqSlice& sl : slices) {
      const auto boff = static_cast<int32_t>(t.size());
      for (int32_t i = 0; i < sl.n_tokens; ++i, ++row) {
        t[2 * row] = sl.pos0 + i;
        t[2 * row + 1] = boff;
      }
      const auto& ids = sl.kv.table->blocks(plane);
      t.insert(t.end(), ids.begin(), ids.end());
    }
  }
}

Status BatchPass::bind(int32_t layer_begin, int32_t layer_end) {
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  // The weights first: after a reinitialize both are gone, and "prepare the
  // model" is the step to take before a new pool helps.
  SPW_ASSIGN_OR_RETURN(mw, im.weights(model));
  for (int32_t il = layer_begin; il < layer_end; ++il) {
    const DevLayer& L = mw->layers[static_cast<size_t>(il)];
    if (!L.present) return Status::failed_precondition("layer " + std::to_string(il) + " not prepared on " + im.name());
    dev_experts |= L.device_experts();
  }
  kvs = dynamic_cast<VulkanKvStorage*>(pool->device_storage());
  if (kvs == nullptr || kvs->ctx != im.ctx)
    return Status::invalid_argument("forward_layers: KV pool is not in " + im.name() +
                                    " memory (make it with create_kv_pool, after the last reinitialize)");
  kv_f16 = kvs->type == KvType::kF16;
  return Status();
}

Status BatchPass::size_scratch() {
  E = static_cast<uint64_t>(hp.n_embd);
  KV = static_cast<uint64_t>(hp.n_embd_kv());
  // A mixture's FFN: experts ffn_width wide on the device, or none here.
  FF = !hp.moe() ? static_cast<uint64_t>(hp.n_ff) : dev_experts ? static_cast<uint64_t>(hp.ffn_width()) : 0;
  Q = static_cast<uint64_t>(hp.n_embd_q());
  hd = static_cast<uint32_t>(hp.head_dim());
  half = static_cast<uint32_t>(hp.n_rot / 2);
  n_pos = max_pos;  // the longest row's positions: the scores' stride
  const uint64_t qcols = std::max({E, FF, Q});
  // Attention scratch: scores for up to `tc` tokens at a time.
  row_bytes = static_cast<uint64_t>(hp.n_head) * n_pos * sizeof(float);
  tc = std::max<uint64_t>(1, std::min<uint64_t>(n, im.ctx->max_buffer_bytes() / row_bytes));
  if (row_bytes > im.ctx->max_buffer_bytes())
    return Status::invalid_argument("forward_layers: attention scores for " + std::to_string(n_pos) +
                                    " positions exceed the largest buffer");
  SPW_RETURN_IF_ERROR(im.ensure(s.io_hidden, n * E * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_rope, 2 * n * std::max<uint32_t>(half, 1) * 4, true));
  if (local_rope()) SPW_RETURN_IF_ERROR(im.ensure(s.io_rope_local, 2 * n * std::max<uint32_t>(half, 1) * 4, true));
  if (hp.post_norms) SPW_RETURN_IF_ERROR(im.ensure(s.post, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_blocks, table.size() * 4, true));
  if (!window_table.empty()) SPW_RETURN_IF_ERROR(im.ensure(s.io_window_blocks, window_table.size() * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.x, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.cur, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.q, n * Q * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.k, n * KV * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.v, n * KV * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.att, n * Q * 4, false));
  if (FF > 0) {
    SPW_RETURN_IF_ERROR(im.ensure(s.gate, n * FF * 4, false));
    SPW_RETURN_IF_ERROR(im.ensure(s.up, n * FF * 4, false));
  }
  SPW_RETURN_IF_ERROR(im.ensure(s.xq, n * (qcols / 32 + 1) * 32, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.xd, n * (qcols / 32 + 1) * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.scores, tc * row_bytes, false));
  if (dev_experts) {
    // The router's logits (and the shared gate's, in yg), and the routing
    // table: row ids then weights, the routed (row, rank) pairs and the
    // shared expert's n rows (device_experts).
    const uint64_t X = static_cast<uint64_t>(hp.n_expert), K = static_cast<uint64_t>(hp.n_expert_used);
    SPW_RETURN_IF_ERROR(im.ensure(s.router, n * X * 4, false));
    SPW_RETURN_IF_ERROR(im.ensure(s.io_route, std::max(n * (X + 1), 2 * (n * K + n)) * 4, true));
    SPW_RETURN_IF_ERROR(im.ensure(s.xg, n * E * 4, false));
    SPW_RETURN_IF_ERROR(im.ensure(s.yg, n * E * 4, false));
  }
  return Status();
}

void BatchPass::upload_inputs(const float* hidden) {
  std::memcpy(s.io_hidden.mapped(), hidden, n * E * 4);
  std::memcpy(s.io_blocks.mapped(), table.data(), table.size() * 4);
  if (!window_table.empty()) std::memcpy(s.io_window_blocks.mapped(), window_table.data(), window_table.size() * 4);
  if (half > 0) {
    // cos rows of every slice, then their sin rows (rope.comp's layout).
    float* cs = static_cast<float*>(s.io_rope.mapped());
    float* ls = local_rope() ? static_cast<float*>(s.io_rope_local.mapped()) : nullptr;
    uint64_t row = 0;
    for (const SeqSlice& sl : slices) {
      cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base, cs + row * half, cs + (n + row) * half,
                      cpu::rope_scaling(model));
      if (ls != nullptr)
        cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base_swa, ls + row * half,
                        ls + (n + row) * half);
      row += static_cast<uint64_t>(sl.n_tokens);
    }
  }
}

Status BatchPass::record(int32_t layer_begin, int32_t layer_end, float* hidden) {
  const float scale = hp.kq_scale();
  const float eps = hp.rms_eps;
  std::memcpy(&eps_bits, &eps, 4);
  std::memcpy(&scale_bits, &scale, 4);
  nt = static_cast<uint32_t>(n);

  std::optional<Recorder> rec(std::in_place, im);
  rec->copy(s.io_hidden.buffer(), s.x.buffer(), n * E * 4);
  rec->barrier();
  for (int32_t il = layer_begin; il < layer_end; ++il) {
    const DevLayer& L = mw->layers[static_cast<size_t>(il)];
    const size_t lp = static_cast<size_t>(il - kvo.layer_begin);
    record_qkv(*rec, L, il);
    record_attention(*rec, L, lp, il);
    if (L.host_experts) {
      SPW_RETURN_IF_ERROR(host_experts(rec, L, il));
    } else if (L.device_experts()) {
      SPW_RETURN_IF_ERROR(device_experts(rec, L));
    } else {
      record_ffn(*rec, L);
    }
  }
  rec->copy(s.x.buffer(), s.io_hidden.buffer(), n * E * 4);
  SPW_RETURN_IF_ERROR(rec->finish());
  std::memcpy(hidden, s.io_hidden.mapped(), n * E * 4);
  return Status();
}

// The attention norm, the Q/K/V projections, the architecture's optional
// biases (Qwen2) and Q/K norms (Qwen3), and RoPE.
void BatchPass::record_qkv(Recorder& rec, const DevLayer& L, int32_t il) {
  rms(rec, L.attn_norm.buffer());
  {
    MatmulInput in(rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E);
    in.matmul(L.wq, nt, s.q.buffer(), static_cast<uint32_t>(Q));
    in.matmul(L.wk, nt, s.k.buffer(), static_cast<uint32_t>(KV));
    in.matmul(L.wv, nt, s.v.buffer(), static_cast<uint32_t>(KV));
  }
  rec.barrier();
  if (L.bq.buffer() != VK_NULL_HANDLE) {  // Qwen2
    const std::pair<VkBuffer, std::pair<VkBuffer, uint64_t>> biases[] = {
        {s.q.buffer(), {L.bq.buffer(), Q}}, {s.k.buffer(), {L.bk.buffer(), KV}}, {s.v.buffer(), {L.bv.buffer(), KV}}};
    for (const auto& [y, b] : biases) {
      const uint32_t pb[2] = {static_cast<uint32_t>(n * b.second), static_cast<uint32_t>(b.second)};
      rec.dispatch_flat("add_bias", {y, b.first}, pb, sizeof pb, n * b.second);
    }
    rec.barrier();
  }
  if (L.q_norm.buffer() != VK_NULL_HANDLE) {  // Qwen3: each head of Q and K, through att as scratch
    rec.rms_rows(s.q.buffer(), L.q_norm.buffer(), s.att.buffer(), hd, n * hp.n_head, eps_bits);
    rec.barrier();
    rec.copy(s.att.buffer(), s.q.buffer(), n * Q * 4);
    rec.barrier();
    rec.rms_rows(s.k.buffer(), L.k_norm.buffer(), s.att.buffer(), hd, n * hp.n_head_kv, eps_bits);
    rec.barrier();
    rec.copy(s.att.buffer(), s.k.buffer(), n * KV * 4);
    rec.barrier();
  }
  if (half > 0) {
    const bool neox = hp.rope_style == RopeStyle::kNeox;
    const char* rope = rec.exact_attention() ? (neox ? "rope_neox_f64" : "rope_f64") : (neox ? "rope_neox" : "rope");
    const VkBuffer table = hp.local_rope(il) ? s.io_rope_local.buffer() : s.io_rope.buffer();
    const uint32_t pq[5] = {nt, static_cast<uint32_t>(hp.n_head), hd, half, static_cast<uint32_t>(Q)};
    rec.dispatch_flat(rope, {s.q.buffer(), table}, pq, sizeof pq, n * hp.n_head * half);
    const uint32_t pk[5] = {nt, static_cast<uint32_t>(hp.n_head_kv), hd, half, static_cast<uint32_t>(KV)};
    rec.dispatch_flat(rope, {s.k.buffer(), table}, pk, sizeof pk, n * hp.n_head_kv * half);
    rec.barrier();
  }
}

// The KV write, attention over each row's positions, the output projection
// and the residual add.
void BatchPass::record_attention(Recorder& rec, const DevLayer& L, size_t lp, int32_t il) {
  const float softcap = hp.attn_softcap;
  uint32_t softcap_bits;
  std::memcpy(&softcap_bits, &softcap, 4);
  const uint32_t pw[3] = {nt, static_cast<uint32_t>(KV), static_cast<uint32_t>(bt)};
  // A sliding layer's blocks are the window plane's (kv_cache.h).
  const VkBuffer blocks = pool->plane(static_cast<int32_t>(lp)) == 1 ? s.io_window_blocks.buffer()
                                                                     : s.io_blocks.buffer();
  // F16: one invocation per pair of halves (one uint of the cache).
  rec.dispatch_flat(kv_f16 ? "kv_write_f16" : "kv_write",
                    {s.k.buffer(), s.v.buffer(), kvs->k[lp].buffer(), kvs->v[lp].buffer(), blocks}, pw,
                    sizeof pw, kv_f16 ? n * KV / 2 : n * KV);
  rec.barrier();
  for (uint64_t t0 = 0; t0 < n; t0 += tc) {
    const uint32_t cnt = static_cast<uint32_t>(std::min(tc, n - t0));
    const uint32_t pa[12] = {hd,
                             static_cast<uint32_t>(hp.n_head),
                             static_cast<uint32_t>(hp.n_gqa()),
                             static_cast<uint32_t>(KV),
                             static_cast<uint32_t>(bt),
                             static_cast<uint32_t>(t0),
                             static_cast<uint32_t>(n_pos),
                             static_cast<uint32_t>(Q),
                             scale_bits,
                             cpu::active_kernel_traits().dot_tail8 ? 1u : 0u,
                             hp.is_swa(il) ? static_cast<uint32_t>(hp.n_swa) : 0u,
                             softcap_bits};
    // The exact variant keeps four output elements per invocation.
    const char* attention = rec.exact_attention() && hd <= 4 * kWg ? (kv_f16 ? "attention_f16_f64" : "attention_f64")
                                                                   : (kv_f16 ? "attention_f16" : "attention");
    rec.dispatch(attention,
                 {s.q.buffer(), kvs->k[lp].buffer(), kvs->v[lp].buffer(), blocks, s.scores.buffer(), s.att.buffer()},
                 pa, sizeof pa, static_cast<uint32_t>(hp.n_head), cnt, 1);
    rec.barrier();
  }
  MatmulInput(rec, s.att.buffer(), s.xq.buffer(), s.xd.buffer(), n * Q).matmul(L.wo, nt, s.cur.buffer(),
                                                                                 static_cast<uint32_t>(E));
  rec.barrier();
  add_normed(rec, s.cur.buffer(), L.post_attn_norm);
}

// The FFN norm, gate and up, SwiGLU, down and the residual add.
void BatchPass::record_ffn(Recorder& rec, const DevLayer& L) {
  rms(rec, L.ffn_norm.buffer());
  swiglu_ffn(rec, s.cur.buffer(), nt, L.gate, L.up, L.down, s.cur.buffer());
  add_normed(rec, s.cur.buffer(), L.post_ffn_norm);
}

// down(silu(gate in) * up in) for `rows` rows of `in` into y (which may be
// in: it is read before down writes), through the gate and up buffers; a
// dense layer's FFN and each expert's.
void BatchPass::swiglu_ffn(Recorder& rec, VkBuffer in, uint32_t rows, const DevMatrix& gate, const DevMatrix& up,
                           const DevMatrix& down, VkBuffer y) {
  const auto F = static_cast<uint32_t>(gate.n_rows);
  {
    MatmulInput mi(rec, in, s.xq.buffer(), s.xd.buffer(), uint64_t{rows} * E);
    mi.matmul(gate, rows, s.gate.buffer(), F);
    mi.matmul(up, rows, s.up.buffer(), F);
  }
  rec.barrier();
  const uint32_t ps[1] = {rows * F};
  rec.dispatch_flat(hp.ffn_gelu ? rec.geglu_shader() : rec.swiglu_shader(), {s.gate.buffer(), s.up.buffer()}, ps,
                    sizeof ps, uint64_t{rows} * F);
  rec.barrier();
  MatmulInput(rec, s.gate.buffer(), s.xq.buffer(), s.xd.buffer(), uint64_t{rows} * F)
      .matmul(down, rows, y, static_cast<uint32_t>(E));
  rec.barrier();
}

// A mixture of experts' FFN on the host (vulkan_backend.h): the FFN norm's
// rows go back through io_hidden, the submission so far runs, cpu::moe_ffn
// computes the layer's FFN output, which comes back the same way for the
// residual add in a new submission. The host buffers are the pass's, as the
// CPU backend's are (the estimator prices them as host scratch).
Status BatchPass::host_experts(std::optional<Recorder>& rec, const DevLayer& L, int32_t il) {
  rms(*rec, L.ffn_norm.buffer());
  rec->copy(s.cur.buffer(), s.io_hidden.buffer(), n * E * 4);
  SPW_RETURN_IF_ERROR(rec->finish());
  const auto rows = static_cast<int64_t>(n);
  if (!host_x) {
    const auto fw = static_cast<size_t>(rows * hp.ffn_width());
    host_x.reset(new float[n * E]);
    host_gate.reset(new float[fw]);
    host_up.reset(new float[fw]);
    host_scratch.reset(new std::byte[static_cast<size_t>(moe_scratch_words(hp, rows)) * 4]);
  }
  float* x = host_x.get();
  // Host-visible memory may be uncached: read it once, not per expert.
  std::memcpy(x, s.io_hidden.mapped(), n * E * 4);
  cpu::moe_ffn(model, model.layer(il).moe, x, rows, host_gate.get(), host_up.get(), host_scratch.get(), x,
               im.host_pool.get());
  std::memcpy(s.io_hidden.mapped(), x, n * E * 4);
  rec.emplace(im);
  rec->copy(s.io_hidden.buffer(), s.cur.buffer(), n * E * 4);
  rec->barrier();
  add(*rec, s.cur.buffer(), n * E);
  return Status();
}

// A mixture of experts on the device (vulkan_backend.h): the router's
// logits (and the shared expert's gate logit) come back; the host routes as
// the CPU does (cpu::moe_route) and writes the table the gathers and
// weighted adds read: row ids grouped by expert (cpu::moe_group), then the
// shared expert's rows 0..n-1, then every entry's weight. Each chosen expert
// then runs once over its rows, in id order, adding into the residual.
Status BatchPass::device_experts(std::optional<Recorder>& rec, const DevLayer& L) {
  const auto rows = static_cast<int64_t>(n);
  const int64_t X = hp.n_expert, K = hp.n_expert_used;
  const bool shared = L.s_gate.n_rows > 0;
  rms(*rec, L.ffn_norm.buffer());
  {
    MatmulInput in(*rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E);
    in.matmul(L.moe_router, nt, s.router.buffer(), static_cast<uint32_t>(X));
    if (shared) in.matmul(L.s_router, nt, s.yg.buffer(), 1);
  }
  rec->barrier();
  rec->copy(s.router.buffer(), s.io_route.buffer(), n * static_cast<uint64_t>(X) * 4);
  if (shared) rec->copy(s.yg.buffer(), s.io_route.buffer(), n * 4, 0, n * static_cast<uint64_t>(X) * 4);
  SPW_RETURN_IF_ERROR(rec->finish());

  auto& [probs, weight, gate_logit, id, order, first, cursor] = route;
  probs.resize(static_cast<size_t>(rows * X));
  weight.resize(static_cast<size_t>(rows * K));
  gate_logit.resize(shared ? static_cast<size_t>(rows) : 0);
  id.resize(static_cast<size_t>(rows * K));
  order.resize(static_cast<size_t>(rows * K));
  first.resize(static_cast<size_t>(X + 1));
  cursor.resize(static_cast<size_t>(X));
  const auto* mapped = static_cast<const float*>(s.io_route.mapped());
  std::memcpy(probs.data(), mapped, probs.size() * 4);
  if (shared) std::memcpy(gate_logit.data(), mapped + rows * X, gate_logit.size() * 4);
  cpu::moe_route(hp, probs.data(), rows, id.data(), weight.data());
  cpu::moe_group(hp, id.data(), rows, first.data(), order.data(), cursor.data());
  const int64_t entries = rows * K + rows, wo = entries;  // the weights follow the row ids
  auto* table = static_cast<int32_t*>(s.io_route.mapped());
  for (int64_t j = 0; j < rows * K; ++j) {
    table[j] = order[static_cast<size_t>(j)] / static_cast<int32_t>(K);
    std::memcpy(&table[wo + j], &weight[static_cast<size_t>(order[static_cast<size_t>(j)])], 4);
  }
  for (int64_t t = 0; t < rows; ++t) {
    table[rows * K + t] = static_cast<int32_t>(t);
    const float g = shared ? 1.0f / (1.0f + std::exp(-gate_logit[static_cast<size_t>(t)])) : 0.0f;
    std::memcpy(&table[wo + rows * K + t], &g, 4);
  }

  rec.emplace(im);
  for (int64_t e = 0; e < X; ++e) {
    const auto cnt = static_cast<uint32_t>(first[static_cast<size_t>(e) + 1] - first[static_cast<size_t>(e)]);
    if (cnt == 0) continue;
    const auto at = static_cast<uint32_t>(first[static_cast<size_t>(e)]);
    const uint32_t pg[3] = {cnt * static_cast<uint32_t>(E), static_cast<uint32_t>(E), at};
    rec->dispatch_flat("gather_rows", {s.cur.buffer(), s.xg.buffer(), s.io_route.buffer()}, pg, sizeof pg,
                       uint64_t{cnt} * E);
    rec->barrier();
    const auto i = static_cast<size_t>(e);
    expert_ffn(*rec, s.xg.buffer(), cnt, L.e_gate[i], L.e_up[i], L.e_down[i], at, static_cast<uint32_t>(wo));
  }
  if (shared)
    expert_ffn(*rec, s.cur.buffer(), nt, L.s_gate, L.s_up, L.s_down, static_cast<uint32_t>(rows * K),
               static_cast<uint32_t>(wo));
  return Status();
}

// One expert over `rows` rows of `in`: gate and up, SwiGLU, down into yg,
// then yg's rows added, weighted, to the residual rows the table names from
// entry `first` (weights from entry `weights` + first).
void BatchPass::expert_ffn(Recorder& rec, VkBuffer in, uint32_t rows, const DevMatrix& gate, const DevMatrix& up,
                           const DevMatrix& down, uint32_t first, uint32_t weights) {
  swiglu_ffn(rec, in, rows, gate, up, down, s.yg.buffer());
  const uint32_t pa[4] = {rows * static_cast<uint32_t>(E), static_cast<uint32_t>(E), first, weights};
  rec.dispatch_flat("scatter_add_rows", {s.x.buffer(), s.yg.buffer(), s.io_route.buffer()}, pa, sizeof pa,
                    uint64_t{rows} * E);
  rec.barrier();
}

void BatchPass::rms(Recorder& rec, VkBuffer w) {
  rec.rms_rows(s.x.buffer(), w, s.cur.buffer(), E, n, eps_bits);
  rec.barrier();
}

void BatchPass::add_normed(Recorder& rec, VkBuffer from, const DeviceBuffer& w) {
  if (w.buffer() == VK_NULL_HANDLE) {
    add(rec, from, n * E);
    return;
  }
  rec.rms_rows(from, w.buffer(), s.post.buffer(), E, n, eps_bits);
  rec.barrier();
  add(rec, s.post.buffer(), n * E);
}

void BatchPass::add(Recorder& rec, VkBuffer from, uint64_t count) {
  const uint32_t pc[1] = {static_cast<uint32_t>(count)};
  rec.dispatch_flat("add", {s.x.buffer(), from}, pc, sizeof pc, count);
  rec.barrier();
}

}  // namespace

Status VulkanBackend::forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end, const KvSequence& kv,
                                     int32_t pos0, int32_t n_tokens, float* hidden) {
  const SeqSlice one{kv, pos0, n_tokens};
  return forward_batch(model, layer_begin, layer_end, std::span<const SeqSlice>(&one, 1), hidden);
}

Status VulkanBackend::forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end,
                                    std::span<const SeqSlice> slices, float* hidden) {
  const LlamaHparams& hp = model.hparams();
  SPW_RETURN_IF_ERROR(check_slices(hp, layer_begin, layer_end, slices));
  // One pass binds one K/V buffer pair per layer: sequences of different
  // pools (not the server's layout: a session group shares one pool per
  // stage) run one pool after another.
  for (const SeqSlice& sl : slices) {
    if (sl.kv.pool != slices[0].kv.pool) {
      int64_t row = 0;
      for (const SeqSlice& one : slices) {
        SPW_RETURN_IF_ERROR(forward_batch(model, layer_begin, layer_end, std::span<const SeqSlice>(&one, 1),
                                          hidden + row * hp.n_embd));
        row += one.n_tokens;
      }
      return Status();
    }
  }
  std::lock_guard<TimedMutex> lk(impl_->mu);
  BatchPass pass(*impl_, model, slices);
  pass.build_rows();
  SPW_RETURN_IF_ERROR(pass.bind(layer_begin, layer_end));
  if (layer_begin == layer_end) return Status();
  SPW_RETURN_IF_ERROR(pass.size_scratch());
  pass.upload_inputs(hidden);
  return pass.record(layer_begin, layer_end, hidden);
}

Status VulkanBackend::output(const Model& model, const float* hidden, int32_t n_rows, float* logits) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  const auto& hp = model.hparams();
  if (n_rows <= 0) return n_rows == 0 ? Status() : Status::invalid_argument("output: n_rows < 0");
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  SPW_ASSIGN_OR_RETURN(ModelWeights * mw, im.weights(model));
  if (!mw->output) return Status::failed_precondition("output head not prepared on " + im.name());
  const DevMatrix& m = *mw->output;
  const uint64_t n = static_cast<uint64_t>(n_rows), E = static_cast<uint64_t>(hp.n_embd),
                 V = static_cast<uint64_t>(hp.n_vocab);
  Scratch& s = im.scratch;
  SPW_RETURN_IF_ERROR(im.ensure(s.io_hidden, n * E * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.io_logits, n * V * 4, true));
  SPW_RETURN_IF_ERROR(im.ensure(s.x, n * E * 4, false));
  SPW_RETURN_IF_ERROR(im.ensure(s.cur, n * E * 4, false));
  if (cpu::act_format(m.type) != cpu::ActFormat::kFloat) {
    SPW_RETURN_IF_ERROR(im.ensure(s.xq, n * (E / 32 + 1) * 32, false));
    SPW_RETURN_IF_ERROR(im.ensure(s.xd, n * (E / 32 + 1) * 4, false));
  }
  std::memcpy(s.io_hidden.mapped(), hidden, n * E * 4);
  const float eps = hp.rms_eps;
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, 4);
  Impl::Recorder rec(im);
  rec.copy(s.io_hidden.buffer(), s.x.buffer(), n * E * 4);
  rec.barrier();
  rec.rms_rows(s.x.buffer(), mw->output_norm.buffer(), s.cur.buffer(), E, n, eps_bits);
  rec.barrier();
  MatmulInput(rec, s.cur.buffer(), s.xq.buffer(), s.xd.buffer(), n * E)
      .matmul(m, static_cast<uint32_t>(n), s.io_logits.buffer(), static_cast<uint32_t>(V));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(logits, s.io_logits.mapped(), n * V * 4);
  // Gemma 2's final soft-capping, on the host as the CPU backend's (the
  // logits are read here anyway, and the CPU's steps give the CPU's bits).
  if (hp.final_softcap > 0.0f) cpu::softcap(logits, static_cast<int64_t>(n * V), hp.final_softcap);
  return Status();
}

}  // namespace spw
