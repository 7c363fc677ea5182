// Causal attention of a CPU forward pass over its sequences' paged KV, tiled
// like flash attention: no row of n_ctx scores is ever held, and each K/V row
// is read from memory once per tile of query rows instead of once per row.
//
// Contract: attention() computes, for every row of every slice and every head
// h, softmax(q . K^T * kq_scale) V over positions 0..pos of the row's own
// sequence (pos - window < p <= pos on a sliding-window layer, window > 0;
// with softcap > 0 each scaled score s becomes softcap * tanh_steps(s /
// softcap) first, kernels.h), reading K/V of `layer` (absolute index) through the sequence's
// block table; K/V of the pass's own rows must already be written. GQA: head
// h reads KV head h / (n_head / n_head_kv).
// How each (row, head) is computed -- fixed by its position alone, so results
// are bitwise independent of the batch, the other rows and sequences in it,
// the split into ubatches and the thread count (backend.h's contract):
//   positions are taken in tiles [k*kKvTile, (k+1)*kKvTile) from position 0,
//   the last one cut at the row's position (with a window, from the tile
//   holding the work item's first row's lowest position: a row's positions
//   before its own window are scored -inf, so that the tiles before the one
//   holding its lowest position add exactly nothing and its result is the
//   one it gets from that tile on, whatever rows share the item); per tile: scores s_j =
//   dot_f32(k_j, q) * kq_scale (kernels.h), the running maximum m' =
//   max(m, max_j s_j), p_j = exp_neg(s_j - m') (below), the tile's sum t =
//   a fixed tree over its p_j (attention.cpp, tile_softmax), and from the
//   second tile on c = exp_neg(m - m') when the maximum moved: l = fma(l, c,
//   t) and o = o * c (else l = l + t); then o += p_j v_j in position order
//   (weighted_rows' fused steps). The result is o * (1 / l).
// Work items are (tile of up to kQueryTile consecutive rows of one slice,
// head): a prompt chunk shares each K/V tile among its rows while the tile is
// in cache; a decode step (one row per sequence) splits its heads over the
// threads. Small passes run on the calling thread (attention_parallel()).
// Memory: each running worker holds attention_scratch_floats(head_dim, ...)
// floats (one allocation), whatever the context length; the admission
// estimator counts exactly that (estimator.cpp).
// KV types: F32 and F16 pools are read in place (the F16 forms of the
// kernels.h helpers convert in registers); a Q8_0 pool's slices are
// dequantised a tile at a time. Every stored value is exactly a float, so a
// pool of any type computes what an F32 pool holding its values would, bit
// for bit.
// Thread safety: reads the pools' K/V and q; writes only its rows of `out`.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/variant_ns.h"

namespace spw::cpu {

inline constexpr int32_t kQueryTile = 32;  // query rows per work item
inline constexpr int32_t kKvTile = 32;     // positions per softmax step

struct AttentionShape {
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  float kq_scale = 1.0f;
  int32_t window = 0;     // > 0: a sliding-window layer's span (LlamaHparams::n_swa)
  float softcap = 0.0f;   // > 0: scores soft-capped (Gemma 2)
};

// Floats of one worker's scratch: scores and outputs of a query tile, its
// running maxima and sums, and -- when a pass reads a Q8_0 pool
// (`converts`) -- a K and a V tile of one head's slices dequantised to F32
// (kv_values_to_f32), which the tile's rows then share.
inline constexpr int64_t attention_scratch_floats(int64_t head_dim, bool converts) {
  return static_cast<int64_t>(kQueryTile) * (kKvTile + head_dim + 2) + (converts ? 2 * kKvTile * head_dim : 0);
}

SPW_CPU_NS_BEGIN

// Work items of a pass: sum over slices of ceil(n_tokens / kQueryTile), times
// n_head.
int64_t attention_items(std::span<const SeqSlice> slices, int32_t n_head);

SPW_CPU_NS_END

// Whether attention() uses the pool: more than one item and work
// (rows * n_head * max_positions * head_dim) of at least 2^15, below which
// waking the workers costs more than it saves. The estimator mirrors it.
inline bool attention_parallel(int64_t items, int64_t rows, int64_t n_head, int64_t max_positions,
                               int64_t head_dim) {
  return items > 1 && rows * n_head * max_positions * head_dim >= (int64_t{1} << 15);
}

SPW_CPU_NS_BEGIN

// q and out: [rows][n_head * head_dim], rows the slices' rows in order.
void attention(std::span<const SeqSlice> slices, int32_t layer, const AttentionShape& shape, const float* q,
               float* out, ThreadPool* pool);

// exp(x) for x <= 0 (softmax arguments: a score minus the running maximum),
// within 2 ulp of std::exp; 0 below -87.3 (where expf is subnormal or 0).
// The 16-lane and the scalar forms run the same IEEE operations, so a value
// gets the same bits in whichever lane or tail it falls: a tile's softmax does
// not depend on where the vector loop ends.
float exp_neg(float x);
// x[i] = exp_neg(x[i] - shift) for i < n.
void exp_neg_shifted(float* x, int64_t n, float shift);

SPW_CPU_NS_END

}  // namespace spw::cpu
