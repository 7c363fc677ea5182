#include "backend/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"

SPW_CPU_KERNELS_BEGIN

namespace {

// exp_neg's constants: 2^n * exp(r) with n = round(x / ln 2), r = x - n ln 2
// in two steps (ln2_hi has few enough bits that n * ln2_hi is exact for
// |n| <= 126), exp(r) on |r| <= ln2/2 by its Taylor polynomial to r^7
// (truncation < 2e-9 relative, below the float rounding of the steps).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpMin = -87.0f;  // exp(-87) = 1.6e-38 is still a normal float
constexpr float kC[8] = {1.0f, 1.0f, 0.5f, 1.66666672e-1f, 4.16666679e-2f, 8.33333377e-3f, 1.38888892e-3f,
                         1.98412701e-4f};

}  // namespace

float exp_neg(float x) {
  if (!(x >= kExpMin)) return 0.0f;  // NaN too
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kC[7];
  for (int i = 6; i >= 0; --i) p = std::fma(p, r, kC[i]);
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

#if defined(SPW_AVX512F)
// exp_neg on 16 lanes: the same operations in the same order (roundscale to
// nearest-even is nearbyint under the default rounding mode; fnmadd(n, c, x)
// is fma(-n, c, x)).
static inline __m512 exp_neg16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_GE_OQ);
  return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}
#endif

#if defined(SPW_AVX2) && defined(SPW_FMA) && !defined(SPW_AVX512F)
// exp_neg on 8 lanes: exp_neg16's operations on ymm registers; the lanes
// below kExpMin (or NaN) are cleared after the multiply, as the scalar
// function returns 0 for them.
static inline __m256 exp_neg8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_GE_OQ);
  return _mm256_and_ps(ok, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

void exp_neg_shifted(float* x, int64_t n, float shift) {
  int64_t i = 0;
#if defined(SPW_AVX2) && defined(SPW_FMA) && !defined(SPW_AVX512F)
  const __m256 s8 = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s8)));
#endif
#if defined(SPW_AVX512F)
  const __m512 s = _mm512_set1_ps(shift);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
  }
#endif
  for (; i < n; ++i) x[i] = exp_neg(x[i] - shift);
}

int64_t attention_items(std::span<const SeqSlice> slices, int32_t n_head) {
  int64_t tiles = 0;
  for (const SeqSlice& sl : slices) tiles += (sl.n_tokens + kQueryTile - 1) / kQueryTile;
  return tiles * n_head;
}

namespace {

// One query tile of one slice: rows row0.. at positions pos0.., n rows.
struct QueryTile {
  const SeqSlice* seq = nullptr;
  int64_t row0 = 0;
  int32_t pos0 = 0;
  int32_t n = 0;
};

// The ti-th query tile of the pass (slices in order, each cut into tiles of
// kQueryTile rows). Found by walking the slices rather than from a table, so
// the pass allocates nothing but the workers' scratch (the estimator's
// figure); a pass has a few dozen slices at most.
QueryTile query_tile(std::span<const SeqSlice> slices, int64_t ti) {
  int64_t row0 = 0;
  for (const SeqSlice& sl : slices) {
    const int64_t n_tiles = (sl.n_tokens + kQueryTile - 1) / kQueryTile;
    if (ti < n_tiles) {
      const auto t0 = static_cast<int32_t>(ti * kQueryTile);
      return {&sl, row0 + t0, sl.pos0 + t0, std::min(kQueryTile, sl.n_tokens - t0)};
    }
    ti -= n_tiles;
    row0 += sl.n_tokens;
  }
  return {};
}

// Asks the cache for the lines of n bytes at p (a hint; no effect on results).
inline void prefetch_bytes(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(p + i, 0, 3);
}

// out[d] *= c for d < dim (a plain multiply: each lane's rounding is the same
// whether vectorised or not).
inline void scale_row(float* out, int64_t dim, float c) {
  for (int64_t d = 0; d < dim; ++d) out[d] *= c;
}

// The sum of s[0..len) (len <= kKvTile) by a fixed tree over two 16-lane
// halves: lane i holds s[i] + s[i + 16] (0 past len, which adds nothing
// exactly), then the lanes are summed pairwise. It depends only on the values.
float tile_sum(const float* s, int32_t len) {
  static_assert(kKvTile == 32, "two 16-lane halves");
#if defined(SPW_AVX512F)
  const __mmask16 k0 = len >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << len) - 1);
  const __mmask16 k1 = len >= 32 ? __mmask16(0xFFFF) : len <= 16 ? __mmask16(0) : static_cast<__mmask16>((1u << (len - 16)) - 1);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(k0, s), _mm512_maskz_loadu_ps(k1, s + 16)));
#else
  float half[16] = {};
  for (int32_t j = 0; j < len; ++j) half[j % 16] += s[j];
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) half[i] += half[i + w];
  return half[0];
#endif
}

// One row's softmax step over a tile (len <= kKvTile scores in s): scales
// the scores by kq_scale, moves the running maximum to m' = max(m, tile's),
// turns s into p_j = exp_neg(s_j - m'), and updates the running sum to
// l * c + tile_sum(p). Returns c = exp_neg(m - m'), the factor the row's
// output so far must be multiplied by (1 when the maximum did not move;
// ignored on the first tile, which starts the sums).
float tile_softmax(float* s, int32_t len, float kq_scale, float* run_max, float* run_sum, bool first,
                   float softcap, int32_t masked) {
  float tile_max = -std::numeric_limits<float>::infinity();
  if (softcap > 0.0f || masked > 0) {
    // Gemma's scores: scaled, soft-capped, the positions before the row's
    // window at -inf (exp_neg gives them 0; a tile of them only leaves the
    // sums at 0, which the next tile's update discards exactly).
    for (int32_t j = 0; j < len; ++j) {
      float v = s[j] * kq_scale;
      if (softcap > 0.0f) v = softcap * tanh_steps(v / softcap);
      if (j < masked) v = -std::numeric_limits<float>::infinity();
      s[j] = v;
      tile_max = std::max(tile_max, v);
    }
  } else {
#if defined(SPW_AVX512F)
  // GCC does not vectorise a float max reduction without -ffast-math: as a
  // plain loop, this step made an 8k-token prefill 15% slower.
  const __m512 scale = _mm512_set1_ps(kq_scale), ninf = _mm512_set1_ps(tile_max);
  __m512 mx = ninf;
  for (int32_t j = 0; j < len; j += 16) {
    const __mmask16 k = len - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (len - j)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), scale);
    _mm512_mask_storeu_ps(s + j, k, v);
    mx = _mm512_max_ps(mx, _mm512_mask_mov_ps(ninf, k, v));
  }
  tile_max = _mm512_reduce_max_ps(mx);
#else
  int32_t j0 = 0;
#if defined(SPW_AVX2)
  // As above on 8 lanes; max is exact in any order.
  const __m256 scale8 = _mm256_set1_ps(kq_scale);
  __m256 mx8 = _mm256_set1_ps(tile_max);
  for (; j0 + 8 <= len; j0 += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j0), scale8);
    _mm256_storeu_ps(s + j0, v);
    mx8 = _mm256_max_ps(v, mx8);  // a NaN score leaves the max as std::max does
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, mx8);
  for (float v : lanes) tile_max = std::max(tile_max, v);
#endif
  for (int32_t j = j0; j < len; ++j) {
    s[j] *= kq_scale;
    tile_max = std::max(tile_max, s[j]);
  }
#endif
  }
  const float m = first ? tile_max : std::max(*run_max, tile_max);
  exp_neg_shifted(s, len, m);
  const float t = tile_sum(s, len);
  float c = 1.0f;
  if (first) {
    *run_sum = t;
  } else if (m != *run_max) {
    c = exp_neg(*run_max - m);
    *run_sum = std::fma(*run_sum, c, t);
  } else {
    *run_sum += t;
  }
  *run_max = m;
  return c;
}

// What a work item's tile step reads and writes: the pass's queries, the
// item's scratch (scores, outputs, running maxima and sums of its rows).
struct TileScratch {
  const float* q;
  int64_t n_q;
  int64_t hd;
  float kq_scale;
  int32_t window;  // AttentionShape's
  float softcap;
  float* scores;   // [kQueryTile][kKvTile]
  float* acc;      // [kQueryTile][hd]
  float* run_max;  // [kQueryTile]
  float* run_sum;  // [kQueryTile]
};

// K and V of a position before the work item's first row's window: it is
// scored -inf whatever it holds, and its block may have been given back
// (KvPool::slide), so it is read as zeros. As wide as the widest head
// the models have (256) with room; wider heads take a zeroed row of their own.
constexpr int64_t kZeroRowFloats = 1024;
alignas(64) constexpr float kZeroRow[kZeroRowFloats] = {};

inline float dot_one(const float* k, const float* q, int64_t n) { return dot_f32(k, q, n); }
inline float dot_one(const uint16_t* k, const float* q, int64_t n) { return dot_f16(k, q, n); }

// One KV tile [p0, pe) of one head for the rows of a query tile: scores,
// the online softmax step, the weighted V sums. kp / vp: the head's K and V
// slice of each position of the tile, F32 or F16 (read in place; the F16
// kernels give the F32 kernels' bits on the converted values).
template <typename KT>
void tile_step(const KT* const* kp, const KT* const* vp, const TileScratch& ts, const QueryTile& tile, int32_t h,
               int32_t p0, int32_t pe, bool first) {
  // Scores: rows in pairs share each K row's loads (dot_f32_2x8 / 2x4) for
  // the positions both see: 16 independent chains, as a head is only a few
  // fused steps per score (8k-position prefill of 15m 1.09-1.13x 2x4's). The
  // rest row by row, four positions per call: eight measured slower for a
  // decode step at 8k positions (0.86-0.9x), likely the eight K rows' streams.
  // Each score is dot_f32(k, q) bitwise either way.
  const int32_t r_begin = std::max(0, p0 - tile.pos0);  // earlier rows ended before p0
  auto q_row = [&](int32_t r) { return ts.q + (tile.row0 + r) * ts.n_q + static_cast<int64_t>(h) * ts.hd; };
  for (int32_t r = r_begin; r < tile.n; r += 2) {
    const int32_t nr = std::min(2, tile.n - r);
    int32_t j = 0;
    if (nr == 2) {
      const int32_t common = std::min(pe, tile.pos0 + r + 1) - p0;  // the first row sees fewer
      const float* qr[2] = {q_row(r), q_row(r + 1)};
      float* s0 = ts.scores + static_cast<int64_t>(r) * kKvTile;
      for (; j + 8 <= common; j += 8) dot_f32_2x8(qr, kp + j, ts.hd, s0 + j, s0 + kKvTile + j);
      for (; j + 4 <= common; j += 4) dot_f32_2x4(qr, kp + j, ts.hd, s0 + j, s0 + kKvTile + j);
    }
    for (int32_t i = 0; i < nr; ++i) {
      const int32_t len = std::min(pe, tile.pos0 + r + i + 1) - p0;
      const float* qr = q_row(r + i);
      float* sr = ts.scores + static_cast<int64_t>(r + i) * kKvTile;
      int32_t jj = j;
      for (; jj + 4 <= len; jj += 4) dot_f32_x4(qr, kp + jj, ts.hd, sr + jj);
      for (; jj < len; ++jj) sr[jj] = dot_one(kp[jj], qr, ts.hd);
    }
  }
  for (int32_t r = r_begin; r < tile.n; ++r) {
    const int32_t len = std::min(pe, tile.pos0 + r + 1) - p0;
    float* sr = ts.scores + static_cast<int64_t>(r) * kKvTile;
    float* o = ts.acc + static_cast<int64_t>(r) * ts.hd;
    // A sliding window: the row's positions below pos - window + 1 count for nothing.
    const int32_t masked = ts.window > 0 ? std::clamp(tile.pos0 + r - ts.window + 1 - p0, 0, len) : 0;
    const float c = tile_softmax(sr, len, ts.kq_scale, ts.run_max + r, ts.run_sum + r, first, ts.softcap, masked);
    if (!first && c != 1.0f) scale_row(o, ts.hd, c);
  }
  // Weighted V sums, rows in fours over the positions all four see
  // (each V row loaded once for them), the rest row by row; each row
  // gets weighted_rows' sequence either way.
  for (int32_t r = r_begin; r < tile.n; r += 4) {
    const int32_t nr = std::min(4, tile.n - r);
    int32_t j = 0;
    if (nr == 4) {
      j = std::min(pe, tile.pos0 + r + 1) - p0;  // the group's first row sees fewest
      const float* a[4];
      float* o[4];
      for (int32_t i = 0; i < 4; ++i) {
        a[i] = ts.scores + static_cast<int64_t>(r + i) * kKvTile;
        o[i] = ts.acc + static_cast<int64_t>(r + i) * ts.hd;
      }
      weighted_rows_x4(vp, a, j, ts.hd, o, /*accumulate=*/!first);
    }
    for (int32_t i = 0; i < nr; ++i) {
      const int32_t len = std::min(pe, tile.pos0 + r + i + 1) - p0;
      if (len == j) continue;
      weighted_rows(vp + j, ts.scores + static_cast<int64_t>(r + i) * kKvTile + j, len - j, ts.hd,
                    ts.acc + static_cast<int64_t>(r + i) * ts.hd, /*accumulate=*/!first || j > 0);
    }
  }
}

}  // namespace

void attention(std::span<const SeqSlice> slices, int32_t layer, const AttentionShape& sh, const float* q, float* out,
               ThreadPool* pool) {
  const int64_t hd = sh.head_dim;
  const int64_t n_q = static_cast<int64_t>(sh.n_head) * hd;
  const int32_t n_gqa = sh.n_head / sh.n_head_kv;

  int64_t rows = 0;
  int32_t max_pos = 0;
  for (const SeqSlice& sl : slices) {
    rows += sl.n_tokens;
    max_pos = std::max(max_pos, sl.pos0 + sl.n_tokens);
  }
  const int64_t n_items = attention_items(slices, sh.n_head);
  bool converts = false;  // a Q8_0 pool: its slices are dequantised into the scratch
  for (const SeqSlice& sl : slices) converts = converts || sl.kv.pool->type() == KvType::kQ8_0;

  auto run = [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch(static_cast<size_t>(attention_scratch_floats(hd, converts)));
    float* scores = scratch.data();                  // [kQueryTile][kKvTile]
    float* acc = scores + kQueryTile * kKvTile;      // [kQueryTile][hd]
    float* run_max = acc + kQueryTile * hd;          // [kQueryTile]
    float* run_sum = run_max + kQueryTile;           // [kQueryTile]
    float* k_f32 = run_sum + kQueryTile;             // [kKvTile][hd] for a Q8_0 pool
    float* v_f32 = k_f32 + kKvTile * hd;             // [kKvTile][hd]
    std::vector<float> wide_zeros(static_cast<size_t>(hd > kZeroRowFloats ? hd : 0));
    const float* zero_row = hd > kZeroRowFloats ? wide_zeros.data() : kZeroRow;
    const float* kp[kKvTile];
    const float* vp[kKvTile];
    const uint16_t* kh[kKvTile];
    const uint16_t* vh[kKvTile];
    const TileScratch ts{q, n_q, hd, sh.kq_scale, sh.window, sh.softcap, scores, acc, run_max, run_sum};
    QueryTile tile;
    int64_t tile_index = -1;
    for (int64_t it = i0; it < i1; ++it) {
      if (it / sh.n_head != tile_index) {
        tile_index = it / sh.n_head;
        tile = query_tile(slices, tile_index);
      }
      const int32_t h = static_cast<int32_t>(it % sh.n_head);
      const KvPool* kvp = tile.seq->kv.pool;
      const int32_t lp = layer - kvp->options().layer_begin;
      const int32_t bt = kvp->block_tokens();
      const auto& blocks = tile.seq->kv.table->blocks(kvp->plane(lp));  // a sliding layer's: its window's
      const KvType type = kvp->type();
      const size_t row = kvp->row_bytes();
      // This head's slice of a K or V row: its offset and size in the row.
      const size_t slice_off = kv_row_bytes(type, static_cast<uint64_t>(h / n_gqa) * hd);
      const size_t slice_size = kv_row_bytes(type, static_cast<uint64_t>(hd));
      // fn(p, k, v) for positions [pb, pe_) with this head's K and V slice
      // bytes, a KV block at a time (one block-table lookup per block).
      auto for_each_slice = [&](int32_t pb, int32_t pe_, auto&& fn) {
        for (int32_t p = pb; p < pe_;) {
          const int32_t b = p / bt, slot = p - b * bt;
          const size_t at = static_cast<size_t>(slot) * row + slice_off;
          const uint8_t* k = kvp->k_bytes(blocks[static_cast<size_t>(b)], lp) + at;
          const uint8_t* v = kvp->v_bytes(blocks[static_cast<size_t>(b)], lp) + at;
          for (const int32_t end = std::min(pe_, (b + 1) * bt); p < end; ++p, k += row, v += row) fn(p, k, v);
        }
      };
      const int32_t np = tile.pos0 + tile.n;  // positions the tile's last row sees
      // A sliding window starts at the KV tile holding the first row's lowest position.
      const int32_t lo = sh.window > 0 ? std::max(0, tile.pos0 - sh.window + 1) : 0;  // the first row's first
      const int32_t start = lo / kKvTile * kKvTile;
      for (int32_t p0 = start; p0 < np; p0 += kKvTile) {
        const int32_t pe = std::min(np, p0 + kKvTile);
        // The next tile's slices are fetched while this one computes: a
        // tile's 32 rows of this head lie in a few KV blocks far apart,
        // too short a run for the hardware prefetcher to lock on.
        for_each_slice(pe, std::min(np, pe + kKvTile), [&](int32_t, const uint8_t* k, const uint8_t* v) {
          prefetch_bytes(k, slice_size);
          prefetch_bytes(v, slice_size);
        });
        const bool first = p0 == start;
        // The tile's slices: F32 and F16 read in place, Q8_0 dequantised
        // into the scratch; zeros before the window (kZeroRow).
        for (int32_t j = 0; j < std::min(lo, pe) - p0; ++j) {
          kp[j] = vp[j] = zero_row;
          kh[j] = vh[j] = reinterpret_cast<const uint16_t*>(zero_row);  // +0 halves
        }
        for_each_slice(std::max(p0, lo), pe, [&](int32_t p, const uint8_t* k, const uint8_t* v) {
          const int32_t j = p - p0;
          switch (type) {
            case KvType::kF32:
              kp[j] = reinterpret_cast<const float*>(k);
              vp[j] = reinterpret_cast<const float*>(v);
              break;
            case KvType::kF16:
              kh[j] = reinterpret_cast<const uint16_t*>(k);
              vh[j] = reinterpret_cast<const uint16_t*>(v);
              break;
            case KvType::kQ8_0:
              kp[j] = k_f32 + static_cast<int64_t>(j) * hd;
              vp[j] = v_f32 + static_cast<int64_t>(j) * hd;
              kv_values_to_f32(type, k, k_f32 + static_cast<int64_t>(j) * hd, static_cast<size_t>(hd));
              kv_values_to_f32(type, v, v_f32 + static_cast<int64_t>(j) * hd, static_cast<size_t>(hd));
              break;
          }
        });
        if (type == KvType::kF16) {
          tile_step<uint16_t>(kh, vh, ts, tile, h, p0, pe, first);
        } else {
          tile_step<float>(kp, vp, ts, tile, h, p0, pe, first);
        }
      }
      for (int32_t r = 0; r < tile.n; ++r) {
        const float inv = 1.0f / run_sum[r];
        const float* o = acc + static_cast<int64_t>(r) * hd;
        float* dst = out + (tile.row0 + r) * n_q + static_cast<int64_t>(h) * hd;
        for (int64_t d = 0; d < hd; ++d) dst[d] = o[d] * inv;
      }
    }
  };
  if (pool != nullptr && attention_parallel(n_items, rows, sh.n_head, max_pos, hd)) {
    pool->parallel_for(n_items, run);
  } else {
    run(0, n_items);
  }
}

SPW_CPU_KERNELS_END
