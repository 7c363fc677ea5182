#include "backend/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"

namespace spw::cpu {

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

#if defined(__AVX512F__)
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

void exp_neg_shifted(float* x, int64_t n, float shift) {
  int64_t i = 0;
#if defined(__AVX512F__)
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

// One row's softmax step over a tile (len <= kKvTile scores in s): scales
// the scores by kq_scale, moves the running maximum to m' = max(m, tile's),
// turns s into p_j = exp_neg(s_j - m'), and updates the running sum to
// l * c + sum_j p_j. Returns c = exp_neg(m - m'), the factor the row's output
// so far must be multiplied by (1 when the maximum did not move; ignored on
// the first tile, which starts the sums). The tile's sum is a fixed tree
// over two 16-lane halves (lanes past len are 0, which adds nothing exactly),
// so it depends only on the scores.
float tile_softmax(float* s, int32_t len, float kq_scale, float* run_max, float* run_sum, bool first) {
  float tile_max = -std::numeric_limits<float>::infinity();
  float tile_sum = 0.0f;
  float m = 0.0f;
#if defined(__AVX512F__)
  static_assert(kKvTile == 32, "two 16-lane halves");
  const __mmask16 k0 = len >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << len) - 1);
  const __mmask16 k1 = len >= 32 ? __mmask16(0xFFFF) : len <= 16 ? __mmask16(0) : static_cast<__mmask16>((1u << (len - 16)) - 1);
  const __m512 scale = _mm512_set1_ps(kq_scale);
  const __m512 v0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(k0, s), scale);
  const __m512 v1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(k1, s + 16), scale);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  tile_max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_mask_mov_ps(ninf, k0, v0), _mm512_mask_mov_ps(ninf, k1, v1)));
  m = first ? tile_max : std::max(*run_max, tile_max);
  const __m512 mv = _mm512_set1_ps(m);
  const __m512 p0 = _mm512_maskz_mov_ps(k0, exp_neg16(_mm512_sub_ps(v0, mv)));
  const __m512 p1 = _mm512_maskz_mov_ps(k1, exp_neg16(_mm512_sub_ps(v1, mv)));
  tile_sum = _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  _mm512_mask_storeu_ps(s, k0, p0);
  _mm512_mask_storeu_ps(s + 16, k1, p1);
#else
  for (int32_t j = 0; j < len; ++j) {
    s[j] *= kq_scale;
    tile_max = std::max(tile_max, s[j]);
  }
  m = first ? tile_max : std::max(*run_max, tile_max);
  float half[16] = {};
  for (int32_t j = 0; j < len; ++j) {
    s[j] = exp_neg(s[j] - m);
    half[j % 16] += s[j];
  }
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) half[i] += half[i + w];
  tile_sum = half[0];
#endif
  float c = 1.0f;
  if (first) {
    *run_sum = tile_sum;
  } else if (m != *run_max) {
    c = exp_neg(*run_max - m);
    *run_sum = std::fma(*run_sum, c, tile_sum);
  } else {
    *run_sum += tile_sum;
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
  float* scores;   // [kQueryTile][kKvTile]
  float* acc;      // [kQueryTile][hd]
  float* run_max;  // [kQueryTile]
  float* run_sum;  // [kQueryTile]
};

inline float dot_one(const float* k, const float* q, int64_t n) { return dot_f32(k, q, n); }
inline float dot_one(const uint16_t* k, const float* q, int64_t n) { return dot_f16(k, q, n); }

// One KV tile [p0, pe) of one head for the rows of a query tile: scores,
// the online softmax step, the weighted V sums. kp / vp: the head's K and V
// slice of each position of the tile, F32 or F16 (read in place; the F16
// kernels give the F32 kernels' bits on the converted values).
template <typename KT>
void tile_step(const KT* const* kp, const KT* const* vp, const TileScratch& ts, const QueryTile& tile, int32_t h,
               int32_t p0, int32_t pe, bool first) {
  // Scores: rows in pairs share each K row's loads (dot_f32_2x4) for
  // the positions both see; the rest row by row. Each score is
  // dot_f32(k, q) bitwise either way.
  const int32_t r_begin = std::max(0, p0 - tile.pos0);  // earlier rows ended before p0
  for (int32_t r = r_begin; r < tile.n; r += 2) {
    const int32_t nr = std::min(2, tile.n - r);
    int32_t j = 0;
    if (nr == 2) {
      const int32_t common = std::min(pe, tile.pos0 + r + 1) - p0;  // the first row sees fewer
      const float* qr[2] = {ts.q + (tile.row0 + r) * ts.n_q + static_cast<int64_t>(h) * ts.hd,
                            ts.q + (tile.row0 + r + 1) * ts.n_q + static_cast<int64_t>(h) * ts.hd};
      float* s0 = ts.scores + static_cast<int64_t>(r) * kKvTile;
      for (; j + 4 <= common; j += 4) dot_f32_2x4(qr, kp + j, ts.hd, s0 + j, s0 + kKvTile + j);
    }
    for (int32_t i = 0; i < nr; ++i) {
      const int32_t len = std::min(pe, tile.pos0 + r + i + 1) - p0;
      const float* qr = ts.q + (tile.row0 + r + i) * ts.n_q + static_cast<int64_t>(h) * ts.hd;
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
    const float c = tile_softmax(sr, len, ts.kq_scale, ts.run_max + r, ts.run_sum + r, first);
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
  const int64_t n_kv = static_cast<int64_t>(sh.n_head_kv) * hd;
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
    const float* kp[kKvTile];
    const float* vp[kKvTile];
    const uint16_t* kh[kKvTile];
    const uint16_t* vh[kKvTile];
    const TileScratch ts{q, n_q, hd, sh.kq_scale, scores, acc, run_max, run_sum};
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
      const auto& blocks = tile.seq->kv.table->blocks();
      const int64_t off = static_cast<int64_t>(h / n_gqa) * hd;
      const size_t slice_size = kv_row_bytes(kvp->type(), static_cast<uint64_t>(hd));
      const int32_t np = tile.pos0 + tile.n;  // positions the tile's last row sees
      for (int32_t p0 = 0; p0 < np; p0 += kKvTile) {
        const int32_t pe = std::min(np, p0 + kKvTile);
        // This head's K and V row of each position of the tile.
        // The next tile's rows are fetched while this one computes: a
        // tile's 32 rows of this head lie in a few KV blocks far apart,
        // too short a run for the hardware prefetcher to lock on.
        for (int32_t p = p0 + kKvTile, p_end = std::min(np, p0 + 2 * kKvTile); p < p_end; ++p) {
          const int32_t blk = blocks[static_cast<size_t>(p / bt)];
          prefetch_bytes(kvp->slice_bytes(false, blk, lp, p % bt, static_cast<int32_t>(off)), slice_size);
          prefetch_bytes(kvp->slice_bytes(true, blk, lp, p % bt, static_cast<int32_t>(off)), slice_size);
        }
        const bool first = p0 == 0;
        if (kvp->type() == KvType::kF16) {
          const size_t row = kvp->row_bytes();
          for (int32_t p = p0; p < pe; ++p) {
            const int32_t blk = blocks[static_cast<size_t>(p / bt)];
            const size_t at = static_cast<size_t>(p % bt) * row + static_cast<size_t>(off) * 2;
            kh[p - p0] = reinterpret_cast<const uint16_t*>(kvp->k_bytes(blk, lp) + at);
            vh[p - p0] = reinterpret_cast<const uint16_t*>(kvp->v_bytes(blk, lp) + at);
          }
        } else if (kvp->type() != KvType::kF32) {  // q8_0: converted into the scratch
          for (int32_t p = p0; p < pe; ++p) {
            const int32_t blk = blocks[static_cast<size_t>(p / bt)];
            float* kd = k_f32 + static_cast<int64_t>(p - p0) * hd;
            float* vd = v_f32 + static_cast<int64_t>(p - p0) * hd;
            kvp->slice_to_f32(false, blk, lp, p % bt, static_cast<int32_t>(off), static_cast<int32_t>(hd), kd);
            kvp->slice_to_f32(true, blk, lp, p % bt, static_cast<int32_t>(off), static_cast<int32_t>(hd), vd);
            kp[p - p0] = kd;
            vp[p - p0] = vd;
          }
        }
        for (int32_t p = p0; p < pe && kvp->type() == KvType::kF32;) {
          const int32_t blk = blocks[static_cast<size_t>(p / bt)];
          const int32_t b_end = std::min(pe, (p / bt + 1) * bt);
          const int32_t b_start = p / bt * bt;
          const float* kb = kvp->k(blk, lp) + off;
          const float* vb = kvp->v(blk, lp) + off;
          for (; p < b_end; ++p) {
            kp[p - p0] = kb + static_cast<int64_t>(p - b_start) * n_kv;
            vp[p - p0] = vb + static_cast<int64_t>(p - b_start) * n_kv;
          }
        }
        if (kvp->type() == KvType::kF16) {
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

}  // namespace spw::cpu
