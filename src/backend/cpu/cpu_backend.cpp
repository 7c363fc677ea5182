#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"

namespace spw {

CpuBackend::CpuBackend(int n_threads) : pool_(std::make_unique<ThreadPool>(n_threads)) {}
CpuBackend::~CpuBackend() = default;

Status CpuBackend::prepare(const Model& model, int32_t layer_begin, int32_t layer_end, bool, bool) {
  if (layer_begin < 0 || layer_end > model.hparams().n_layer || layer_begin > layer_end) {
    return Status::invalid_argument("cpu backend: bad layer range [" + std::to_string(layer_begin) + ", " +
                                    std::to_string(layer_end) + ")");
  }
  return Status();  // weights are read in place from the mapping
}

Status CpuBackend::embed(const Model& model, std::span<const TokenId> tokens, float* hidden) {
  const auto& hp = model.hparams();
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp.n_vocab) {
      return Status::invalid_argument("token id " + std::to_string(tokens[t]) + " out of range [0, " +
                                      std::to_string(hp.n_vocab) + ")");
    }
    cpu::dequantize_row(model.tok_embd(), tokens[t], hidden + t * static_cast<size_t>(hp.n_embd));
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
  const LlamaHparams& hp = model.hparams();
  SPW_RETURN_IF_ERROR(check_slices(hp, layer_begin, layer_end, slices));
  // Every row's sequence, position and KV: rows are the slices' rows in order.
  struct Row {
    const SeqSlice* seq;
    int32_t pos;
  };
  std::vector<Row> rows;
  int32_t max_pos = 0;
  for (const SeqSlice& sl : slices) {
    for (int32_t t = 0; t < sl.n_tokens; ++t) rows.push_back({&sl, sl.pos0 + t});
    max_pos = std::max(max_pos, sl.pos0 + sl.n_tokens);
  }

  const int64_t n_embd = hp.n_embd;
  const int64_t n_q = hp.n_embd_q();
  const int64_t n_kv = hp.n_embd_kv();
  const int64_t n_ff = hp.n_ff;
  const int32_t hd = hp.head_dim();
  const int32_t n_head = hp.n_head;
  const int32_t n_gqa = hp.n_gqa();
  const auto n = static_cast<int64_t>(rows.size());

  std::vector<float> cur(static_cast<size_t>(n * n_embd));
  std::vector<float> q(static_cast<size_t>(n * n_q));
  std::vector<float> k(static_cast<size_t>(n * n_kv));
  std::vector<float> v(static_cast<size_t>(n * n_kv));
  std::vector<float> att(static_cast<size_t>(n * n_q));
  std::vector<float> gate(static_cast<size_t>(n * n_ff));
  std::vector<float> up(static_cast<size_t>(n * n_ff));
  const int32_t half = hp.n_rot / 2;
  std::vector<float> rc(static_cast<size_t>(n * half)), rs(static_cast<size_t>(n * half));
  {
    int64_t row = 0;
    for (const SeqSlice& sl : slices) {
      cpu::rope_table(sl.pos0, sl.n_tokens, hp.n_rot, hp.rope_freq_base, rc.data() + row * half, rs.data() + row * half,
                      cpu::rope_scaling(model));
      row += sl.n_tokens;
    }
  }
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int32_t il = layer_begin; il < layer_end; ++il) {
    const LlamaLayerWeights& L = model.layer(il);
    for (int64_t t = 0; t < n; ++t)
      cpu::rms_norm(hidden + t * n_embd, L.attn_norm.data(), n_embd, hp.rms_eps, cur.data() + t * n_embd);
    // One pass over the weights for every row of every sequence.
    const cpu::MatmulOut qkv[3] = {{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}};
    cpu::matmul_fused(qkv, 3, cur.data(), n, pool_.get());
    if (!L.bq.empty()) {  // Qwen2
      cpu::add_bias(q.data(), L.bq.data(), n, n_q);
      cpu::add_bias(k.data(), L.bk.data(), n, n_kv);
      cpu::add_bias(v.data(), L.bv.data(), n, n_kv);
    }
    if (!L.q_norm.empty()) {  // Qwen3: each head's Q and K normalised before RoPE
      for (int64_t h = 0; h < n * n_head; ++h)
        cpu::rms_norm(q.data() + h * hd, L.q_norm.data(), hd, hp.rms_eps, q.data() + h * hd);
      for (int64_t h = 0; h < n * hp.n_head_kv; ++h)
        cpu::rms_norm(k.data() + h * hd, L.k_norm.data(), hd, hp.rms_eps, k.data() + h * hd);
    }
    const bool neox = hp.rope_style == RopeStyle::kNeox;
    for (int64_t t = 0; t < n; ++t) {
      const Row& r = rows[static_cast<size_t>(t)];
      KvPool* kvp = r.seq->kv.pool;
      const int32_t lp = il - kvp->options().layer_begin;
      const int32_t bt = kvp->block_tokens();
      cpu::rope_apply(q.data() + t * n_q, n_head, hd, hp.n_rot, rc.data() + t * half, rs.data() + t * half, neox);
      cpu::rope_apply(k.data() + t * n_kv, hp.n_head_kv, hd, hp.n_rot, rc.data() + t * half,
                      rs.data() + t * half, neox);
      const int32_t blk = r.seq->kv.table->blocks()[static_cast<size_t>(r.pos / bt)];
      const int32_t slot = r.pos % bt;
      std::copy_n(k.data() + t * n_kv, n_kv, kvp->k(blk, lp) + static_cast<int64_t>(slot) * n_kv);
      std::copy_n(v.data() + t * n_kv, n_kv, kvp->v(blk, lp) + static_cast<int64_t>(slot) * n_kv);
    }
    // Attention: one work item per (row, head); each reads its sequence's
    // K/V through its block table in position order, so the sums depend
    // neither on the batch nor on the other sequences in it.
    // Work items are (row, chunk of heads): a decode step of one sequence
    // splits its heads over the threads, a prompt gives each row all heads.
    // An item reads each K/V row of its sequence once for all its heads (a
    // KV block at a time), instead of once per head: at long contexts those
    // per-head passes over the cache were most of the cost. Each (row, head)
    // still computes exactly what the per-head loop did -- its scores in
    // position order (four at a time from position 0), softmax, its weighted
    // V sum in position order -- so results depend on neither the batch, the
    // chunking, the thread count nor the other sequences.
    const int64_t n_threads = pool_ ? pool_->n_threads() : 1;
    const int64_t chunks = std::clamp<int64_t>((n_threads + n - 1) / n, 1, n_head);
    const int64_t heads_per = (n_head + chunks - 1) / chunks;
    auto attend = [&](int64_t i0, int64_t i1) {
      std::vector<float> scores(static_cast<size_t>(heads_per * max_pos));
      std::vector<const float*> kr(static_cast<size_t>(max_pos)), vr(static_cast<size_t>(max_pos));
      const float* part[16];  // one head's rows of a block of four (scores) or of one KV block (V)
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / chunks;
        const int32_t h0 = static_cast<int32_t>((i % chunks) * heads_per);
        const int32_t h1 = static_cast<int32_t>(std::min<int64_t>(n_head, h0 + heads_per));
        if (h0 >= h1) continue;
        const Row& r = rows[static_cast<size_t>(t)];
        KvPool* kvp = r.seq->kv.pool;
        const int32_t lp = il - kvp->options().layer_begin;
        const int32_t bt = kvp->block_tokens();
        const auto& blocks = r.seq->kv.table->blocks();
        const int32_t np = r.pos + 1;
        // Each position's K and V rows (all heads), a KV block at a time.
        for (int32_t p0 = 0; p0 < np; p0 += bt) {
          const int32_t blk = blocks[static_cast<size_t>(p0 / bt)];
          const float* kb = kvp->k(blk, lp);
          const float* vb = kvp->v(blk, lp);
          const int32_t pe = std::min(np, p0 + bt);
          for (int32_t p = p0; p < pe; ++p) {
            kr[static_cast<size_t>(p)] = kb + static_cast<int64_t>(p - p0) * n_kv;
            vr[static_cast<size_t>(p)] = vb + static_cast<int64_t>(p - p0) * n_kv;
          }
        }
        auto head_q = [&](int32_t h) { return q.data() + t * n_q + static_cast<int64_t>(h) * hd; };
        auto head_off = [&](int32_t h) { return static_cast<int64_t>(h / n_gqa) * hd; };
        auto head_scores = [&](int32_t h) { return scores.data() + static_cast<int64_t>(h - h0) * max_pos; };
        // Scores four positions at a time (bitwise dot_f32(k, q) each), every
        // head of the chunk while the four K rows are in cache.
        int32_t p = 0;
        for (; p + 4 <= np; p += 4) {
          for (int32_t h = h0; h < h1; ++h) {
            for (int32_t j = 0; j < 4; ++j) part[j] = kr[static_cast<size_t>(p + j)] + head_off(h);
            float* sh = head_scores(h) + p;
            cpu::dot_f32_x4(head_q(h), part, hd, sh);
            for (int32_t j = 0; j < 4; ++j) sh[j] *= kq_scale;
          }
        }
        for (; p < np; ++p)
          for (int32_t h = h0; h < h1; ++h)
            head_scores(h)[p] = cpu::dot_f32(kr[static_cast<size_t>(p)] + head_off(h), head_q(h), hd) * kq_scale;
        for (int32_t h = h0; h < h1; ++h) cpu::softmax(head_scores(h), np);
        // Weighted V sums, every head of the chunk per KV block (bt <= 16
        // rows; larger blocks go in pieces of 16, still in position order).
        for (int32_t p0 = 0; p0 < np; p0 += 16) {
          const int32_t pe = std::min(np, p0 + 16);
          for (int32_t h = h0; h < h1; ++h) {
            for (int32_t pp = p0; pp < pe; ++pp) part[pp - p0] = vr[static_cast<size_t>(pp)] + head_off(h);
            cpu::weighted_rows(part, head_scores(h) + p0, pe - p0, hd, att.data() + t * n_q + static_cast<int64_t>(h) * hd,
                               /*accumulate=*/p0 > 0);
          }
        }
      }
    };
    // Work ~ rows * heads * positions * head_dim; small jobs stay on this
    // thread. The pool's workers are spinning between the regions of one
    // step, so a region costs a microsecond or two: a decode step splits its
    // heads from a context of ~40 positions on (12 heads of 64).
    const int64_t attn_work = n * n_head * max_pos * hd;
    if (attn_work >= (1 << 15)) {
      pool_->parallel_for(n * chunks, attend);
    } else {
      attend(0, n * chunks);
    }
    cpu::matmul(L.wo, att.data(), n, cur.data(), pool_.get());
    cpu::add(hidden, cur.data(), n * n_embd);

    for (int64_t t = 0; t < n; ++t)
      cpu::rms_norm(hidden + t * n_embd, L.ffn_norm.data(), n_embd, hp.rms_eps, cur.data() + t * n_embd);
    const cpu::MatmulOut gate_up[2] = {{&L.w_gate, gate.data()}, {&L.w_up, up.data()}};
    cpu::matmul_fused(gate_up, 2, cur.data(), n, pool_.get());
    cpu::swiglu(gate.data(), up.data(), gate.data(), n * n_ff);
    cpu::matmul(L.w_down, gate.data(), n, cur.data(), pool_.get());
    cpu::add(hidden, cur.data(), n * n_embd);
  }
  return Status();
}

Status CpuBackend::output(const Model& model, const float* hidden, int32_t n_rows, float* logits) {
  const auto& hp = model.hparams();
  std::vector<float> cur(static_cast<size_t>(n_rows) * static_cast<size_t>(hp.n_embd));
  for (int32_t t = 0; t < n_rows; ++t)
    cpu::rms_norm(hidden + static_cast<int64_t>(t) * hp.n_embd, model.output_norm().data(), hp.n_embd,
                  hp.rms_eps, cur.data() + static_cast<int64_t>(t) * hp.n_embd);
  cpu::matmul(model.output(), cur.data(), n_rows, logits, pool_.get());
  return Status();
}

}  // namespace spw
