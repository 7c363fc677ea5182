#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/packed_weights.h"

namespace spw {

CpuBackend::CpuBackend(int n_threads) : pool_(std::make_unique<ThreadPool>(n_threads)) {}
CpuBackend::~CpuBackend() = default;

Status CpuBackend::prepare(const Model& model, int32_t layer_begin, int32_t layer_end, bool, bool output) {
  if (layer_begin < 0 || layer_end > model.hparams().n_layer || layer_begin > layer_end) {
    return Status::invalid_argument("cpu backend: bad layer range [" + std::to_string(layer_begin) + ", " +
                                    std::to_string(layer_end) + ")");
  }
  // Weights are read in place, or from the kernels' layout: packed here when
  // the mapping is resident, else on first use (packed_weights.h).
  cpu::pack_resident(model, layer_begin, layer_end, output);
  return Status();
}

Status CpuBackend::embed(const Model& model, std::span<const TokenId> tokens, float* hidden) {
  return cpu::embed_tokens(model, tokens, hidden);
}

Status cpu::embed_tokens(const Model& model, std::span<const TokenId> tokens, float* hidden) {
  const auto& hp = model.hparams();
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp.n_vocab) {
      return Status::invalid_argument("token id " + std::to_string(tokens[t]) + " out of range [0, " +
                                      std::to_string(hp.n_vocab) + ")");
    }
    float* row = hidden + t * static_cast<size_t>(hp.n_embd);
    cpu::dequantize_row(model.tok_embd(), tokens[t], row);
    if (hp.embd_scale != 1.0f)  // Gemma: sqrt(n_embd)
      for (int32_t i = 0; i < hp.n_embd; ++i) row[i] *= hp.embd_scale;
  }
  return Status();
}

Status CpuBackend::forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end,
                                  const KvSequence& kv, int32_t pos0, int32_t n_tokens, float* hidden) {
  const SeqSlice one{kv, pos0, n_tokens};
  return forward_batch(model, layer_begin, layer_end, std::span<const SeqSlice>(&one, 1), hidden);
}

Status CpuBackend::forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end,
                                 std::span<const SeqSlice> slices, float* hidden) {
  if (faults_ == nullptr || !faults_->armed()) return run_batch(model, layer_begin, layer_end, slices, hidden);
  // An armed slow fault: the pass runs for real, then the thread sleeps
  // (factor - 1) x its time. Real time on purpose, as the Vulkan fault's:
  // it stands in for cores taken by another workload, on the wall clock
  // whatever Env the server was given.
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t disarms = faults_->disarms();
  Status st = run_batch(model, layer_begin, layer_end, slices, hidden);
  const double factor = faults_->take_slow_factor();
  if (factor > 1.0) {
    // In slices, so that disarming ends a long stretch at once (a sanitizer
    // build's prefill pass times a large factor is minutes).
    const auto t1 = std::chrono::steady_clock::now();
    const auto until = t1 + std::chrono::duration_cast<std::chrono::steady_clock::duration>((t1 - t0) * (factor - 1.0));
    while (faults_->disarms() == disarms) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::milliseconds(10)));
    }
  }
  return st;
}

Status CpuBackend::run_batch(const Model& model, int32_t layer_begin, int32_t layer_end,
                             std::span<const SeqSlice> slices, float* hidden) {
  const LlamaHparams& hp = model.hparams();
  SPW_RETURN_IF_ERROR(check_slices(hp, layer_begin, layer_end, slices));
  // Every row's sequence, position and KV: rows are the slices' rows in order.
  struct Row {
    const SeqSlice* seq;
    int32_t pos;
  };
  std::vector<Row> rows;
  for (const SeqSlice& sl : slices)
    for (int32_t t = 0; t < sl.n_tokens; ++t) rows.push_back({&sl, sl.pos0 + t});

  const int64_t n_embd = hp.n_embd;
  const int64_t n_q = hp.n_embd_q();
  const int64_t n_kv = hp.n_embd_kv();
  const int64_t n_ff = hp.ffn_width();
  const int32_t hd = hp.head_dim();
  const int32_t n_head = hp.n_head;
  const auto n = static_cast<int64_t>(rows.size());

  // Activations, left uninitialised: every element is written before it is
  // read (norms, matmuls, RoPE tables, attention), and a prompt's ubatch of
  // 512 rows would otherwise zero-fill ~16 MB per call (1-2% of a prefill).
  // Same allocations, byte for byte, as the estimator's layer_activations.
  auto floats = [](int64_t count) { return std::unique_ptr<float[]>(new float[static_cast<size_t>(count)]); };
  const auto cur = floats(n * n_embd);
  const auto q = floats(n * n_q);
  const auto k = floats(n * n_kv);
  const auto v = floats(n * n_kv);
  const auto att = floats(n * n_q);
  const auto gate = floats(n * n_ff);
  const auto up = floats(n * n_ff);
  // A mixture of experts' routing tables and expert outputs (moe.h): raw
  // storage, floats and ids side by side.
  const std::unique_ptr<std::byte[]> moe(hp.moe() ? new std::byte[static_cast<size_t>(moe_scratch_words(hp, n)) * 4]
                                                  : nullptr);
  const int32_t half = hp.n_rot / 2;
  // RoPE's cos/sin rows, and the sliding layers' own where they differ (Gemma 3).
  const bool local_rope = hp.has_local_rope();
  const auto rc = floats(n * half), rs = floats(n * half);
  const std::unique_ptr<float[]> lc = local_rope ? floats(n * half) : nullptr;
  const std::unique_ptr<float[]> ls = local_rope ? floats(n * half) : nullptr;
  {
    int64_t row = 0;
    for (const SeqSlice& sl : slices) {
      cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base, rc.get() + row * half, rs.get() + row * half,
                      cpu::rope_scaling(model));
      if (local_rope)
        cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base_swa, lc.get() + row * half,
                        ls.get() + row * half);
      row += sl.n_tokens;
    }
  }
  const cpu::AttentionShape attn_shape{n_head, hp.n_head_kv, hd, hp.kq_scale(), 0, hp.attn_softcap};

  // Gemma's norm of a sublayer's output rows (in place) before the residual add.
  auto post_norm = [&](const std::vector<float>& w, float* x) {
    if (w.empty()) return;
    for (int64_t t = 0; t < n; ++t) cpu::rms_norm(x + t * n_embd, w.data(), n_embd, hp.rms_eps, x + t * n_embd);
  };
  for (int32_t il = layer_begin; il < layer_end; ++il) {
    const LlamaLayerWeights& L = model.layer(il);
    // Each matrix in the layout the kernel variant computes from (packed on
    // its first use: packed_weights.h).
    auto W = [&](const WeightMatrix& w) -> const WeightMatrix* { return &cpu::cpu_weights(model, w); };
    for (int64_t t = 0; t < n; ++t)
      cpu::rms_norm(hidden + t * n_embd, L.attn_norm.data(), n_embd, hp.rms_eps, cur.get() + t * n_embd);
    // One pass over the weights for every row of every sequence.
    const cpu::MatmulOut qkv[3] = {{W(L.wq), q.get()}, {W(L.wk), k.get()}, {W(L.wv), v.get()}};
    cpu::matmul_fused(qkv, 3, cur.get(), n, pool_.get());
    if (!L.bq.empty()) {  // Qwen2
      cpu::add_bias(q.get(), L.bq.data(), n, n_q);
      cpu::add_bias(k.get(), L.bk.data(), n, n_kv);
      cpu::add_bias(v.get(), L.bv.data(), n, n_kv);
    }
    if (!L.q_norm.empty()) {  // Qwen3: each head's Q and K normalised before RoPE
      for (int64_t h = 0; h < n * n_head; ++h)
        cpu::rms_norm(q.get() + h * hd, L.q_norm.data(), hd, hp.rms_eps, q.get() + h * hd);
      for (int64_t h = 0; h < n * hp.n_head_kv; ++h)
        cpu::rms_norm(k.get() + h * hd, L.k_norm.data(), hd, hp.rms_eps, k.get() + h * hd);
    }
    const bool neox = hp.rope_style == RopeStyle::kNeox;
    const float* cos_rows = hp.local_rope(il) ? lc.get() : rc.get();
    const float* sin_rows = hp.local_rope(il) ? ls.get() : rs.get();
    for (int64_t t = 0; t < n; ++t) {
      const Row& r = rows[static_cast<size_t>(t)];
      KvPool* kvp = r.seq->kv.pool;
      const int32_t lp = il - kvp->options().layer_begin;
      const int32_t bt = kvp->block_tokens();
      cpu::rope_apply(q.get() + t * n_q, n_head, hd, hp.n_rot, cos_rows + t * half, sin_rows + t * half, neox);
      cpu::rope_apply(k.get() + t * n_kv, hp.n_head_kv, hd, hp.n_rot, cos_rows + t * half, sin_rows + t * half,
                      neox);
      const int32_t blk = r.seq->kv.table->blocks(kvp->plane(lp))[static_cast<size_t>(r.pos / bt)];
      const int32_t slot = r.pos % bt;
      // Converted to the pool's type (an F32 pool: a plain copy).
      kvp->store_rows(blk, lp, slot, k.get() + t * n_kv, v.get() + t * n_kv);
    }
    // Attention over each row's own sequence (attention.h: tiled, bitwise
    // independent of the batch and the thread count).
    cpu::AttentionShape shape = attn_shape;
    shape.window = hp.is_swa(il) ? hp.n_swa : 0;
    cpu::attention(slices, il, shape, q.get(), att.get(), pool_.get());
    cpu::matmul(*W(L.wo), att.get(), n, cur.get(), pool_.get());
    post_norm(L.post_attn_norm, cur.get());
    cpu::add(hidden, cur.get(), n * n_embd);

    for (int64_t t = 0; t < n; ++t)
      cpu::rms_norm(hidden + t * n_embd, L.ffn_norm.data(), n_embd, hp.rms_eps, cur.get() + t * n_embd);
    if (L.is_moe()) {
      cpu::moe_ffn(model, L.moe, cur.get(), n, gate.get(), up.get(), moe.get(), cur.get(), pool_.get());
      cpu::add(hidden, cur.get(), n * n_embd);
      continue;
    }
    const cpu::MatmulOut gate_up[2] = {{W(L.w_gate), gate.get()}, {W(L.w_up), up.get()}};
    cpu::matmul_fused(gate_up, 2, cur.get(), n, pool_.get());
    if (hp.ffn_gelu) {
      cpu::geglu(gate.get(), up.get(), gate.get(), n * n_ff);
    } else {
      cpu::swiglu(gate.get(), up.get(), gate.get(), n * n_ff);
    }
    cpu::matmul(*W(L.w_down), gate.get(), n, cur.get(), pool_.get());
    post_norm(L.post_ffn_norm, cur.get());
    cpu::add(hidden, cur.get(), n * n_embd);
  }
  return Status();
}

Status CpuBackend::output(const Model& model, const float* hidden, int32_t n_rows, float* logits) {
  const auto& hp = model.hparams();
  std::vector<float> cur(static_cast<size_t>(n_rows) * static_cast<size_t>(hp.n_embd));
  for (int32_t t = 0; t < n_rows; ++t)
    cpu::rms_norm(hidden + static_cast<int64_t>(t) * hp.n_embd, model.output_norm().data(), hp.n_embd,
                  hp.rms_eps, cur.data() + static_cast<int64_t>(t) * hp.n_embd);
  cpu::matmul(cpu::cpu_weights(model, model.output()), cur.data(), n_rows, logits, pool_.get());
  if (hp.final_softcap > 0.0f) cpu::softcap(logits, static_cast<int64_t>(n_rows) * hp.n_vocab, hp.final_softcap);
  return Status();
}

}  // namespace spw
