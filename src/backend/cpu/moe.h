// The mixture-of-experts FFN on the CPU (model/arch.h says which models have
// one and how their routers weight the experts).
//
// Contract: moe_ffn() computes, for each of n rows x[t] (the FFN norm's
// output), out[t] = sum over the n_expert_used experts the router chose, in
// the order it ranked them, of weight * expert(x[t]), plus, with a shared
// expert, sigmoid(shared_router . x[t]) * shared(x[t]), where expert(x) =
// down(silu(gate x) * up x). The router: logits = router x[t]; softmax over
// all experts (cpu::softmax); the n_expert_used most probable, ties to the
// lower id; their probabilities, divided by their sum where
// hp.moe_norm_topk, times hp.moe_weights_scale. The routed rows are grouped
// by expert, and each expert used in the call runs ONE matmul over all its
// rows (gate and up fused, then down): a prefill or a batched step reads
// each chosen expert's weights once, however many rows chose it.
// Numerics: a row's result is bitwise independent of the other rows, their
// number and the thread count (the matmuls are per row: kernels.h), so the
// backend's batch invariance holds for MoE layers too.
// Scratch: moe_scratch_words(hp, n) 4-byte words (model/hparams.h) of raw
// storage (floats and ids live in it side by side) at `scratch` (the routing
// tables, a gathered input and the chosen experts' outputs), and gate/up of
// n * hp.ffn_width() floats each; the CPU backend allocates exactly these
// and the estimator prices them (admission/estimator.cpp). `out` may be x.
// Thread safety: runs its matmuls on `pool`; no other shared state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "model/model.h"

namespace spw::cpu {

void moe_ffn(const Model& model, const MoeWeights& w, const float* x, int64_t n, float* gate, float* up,
             std::byte* scratch, float* out, ThreadPool* pool);

// The router's decision for n rows, as moe_ffn makes it: `probs` holds the
// router's logits [n][n_expert] and becomes their softmax; id and weight
// ([n][n_expert_used]) the chosen experts, most probable first (ties to the
// lower id), and their weights (renormalised where hp.moe_norm_topk). The
// Vulkan backend routes its device experts with it, so both backends choose
// alike from equal logits.
void moe_route(const LlamaHparams& hp, float* probs, int64_t n, int32_t* id, float* weight);

// Groups the n * n_expert_used (row, rank) pairs of `id` by expert, rows
// ascending within one: first ([n_expert + 1]) gets each expert's start in
// order ([n * n_expert_used], entries row * n_expert_used + rank); `cursor`
// is n_expert ints of scratch.
void moe_group(const LlamaHparams& hp, const int32_t* id, int64_t n, int32_t* first, int32_t* order, int32_t* cursor);

}  // namespace spw::cpu
