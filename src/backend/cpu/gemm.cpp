// matmul and matmul_fused (kernels.h): the per-row path (decode, small
// batches) and the GEMM path (prefill): its blocks, the register tiles and
// the activations prepared once per call. Compiled once per kernel variant
// like kernels.cpp (simd.h); the dot kernels both paths replay are
// kernels_internal.h's, shared with kernels.cpp's entry points.
#include "backend/cpu/kernels.h"

#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/simd.h"
#include "gguf/quant_blocks.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <vector>

SPW_CPU_KERNELS_BEGIN

namespace {
// ---- The per-row path (decode, small batches)
// Rows handled together so a tile of weight rows stays in cache while every
// token of the batch passes over it.
constexpr int64_t kRowTile = 16;
// Tokens computed per weight-row load (see dot_*_n).
constexpr int kTokGroup = 4;
// Below this many multiply-adds (~tens of microseconds) waking a worker costs
// more than it saves.
constexpr int64_t kMinParallelWork = 1 << 18;

// ---- The GEMM path (prefill)
// From kGemmMinTokens tokens on, the output [tokens][rows] is cut into blocks
// of kGemmRowBlock rows x kGemmTokBlock tokens. Blocks are the parallel work
// items, so threads split both dimensions; a block's weight rows and token
// rows stay in L2 while its register tiles run. A register tile is R rows x
// T tokens (tile_* below): each weight vector is loaded once for T tokens and
// each activation vector once for R rows, instead of once per dot product.
// Each (row, token) of a tile keeps its own accumulators and performs exactly
// the operations of the one-token kernel (same k order, same lanes, same
// final reduction), so the GEMM is bitwise the per-token path for any tile
// position, block size, batch size or thread count (kernels_test checks this
// for every type). Rows and tokens that do not fill a tile go through the
// per-row kernels.
constexpr int64_t kGemmMinTokens = 8;
constexpr int64_t kGemmRowBlock = 48;  // a multiple of every tile's R
constexpr int64_t kGemmTokBlock = 48;  // a multiple of every tile's T (even: Q8_0 token pairs)

// Rows r0..r1 against tokens t0..t1 through the per-row kernels:
// dot(r, t, nt, out) for row r against tokens t..t+nt-1 (nt is 1 or kTokGroup).
template <typename Dot>
void matmul_rows(int64_t r0, int64_t r1, int64_t t0, int64_t t1, int64_t n_rows, float* y, Dot dot) {
  float out[kTokGroup];
  for (int64_t rt = r0; rt < r1; rt += kRowTile) {
    const int64_t re = std::min(r1, rt + kRowTile);
    int64_t t = t0;
    for (; t + kTokGroup <= t1; t += kTokGroup) {
      for (int64_t r = rt; r < re; ++r) {
        dot(r, t, kTokGroup, out);
        for (int k = 0; k < kTokGroup; ++k) y[(t + k) * n_rows + r] = out[k];
      }
    }
    for (; t < t1; ++t)
      for (int64_t r = rt; r < re; ++r) {
        dot(r, t, 1, out);
        y[t * n_rows + r] = out[0];
      }
  }
}

// One GEMM block: tile(r, t, yt) computes rows r..r+R-1 against tokens
// t..t+T-1 into yt[j * n_rows + i] (yt = y + t * n_rows + r); the edges go
// through dot. Tokens are the outer loop: a tile's T activation rows stay in
// L1 while the block's weight rows stream past them from L2 (measured faster
// than rows outer for both the 2048 x 768 and the 768 x 2048 shapes).
template <int R, int T, typename Tile, typename Dot>
void gemm_block(int64_t r0, int64_t r1, int64_t t0, int64_t t1, int64_t n_rows, float* y, Tile tile, Dot dot) {
  static_assert(kGemmRowBlock % R == 0 && kGemmTokBlock % T == 0, "blocks must hold whole tiles");
  const int64_t rf = r0 + (r1 - r0) / R * R;  // the rows in whole tiles
  int64_t t = t0;
  for (; t + T <= t1; t += T)
    for (int64_t r = r0; r < rf; r += R) tile(r, t, y + t * n_rows + r);
  if (t < t1) matmul_rows(r0, rf, t, t1, n_rows, y, dot);
  if (rf < r1) matmul_rows(rf, r1, t0, t1, n_rows, y, dot);
}

// A tile from the multi-token kernel, row by row: dot(r + i, t, T, ...) for
// i < R, stored as gemm_block's tiles are (T is kTokGroup).
template <int R, int T, typename Dot>
void rows_tile(int64_t r, int64_t t, float* yt, int64_t ldy, Dot dot) {
  float out[T];
  for (int i = 0; i < R; ++i) {
    dot(r + i, t, T, out);
    for (int j = 0; j < T; ++j) yt[j * ldy + i] = out[j];
  }
}

#if defined(SPW_AVX512F)
// Pins a loaded vector in a register: without it GCC folds the activation
// load into every FMA that uses it (one load per FMA instead of one per tile
// column), and the tile becomes load-bound again.
inline __m512 in_reg(__m512 v) {
  asm("" : "+v"(v));
  return v;
}

// 4 x T tile of dot_f32_n / dot_f16_n (AVX-512): per (row, token) one
// accumulator in the one-token order, then per token the four rows'
// reductions side by side (reduce4_512, bitwise reduce512) stored as four
// consecutive outputs, then the scalar tail on them. 4 x 6 = 24 accumulators
// plus four weight vectors and one activation vector fill 29 of the 32 zmm
// registers: 2.4 FMAs per load (the two-accumulator order this replaced fit
// only 4 x 3, 1.7 per load; kernels_bench BM_Gemm F32 went from about 55%
// to about 83% of the core's FMA peak).
template <int T, typename WT>
void tile_float(const WT* const* w, const float* const* x, int64_t n, float* yt, int64_t ldy) {
  constexpr int R = 4;
  __m512 a[T][R];
  for (int j = 0; j < T; ++j)
    for (int i = 0; i < R; ++i) a[j][i] = _mm512_setzero_ps();
  int64_t i0 = 0;
  for (; i0 + 16 <= n; i0 += 16) {
    __m512 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = in_reg(load16(w[i] + i0));
    for (int j = 0; j < T; ++j) {
      const __m512 xv = in_reg(_mm512_loadu_ps(x[j] + i0));
      for (int i = 0; i < R; ++i) a[j][i] = _mm512_fmadd_ps(wv[i], xv, a[j][i]);
    }
  }
  for (int j = 0; j < T; ++j) reduce_x4(a[j], yt + j * ldy);
  for (int64_t k = i0; k < n; ++k)
    for (int i = 0; i < R; ++i) {
      const float wk = scalar_w(w[i] + k);
      for (int j = 0; j < T; ++j) yt[j * ldy + i] = madd(wk, x[j][k], yt[j * ldy + i]);
    }
}
constexpr int kFloatGemmRows = 4;
constexpr int kFloatGemmToks = 6;
#elif defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C)
inline __m256 in_reg(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

// 2 x 3 tile of dot_f32_n / dot_f16_n (AVX2): each (row, token) keeps the
// one-token kernel's two accumulators (elements 16k..16k+7 in the first,
// 16k+8..16k+15 in the second, a last 8 in the first), then hsum256 of
// their sum and the scalar tail, exactly dot_*_n<1>'s sequence. 12
// accumulators, two weight vectors and one activation vector fill 15 of the
// 16 ymm registers: 12 FMAs per 10 loads where the per-row kernel over four
// tokens did 8 per 10 (kernels_bench BM_Gemm, docs/PERFORMANCE.md).
template <int T, typename WT>
void tile_float(const WT* const* w, const float* const* x, int64_t n, float* yt, int64_t ldy) {
  constexpr int R = 2;
  __m256 a[2][T][R];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < T; ++j)
      for (int i = 0; i < R; ++i) a[h][j][i] = _mm256_setzero_ps();
  auto step = [&](int h, int64_t k) {
    __m256 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = in_reg(load8(w[i] + k));
    for (int j = 0; j < T; ++j) {
      const __m256 xv = in_reg(_mm256_loadu_ps(x[j] + k));
      for (int i = 0; i < R; ++i) a[h][j][i] = _mm256_fmadd_ps(wv[i], xv, a[h][j][i]);
    }
  };
  int64_t i0 = 0;
  for (; i0 + 16 <= n; i0 += 16) {
    step(0, i0);
    step(1, i0 + 8);
  }
  if (i0 + 8 <= n) {
    step(0, i0);
    i0 += 8;
  }
  for (int j = 0; j < T; ++j)
    for (int i = 0; i < R; ++i) yt[j * ldy + i] = hsum256(_mm256_add_ps(a[0][j][i], a[1][j][i]));
  for (int64_t k = i0; k < n; ++k)
    for (int i = 0; i < R; ++i) {
      const float wk = scalar_w(w[i] + k);
      for (int j = 0; j < T; ++j) yt[j * ldy + i] = madd(wk, x[j][k], yt[j * ldy + i]);
    }
}
#define SPW_FLOAT_TILE_AVX2 1
constexpr int kFloatGemmRows = 2;
constexpr int kFloatGemmToks = 3;
#else
constexpr int kFloatGemmRows = 4;         // rows_tile
constexpr int kFloatGemmToks = kTokGroup;
#endif
constexpr int kFloatTileRows = 4;  // the quantised types' rows_tile

#if defined(SPW_GEMM_Q8_0_VNNI512)  // simd.h
// R rows x TP token pairs of dot_q8_0_n (AVX-512 VNNI). A zmm register holds
// one row's 8-lane accumulator for two tokens (low half token t, high half
// t + 1), so every lane runs the one-token kernel's sequence:
//   lane = fma(d_w * d_x, float(i_lane), lane),  i_lane = sum of 4 products,
// then hsum256 per half. The integer lanes are exact either way; here they
// come from unsigned x + 128 (prepared once, `xu`: per pair and block 32 bytes
// of token t then 32 of token t + 1) times signed w, started from
// -128 * sum(w) so the offset cancels: one vpdpbusd per row and token pair.
// `xd` holds each pair's block scales as 8 + 8 lanes (prepared once too).
template <int R, int TP>
void tile_q8_0(const BlockQ8_0* const* w, const uint8_t* xu, const float* xd, int64_t pair_stride, int64_t nb,
               float* yt, int64_t ldy) {
  __m512 acc[R][TP];
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < TP; ++p) acc[i][p] = _mm512_setzero_ps();
  const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    __m512 xs[TP];  // d_x of token 2p in the low half, of 2p + 1 in the high half
    for (int p = 0; p < TP; ++p) xs[p] = _mm512_loadu_ps(xd + p * pair_stride / 4 + b * 16);
    for (int i = 0; i < R; ++i) {
      const __m512i wq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i][b].qs)));
      const __m512i neg =
          _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, wq));
      const __m512 dw = _mm512_set1_ps(fp16_to_fp32(w[i][b].d));
      for (int p = 0; p < TP; ++p) {
        const __m512i xv = _mm512_loadu_si512(xu + p * pair_stride + b * 64);
        const __m512i s32 = _mm512_dpbusd_epi32(neg, xv, wq);
        acc[i][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xs[p]), _mm512_cvtepi32_ps(s32), acc[i][p]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < TP; ++p) {
      yt[2 * p * ldy + i] = hsum256(_mm512_castps512_ps256(acc[i][p]));
      yt[(2 * p + 1) * ldy + i] = hsum256(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][p]), 1)));
    }
}
constexpr int kQ8TileRows = 4;
constexpr int kQ8TilePairs = 4;  // 16 accumulators
#endif
}  // namespace

namespace {
// A buffer of n trivially constructible T left uninitialised: exactly the
// n * sizeof(T) bytes a std::vector<T>(n) allocates (the estimator counts
// those), without the vector's zero fill, which prepare_x overwrites anyway
// (megabytes per matmul; the fill was 2% of a Q8_0 prefill in perf. The page
// faults of the fresh allocation remain, taken by the quantiser's first
// write instead).
template <typename T>
class Uninit {
 public:
  void resize(size_t n) {
    p_.reset(new T[n]);  // default-initialised: no fill for trivial T
    n_ = n;
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  size_t size() const { return n_; }

 private:
  std::unique_ptr<T[]> p_;
  size_t n_ = 0;
};

// Activations prepared once per matmul call, shared by every weight matrix of
// a fused call (they all pair with the same activation format): Q8_0 blocks and
// their float scales (Q8_0, Q4_0, Q5_0 weights), Q8_1 blocks with float d and s
// (Q4_1, Q5_1), or Q8_K blocks (K types); F32/F16 use the rows as they are.
// Low-bit kernels read the quantised rows through `arows` (built only when
// such a weight is in the call, so a Q8_0-only call allocates what it always
// did); the Q8_0 GEMM reads token pairs from `xu` (built only for GEMM-sized
// Q8_0 calls where the AVX-512 VNNI tile is compiled in). The estimator
// mirrors these sizes: admission/estimator.cpp.
struct PreparedX {
  std::vector<const float*> rows;
  Uninit<BlockQ8_0> q;
  Uninit<float> d;
  std::vector<const BlockQ8_0*> qrows;
  std::vector<const float*> drows;
  Uninit<gguf::BlockQ8_1> q1;
  Uninit<float> s;
  Uninit<gguf::BlockQ8_K> qk;
  std::vector<ActRow> arows;
  Uninit<uint8_t> xu;  // [n_tokens / 2][nb][64]: q + 128 of tokens 2p, 2p + 1
  Uninit<float> xs;    // [n_tokens / 2][nb][16]: their d, 8 lanes each
  int64_t nb = 0;
};

void prepare_x(ActFormat format, bool low_bit, bool q8_pairs, const float* x, int64_t n_tokens, int64_t n_cols,
               PreparedX& px) {
  px.rows.resize(static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) px.rows[static_cast<size_t>(t)] = x + t * n_cols;
  if (format == ActFormat::kFloat) return;
  assert(n_cols % act_block_elems(format) == 0);
  const int64_t nb = n_cols / act_block_elems(format);
  const auto total = static_cast<size_t>(nb * n_tokens);
  px.nb = nb;
  if (low_bit) px.arows.resize(static_cast<size_t>(n_tokens));
  switch (format) {
    case ActFormat::kQ8_0:
      px.q.resize(total);
      px.d.resize(total);
      px.qrows.resize(static_cast<size_t>(n_tokens));
      px.drows.resize(static_cast<size_t>(n_tokens));
      for (int64_t t = 0; t < n_tokens; ++t) {
        BlockQ8_0* qt = px.q.data() + t * nb;
        float* dt = px.d.data() + t * nb;
        quantize_act_row(format, x + t * n_cols, n_cols, qt, dt, nullptr);
        px.qrows[static_cast<size_t>(t)] = qt;
        px.drows[static_cast<size_t>(t)] = dt;
        if (low_bit) px.arows[static_cast<size_t>(t)] = {qt, dt, nullptr};
      }
      if (q8_pairs) {
        px.xu.resize(static_cast<size_t>(n_tokens / 2 * nb * 64));
        px.xs.resize(static_cast<size_t>(n_tokens / 2 * nb * 16));
        for (int64_t p = 0; p < n_tokens / 2; ++p)
          for (int64_t b = 0; b < nb; ++b) {
            float* ds = px.xs.data() + (p * nb + b) * 16;
            std::fill(ds, ds + 8, px.d[static_cast<size_t>(2 * p * nb + b)]);
            std::fill(ds + 8, ds + 16, px.d[static_cast<size_t>((2 * p + 1) * nb + b)]);
            uint8_t* dst = px.xu.data() + (p * nb + b) * 64;
            const int8_t* q0 = px.q[static_cast<size_t>(2 * p * nb + b)].qs;
            const int8_t* q1 = px.q[static_cast<size_t>((2 * p + 1) * nb + b)].qs;
            for (int j = 0; j < 32; ++j) {
              dst[j] = static_cast<uint8_t>(q0[j] ^ static_cast<int8_t>(0x80));
              dst[32 + j] = static_cast<uint8_t>(q1[j] ^ static_cast<int8_t>(0x80));
            }
          }
      }
      break;
    case ActFormat::kQ8_1:
      px.q1.resize(total);
      px.d.resize(total);
      px.s.resize(total);
      for (int64_t t = 0; t < n_tokens; ++t) {
        gguf::BlockQ8_1* qt = px.q1.data() + t * nb;
        float* dt = px.d.data() + t * nb;
        float* st = px.s.data() + t * nb;
        quantize_act_row(format, x + t * n_cols, n_cols, qt, dt, st);
        px.arows[static_cast<size_t>(t)] = {qt, dt, st};
      }
      break;
    case ActFormat::kQ8_K:
      px.qk.resize(total);
      for (int64_t t = 0; t < n_tokens; ++t) {
        gguf::BlockQ8_K* qt = px.qk.data() + t * nb;
        quantize_act_row(format, x + t * n_cols, n_cols, qt, nullptr, nullptr);
        px.arows[static_cast<size_t>(t)] = {qt, nullptr, nullptr};
      }
      break;
    default:
      break;
  }
}

// An F32 (WT float) or F16 (uint16_t) GEMM block: the register tiles with
// AVX-512, else each tile's rows through the multi-token kernel (dot).
template <typename WT, typename Row, typename Dot>
void float_gemm(const PreparedX& px, int64_t r0, int64_t r1, int64_t t0, int64_t t1, int64_t n_rows, int64_t n_cols,
                float* y, Row row, Dot dot) {
  gemm_block<kFloatGemmRows, kFloatGemmToks>(r0, r1, t0, t1, n_rows, y, [&](int64_t r, int64_t t, float* yt) {
#if defined(SPW_AVX512F) || defined(SPW_FLOAT_TILE_AVX2)
    const WT* wr[kFloatGemmRows];
    for (int i = 0; i < kFloatGemmRows; ++i) wr[i] = reinterpret_cast<const WT*>(row(r + i));
    tile_float<kFloatGemmToks>(wr, &px.rows[static_cast<size_t>(t)], n_cols, yt, n_rows);
#else
    (void)px;
    (void)n_cols;
    (void)row;
    rows_tile<kFloatGemmRows, kFloatGemmToks>(r, t, yt, n_rows, dot);
#endif
  }, dot);
}

// Rows r0..r1 x tokens t0..t1 of w: register tiles when `gemm`, else the
// per-row kernels.
void run_block(const WeightMatrix& w, const PreparedX& px, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
               bool gemm, float* y) {
  const int64_t n_rows = w.n_rows;
  const int64_t n_cols = w.n_cols;
  auto row = [&](int64_t r) { return w.data + static_cast<size_t>(r) * w.row_bytes; };
  switch (w.type) {
    case gguf::GgmlType::kF32: {
      auto dot = [&](int64_t r, int64_t t, int nt, float* out) {
        const float* wr = reinterpret_cast<const float*>(row(r));
        if (nt == kTokGroup) dot_f32_n<kTokGroup>(wr, &px.rows[static_cast<size_t>(t)], n_cols, out);
        else dot_f32_n<1>(wr, &px.rows[static_cast<size_t>(t)], n_cols, out);
      };
#if defined(SPW_AVX512F)
      // One token (decode's matvec): eight weight rows at a time, each with
      // dot_f32's one accumulator (the activation is loaded once for the
      // eight; the product commutes). One row after another would leave each
      // FMA waiting on the previous one; eight streams also keep more cache
      // misses in flight (the 32000 x 768 output head: 1.2x four rows, 1.4x
      // one row). F16 keeps the row-by-row loop, which measured faster for
      // weights streamed from memory (more streams than the prefetchers follow).
      if (!gemm && t1 - t0 == 1) {
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8) {
          const float* wr[8];
          for (int i = 0; i < 8; ++i) wr[i] = reinterpret_cast<const float*>(row(r + i));
          dot_xn<8>(px.rows[static_cast<size_t>(t0)], wr, n_cols, y + t0 * n_rows + r);
        }
        return matmul_rows(r, r1, t0, t1, n_rows, y, dot);
      }
#endif
      if (!gemm) return matmul_rows(r0, r1, t0, t1, n_rows, y, dot);
      return float_gemm<float>(px, r0, r1, t0, t1, n_rows, n_cols, y, row, dot);
    }
    case gguf::GgmlType::kF16: {
      auto dot = [&](int64_t r, int64_t t, int nt, float* out) {
        const uint16_t* wr = reinterpret_cast<const uint16_t*>(row(r));
        if (nt == kTokGroup) dot_f16_n<kTokGroup>(wr, &px.rows[static_cast<size_t>(t)], n_cols, out);
        else dot_f16_n<1>(wr, &px.rows[static_cast<size_t>(t)], n_cols, out);
      };
      if (!gemm) return matmul_rows(r0, r1, t0, t1, n_rows, y, dot);
      return float_gemm<uint16_t>(px, r0, r1, t0, t1, n_rows, n_cols, y, row, dot);
    }
    case gguf::GgmlType::kQ8_0: {
      auto dot = [&](int64_t r, int64_t t, int nt, float* out) {
        const BlockQ8_0* wr = reinterpret_cast<const BlockQ8_0*>(row(r));
        const auto ti = static_cast<size_t>(t);
        if (nt == kTokGroup) dot_q8_0_n<kTokGroup>(wr, &px.qrows[ti], &px.drows[ti], px.nb, out);
        else dot_q8_0_n<1>(wr, &px.qrows[ti], &px.drows[ti], px.nb, out);
      };
      if (!gemm) return matmul_rows(r0, r1, t0, t1, n_rows, y, dot);
#if defined(SPW_GEMM_Q8_0_VNNI512)
      constexpr int R = kQ8TileRows, TP = kQ8TilePairs;
      const int64_t pair_stride = px.nb * 64;
      gemm_block<R, 2 * TP>(r0, r1, t0, t1, n_rows, y, [&](int64_t r, int64_t t, float* yt) {
        const BlockQ8_0* wr[R];
        for (int i = 0; i < R; ++i) wr[i] = reinterpret_cast<const BlockQ8_0*>(row(r + i));
        tile_q8_0<R, TP>(wr, px.xu.data() + (t / 2) * pair_stride, px.xs.data() + (t / 2) * pair_stride / 4,
                         pair_stride, px.nb, yt, n_rows);
      }, dot);
#else
      gemm_block<kFloatTileRows, kTokGroup>(r0, r1, t0, t1, n_rows, y, [&](int64_t r, int64_t t, float* yt) {
        rows_tile<kFloatTileRows, kTokGroup>(r, t, yt, n_rows, dot);
      }, dot);
#endif
      return;
    }
    default: {
      const QuantDot* qd = quant_dot(w.type);
      assert(qd != nullptr && "unsupported type");
      static_assert(kTokGroup == 4, "QuantDot::four is the token-group kernel");
      auto dot = [&](int64_t r, int64_t t, int nt, float* out) {
        (nt == kTokGroup ? qd->four : qd->one)(row(r), &px.arows[static_cast<size_t>(t)], n_cols, out);
      };
      // Low-bit types: GEMM blocks (cache locality, both dimensions split)
      // around the multi-token kernel.
      if (!gemm) return matmul_rows(r0, r1, t0, t1, n_rows, y, dot);
      gemm_block<kFloatTileRows, kTokGroup>(r0, r1, t0, t1, n_rows, y, [&](int64_t r, int64_t t, float* yt) {
        rows_tile<kFloatTileRows, kTokGroup>(r, t, yt, n_rows, dot);
      }, dot);
    }
  }
}
}  // namespace

void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  const MatmulOut one{&w, y};
  matmul_fused(&one, 1, x, n_tokens, pool);
}

void matmul_fused(const MatmulOut* outs, int n_outs, const float* x, int64_t n_tokens, ThreadPool* pool) {
  if (n_outs <= 0) return;
  const WeightMatrix& w0 = *outs[0].w;
  const ActFormat format = act_format(w0.type);
  bool low_bit = false;  // a weight read through PreparedX::arows
  bool has_q8_0 = false;
  for (int i = 0; i < n_outs; ++i) {
    const gguf::GgmlType t = outs[i].w->type;
    if (act_format(t) != format || outs[i].w->n_cols != w0.n_cols) {
      // Different activation formats or widths cannot share prepared
      // activations: run separately (each result is the same either way).
      for (int j = 0; j < n_outs; ++j) matmul_fused(&outs[j], 1, x, n_tokens, pool);
      return;
    }
    low_bit |= format != ActFormat::kFloat && t != gguf::GgmlType::kQ8_0;
    has_q8_0 |= t == gguf::GgmlType::kQ8_0;
  }
  const bool gemm = n_tokens >= kGemmMinTokens;
#if defined(SPW_GEMM_Q8_0_VNNI512)
  const bool q8_pairs = gemm && has_q8_0;
#else
  const bool q8_pairs = false;
  (void)has_q8_0;  // only the VNNI tile keeps token pairs
#endif
  PreparedX px;
  prepare_x(format, low_bit, q8_pairs, x, n_tokens, w0.n_cols, px);
  // Work units concatenated over the matrices: per-row path, kRowTile rows
  // each (chunk boundaries never split a tile); GEMM path, one block of
  // kGemmRowBlock rows x kGemmTokBlock tokens each (token blocks inner, so a
  // chunk of consecutive units reuses its weight rows from cache).
  const int64_t row_unit = gemm ? kGemmRowBlock : kRowTile;
  const int64_t tok_blocks = gemm ? (n_tokens + kGemmTokBlock - 1) / kGemmTokBlock : 1;
  const int64_t tok_unit = gemm ? kGemmTokBlock : n_tokens;
  std::vector<int64_t> unit_begin(static_cast<size_t>(n_outs) + 1, 0);
  int64_t work = 0;
  for (int i = 0; i < n_outs; ++i) {
    unit_begin[static_cast<size_t>(i) + 1] =
        unit_begin[static_cast<size_t>(i)] + (outs[i].w->n_rows + row_unit - 1) / row_unit * tok_blocks;
    work += outs[i].w->n_rows * outs[i].w->n_cols * n_tokens;
  }
  auto body = [&](int64_t u0, int64_t u1) {
    for (int i = 0; i < n_outs; ++i) {
      const int64_t b = std::max(u0, unit_begin[static_cast<size_t>(i)]);
      const int64_t e = std::min(u1, unit_begin[static_cast<size_t>(i) + 1]);
      if (b >= e) continue;
      const int64_t base = unit_begin[static_cast<size_t>(i)];
      const WeightMatrix& w = *outs[i].w;
      if (!gemm) {
        run_block(w, px, (b - base) * kRowTile, std::min(w.n_rows, (e - base) * kRowTile), 0, n_tokens, false,
                  outs[i].y);
        continue;
      }
      for (int64_t u = b - base; u < e - base; ++u) {
        const int64_t rb = u / tok_blocks, tb = u % tok_blocks;
        run_block(w, px, rb * row_unit, std::min(w.n_rows, (rb + 1) * row_unit), tb * tok_unit,
                  std::min(n_tokens, (tb + 1) * tok_unit), true, outs[i].y);
      }
    }
  };
  const int64_t n_units = unit_begin[static_cast<size_t>(n_outs)];
  if (pool != nullptr && pool->n_threads() > 1 && work >= kMinParallelWork) {
    pool->parallel_for(n_units, body);
  } else {
    body(0, n_units);
  }
}

SPW_CPU_KERNELS_END
