#include "backend/cpu/moe.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_weights.h"

namespace spw::cpu {

void moe_ffn(const Model& model, const MoeWeights& w, const float* x, int64_t n, float* gate, float* up,
             std::byte* scratch, float* out, ThreadPool* pool) {
  const LlamaHparams& hp = model.hparams();
  const int64_t E = hp.n_embd, X = hp.n_expert, K = hp.n_expert_used, FE = hp.n_ff_exp;
  // The storage's regions, each used as one type only (moe_scratch_words).
  auto* xg = reinterpret_cast<float*>(scratch);  // [n][E]: one expert's rows, gathered; then its output
  float* slots = xg + n * E;                      // [n][K][E]: each row's chosen experts' outputs, in rank order
  float* probs = slots + n * K * E;               // [n][X]; then the shared expert's gate, [n]
  float* weight = probs + n * X;                  // [n][K]
  auto* id = reinterpret_cast<int32_t*>(scratch + (n * E + n * K * E + n * X + n * K) * 4);  // [n][K], ranked
  int32_t* order = id + n * K;      // [n * K] (row, rank) pairs grouped by expert, rows ascending
  int32_t* first = order + n * K;   // [X + 1] each expert's start in `order`
  int32_t* cursor = first + X + 1;  // [X]
  auto W = [&](const WeightMatrix& m) -> const WeightMatrix& { return cpu_weights(model, m); };

  // Route, then group the (row, rank) pairs by expert.
  matmul(W(w.router), x, n, probs, pool);
  moe_route(hp, probs, n, id, weight);
  moe_group(hp, id, n, first, order, cursor);
  // Each chosen expert once, over all its rows.
  for (int64_t e = 0; e < X; ++e) {
    const int64_t r0 = first[e], cnt = first[e + 1] - first[e];
    if (cnt == 0) continue;
    for (int64_t r = 0; r < cnt; ++r)
      std::memcpy(xg + r * E, x + (order[r0 + r] / K) * E, static_cast<size_t>(E) * sizeof(float));
    const MatmulOut gate_up[2] = {{&W(w.gate[static_cast<size_t>(e)]), gate}, {&W(w.up[static_cast<size_t>(e)]), up}};
    matmul_fused(gate_up, 2, xg, cnt, pool);
    swiglu(gate, up, gate, cnt * FE);
    matmul(W(w.down[static_cast<size_t>(e)]), gate, cnt, xg, pool);
    for (int64_t r = 0; r < cnt; ++r)
      std::memcpy(slots + static_cast<int64_t>(order[r0 + r]) * E, xg + r * E, static_cast<size_t>(E) * sizeof(float));
  }
  // The shared expert over every row (its output in xg) and its gate.
  const bool shared = w.shared_gate.n_rows > 0;
  float* shared_scale = probs;  // [n]
  if (shared) {
    const int64_t FS = w.shared_gate.n_rows;
    const MatmulOut gate_up[2] = {{&W(w.shared_gate), gate}, {&W(w.shared_up), up}};
    matmul_fused(gate_up, 2, x, n, pool);
    swiglu(gate, up, gate, n * FS);
    matmul(W(w.shared_down), gate, n, xg, pool);
    for (int64_t t = 0; t < n; ++t) {
      float dot = 0.0f;
      for (int64_t i = 0; i < E; ++i) dot += w.shared_router[static_cast<size_t>(i)] * x[t * E + i];
      shared_scale[t] = 1.0f / (1.0f + std::exp(-dot));
    }
  }
  // Combine in rank order (x is not read from here on: out may be x).
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * E;
    const float* s0 = slots + t * K * E;
    const float w0 = weight[t * K];
    for (int64_t i = 0; i < E; ++i) o[i] = w0 * s0[i];
    for (int64_t j = 1; j < K; ++j) {
      const float* sj = slots + (t * K + j) * E;
      const float wj = weight[t * K + j];
      for (int64_t i = 0; i < E; ++i) o[i] += wj * sj[i];
    }
    if (shared) {
      const float* sh = xg + t * E;
      for (int64_t i = 0; i < E; ++i) o[i] += shared_scale[t] * sh[i];
    }
  }
}

void moe_route(const LlamaHparams& hp, float* probs, int64_t n, int32_t* id, float* weight) {
  const int64_t X = hp.n_expert, K = hp.n_expert_used;
  // Softmax over every expert, the K most probable (ties to the lower id:
  // a strict > keeps the first), their weights.
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs + t * X;
    softmax(p, X);
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < X; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j && !taken; ++i) taken = id[t * K + i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      id[t * K + j] = static_cast<int32_t>(best);
      weight[t * K + j] = p[best];
      sum += p[best];
    }
    if (hp.moe_norm_topk)
      for (int64_t j = 0; j < K; ++j) weight[t * K + j] /= sum;
    if (hp.moe_weights_scale != 1.0f)
      for (int64_t j = 0; j < K; ++j) weight[t * K + j] *= hp.moe_weights_scale;
  }
}

void moe_group(const LlamaHparams& hp, const int32_t* id, int64_t n, int32_t* first, int32_t* order,
               int32_t* cursor) {
  const int64_t X = hp.n_expert, K = hp.n_expert_used;
  // A counting sort, stable in rows.
  std::memset(first, 0, static_cast<size_t>(X + 1) * sizeof(int32_t));
  for (int64_t i = 0; i < n * K; ++i) ++first[id[i] + 1];
  for (int64_t e = 0; e < X; ++e) first[e + 1] += first[e];
  std::memcpy(cursor, first, static_cast<size_t>(X) * sizeof(int32_t));
  for (int64_t i = 0; i < n * K; ++i) order[cursor[id[i]]++] = static_cast<int32_t>(i);
}

}  // namespace spw::cpu
