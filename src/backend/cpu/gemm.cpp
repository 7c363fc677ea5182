// matmul and matmul_fused (kernels.h): the per-row path (decode, small
// batches) and the GEMM path (prefill): its blocks, the register tiles and
// the activations prepared once per call. Compiled once per kernel variant
// like kernels.cpp (simd.h); the dot kernels both paths replay are
// kernels_internal.h's, shared with kernels.cpp's entry points.
#include "backend/cpu/kernels.h"

#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/simd.h"
#include "gguf/quant_blocks.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
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
constexpr int64_t kGemmTokBlock = 48;  // a multiple of every tile's T (8 for packed Q8_0, 16 for AMX)

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

#if defined(SPW_Q8_0_X16)  // simd.h
// One kQ8_0x16 group (16 rows, packed_weights.h) against T tokens, into
// yt[j * ldy + i] for row i < 16 of the group and token j < T. Per block
// the group's 512 code bytes are eight zmm registers, each four codes of
// the 16 rows; one vpdpbusd per register and token multiplies them by that
// token's four codes broadcast and adds each row's four products into its
// own lane, so a row's block dot is its lane (exact: integers), started at
// -128 * sum(x) to undo the weights' +128. Then per token one lane-wise
// acc = fma(float(i), d_w * d_x, acc): every (row, token) performs the
// block order's steps (KernelTraits::q8_0_x16), whatever T, the tile's
// position or the thread count. Two integer chains per token (even and
// odd quads) halve the vpdpbusd latency the float step waits on.
// How far ahead a decode tile prefetches: 16 records (8.5 KiB). The packed
// matrix is one sequential stream, yet without it a 110M Q8_0 decode waited
// on the first load of each record (perf) and read ~9 GB/s on an Intel Xeon
// (Sapphire Rapids class); 4 records ahead gave 1.17x, 16 gave 1.2-1.35x,
// 32 and 64 no more (docs/PERFORMANCE.md). Past the matrix's end it reads
// nothing (a prefetch never faults).
constexpr int64_t kQ8x16PrefetchRecords = 16;

template <int T>
void tile_q8_0x16(const uint8_t* group, int64_t nb, const BlockQ8_0* const* xq, const float* const* xd,
                  const int32_t* const* xc, float* yt, int64_t ldy) {
  __m512 acc[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = group + b * static_cast<int64_t>(kQ8_0x16RecordBytes);
    if constexpr (T <= kTokGroup)  // decode: the weights stream once (a GEMM's stay in L2 for its tiles)
      for (int64_t l = 0; l < 9; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(rec + kQ8x16PrefetchRecords * kQ8_0x16RecordBytes + 64 * l),
                     _MM_HINT_T0);
    __m512i w[8];
    for (int kq = 0; kq < 8; ++kq) w[kq] = _mm512_loadu_si512(rec + 64 * kq);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQ8_0x16Scales)));
    for (int j = 0; j < T; ++j) {
      const int8_t* q = xq[j][b].qs;
      int32_t quad[8];
      std::memcpy(quad, q, 32);
      __m512i s0 = _mm512_set1_epi32(-xc[j][b]);
      __m512i s1 = _mm512_setzero_si512();
      for (int kq = 0; kq < 8; kq += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[kq], _mm512_set1_epi32(quad[kq]));
        s1 = _mm512_dpbusd_epi32(s1, w[kq + 1], _mm512_set1_epi32(quad[kq + 1]));
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b]));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[j]);
    }
  }
  for (int j = 0; j < T; ++j) _mm512_storeu_ps(yt + j * ldy, acc[j]);
}
// Tokens per GEMM tile: 8 accumulators, 8 weight registers and a token's
// two integer chains stay in registers, and each weight load serves 8 tokens.
constexpr int kQ8x16GemmToks = 8;

// One kQ4_Kx16 group (16 rows of Q4_K, packed_weights.h) against T tokens'
// Q8_K activations, into yt[j * ldy + i]. Per super-block and 64-element
// chunk the group's 512 code bytes give, masked and shifted, 16 registers of
// four codes of each row (low nibbles: sub-block 2c, high: 2c + 1); one
// vpdpbusd per register and token sums a row's four products in its lane,
// so each sub-block's dot is exact per row, then times its scale (vpmulld),
// and the mins term is sum_j m_j * (the token's two 16-element sums of
// sub-block j). The float steps are quant_dot.h's for Q4_K, lane-wise:
// acc = fma(float(i), d * d_x, acc); acc = fma(float(-k), dmin * d_x, acc),
// so a packed Q4_K matrix gives bitwise what quant_dot's kernels (and the
// scalar ones) give over the file layout, in every tile size.
template <int T>
void tile_q4_kx16(const uint8_t* group, int64_t nb, const ActRow* x, float* yt, int64_t ldy) {
  __m512 acc[T];
  for (int j = 0; j < T; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rec = group + b * static_cast<int64_t>(kQ4_Kx16RecordBytes);
    __m512i isum[T];
    for (int j = 0; j < T; ++j) isum[j] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i lo[8], hi[8];
      for (int kq = 0; kq < 8; ++kq) {
        const __m512i wv = _mm512_loadu_si512(rec + (c * 8 + kq) * 64);
        lo[kq] = _mm512_and_si512(wv, m4);
        hi[kq] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
      }
      const __m512i sl =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kQ4_KxScales + 32 * c)));
      const __m512i sh =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kQ4_KxScales + 32 * c + 16)));
      for (int j = 0; j < T; ++j) {
        int32_t quad[16];
        std::memcpy(quad, static_cast<const gguf::BlockQ8_K*>(x[j].blocks)[b].qs + 64 * c, 64);
        __m512i dl = _mm512_setzero_si512(), dh = _mm512_setzero_si512();
        for (int kq = 0; kq < 8; ++kq) {
          dl = _mm512_dpbusd_epi32(dl, lo[kq], _mm512_set1_epi32(quad[kq]));
          dh = _mm512_dpbusd_epi32(dh, hi[kq], _mm512_set1_epi32(quad[8 + kq]));
        }
        isum[j] = _mm512_add_epi32(isum[j], _mm512_add_epi32(_mm512_mullo_epi32(dl, sl), _mm512_mullo_epi32(dh, sh)));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQ4_KxD)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQ4_KxDmin)));
    __m512i mins[8];  // the record's, widened once for every token
    for (int s = 0; s < 8; ++s)
      mins[s] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kQ4_KxMins + 16 * s)));
    for (int j = 0; j < T; ++j) {
      const gguf::BlockQ8_K& xb = static_cast<const gguf::BlockQ8_K*>(x[j].blocks)[b];
      __m512i imin = _mm512_setzero_si512();
      for (int s = 0; s < 8; ++s)
        imin = _mm512_add_epi32(imin,
                                _mm512_mullo_epi32(mins[s], _mm512_set1_epi32(xb.bsums[2 * s] + xb.bsums[2 * s + 1])));
      const __m512 dx = _mm512_set1_ps(xb.d);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(d, dx), acc[j]);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), imin)),
                               _mm512_mul_ps(dmin, dx), acc[j]);
    }
  }
  for (int j = 0; j < T; ++j) _mm512_storeu_ps(yt + j * ldy, acc[j]);
}
#endif

#if defined(SPW_AMX_INT8)  // the x86-64-v4-amx variant (kernel_variant.h)
// AMX: the GEMM's integer part in tiles. A kQ8_0x16 record's 512 code bytes
// are, as they stand, a B operand of 8 rows x 64 bytes (four codes of each
// of 16 weight rows per tile row); one block of 16 tokens' activation codes
// is an A operand of 16 rows x 32 bytes, read in place from the quantised
// activations (stride: a token's blocks). tdpbsud (signed A, unsigned B)
// then gives every (token, row) the block's exact sum(x * (w + 128)), the
// integer the VNNI tile computes, and the float steps below are the VNNI
// tile's: so this variant's GEMM is bitwise its (and v4-vnni's) one-token
// path. K = 32 per instruction (a block; the scales change per block), so
// each block's sums go through memory for their float step.
//
// The tile configuration (palette 1), the same for every call: tiles 0-2 the
// int32 sums of 16 tokens x 16 rows of up to three groups (C), tile 3 the
// tokens' codes (A), tiles 4-6 the groups' records (B). Per thread: loaded
// on a thread's first AMX tile and kept (nothing else here configures tiles).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
void amx_configure() {
  thread_local bool configured = false;
  if (configured) return;
  AmxTileConfig c;
  for (int i = 0; i < 3; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
  }
  c.colsb[3] = 32;
  c.rows[3] = 16;
  for (int i = 4; i < 7; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 8;
  }
  _tile_loadconfig(&c);
  configured = true;
}

// 16 tokens (t..t+15; xq: token t's blocks, the next token's x_stride bytes
// on) x G groups (16G consecutive rows from `group`, gstride bytes apart).
template <int G>
void amx_tile_q8_0x16(const uint8_t* group, int64_t gstride, int64_t nb, const BlockQ8_0* xq, int64_t x_stride,
                      const float* const* xd, const int32_t* const* xc, float* yt, int64_t ldy) {
  constexpr int T = 16;
  alignas(64) int32_t sums[G][T][16];
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < T; ++j) acc[g][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t rec = b * static_cast<int64_t>(kQ8_0x16RecordBytes);
    _tile_loadd(3, xq[b].qs, x_stride);
    _tile_zero(0);
    _tile_loadd(4, group + rec, 64);
    _tile_dpbsud(0, 3, 4);
    if constexpr (G >= 2) {
      _tile_zero(1);
      _tile_loadd(5, group + gstride + rec, 64);
      _tile_dpbsud(1, 3, 5);
    }
    if constexpr (G >= 3) {
      _tile_zero(2);
      _tile_loadd(6, group + 2 * gstride + rec, 64);
      _tile_dpbsud(2, 3, 6);
    }
    _tile_stored(0, sums[0], 64);
    if constexpr (G >= 2) _tile_stored(1, sums[1], 64);
    if constexpr (G >= 3) _tile_stored(2, sums[2], 64);
    for (int g = 0; g < G; ++g) {
      const uint8_t* scales = group + g * gstride + rec + kQ8_0x16Scales;
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
      for (int j = 0; j < T; ++j) {
        const __m512i s = _mm512_sub_epi32(_mm512_load_si512(sums[g][j]), _mm512_set1_epi32(xc[j][b]));
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b]));
        acc[g][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[g][j]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < T; ++j) _mm512_storeu_ps(yt + j * ldy + 16 * g, acc[g][j]);
}
constexpr int kAmxToks = 16;
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
// did); the kQ8_0x16 kernels also read each block's 128 * sum(codes) from
// `c` (built for Q8_0 weights in the variants that have them). The
// estimator mirrors these sizes: admission/estimator.cpp.
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
  Uninit<int32_t> c;  // [n_tokens][nb]: 128 * sum of block b's codes
  std::vector<const int32_t*> crows;
  int64_t nb = 0;
};

void prepare_x(ActFormat format, bool low_bit, bool q8_sums, const float* x, int64_t n_tokens, int64_t n_cols,
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
      if (q8_sums) {
        px.c.resize(total);
        px.crows.resize(static_cast<size_t>(n_tokens));
      }
      for (int64_t t = 0; t < n_tokens; ++t) {
        BlockQ8_0* qt = px.q.data() + t * nb;
        float* dt = px.d.data() + t * nb;
        quantize_act_row(format, x + t * n_cols, n_cols, qt, dt, nullptr);
        px.qrows[static_cast<size_t>(t)] = qt;
        px.drows[static_cast<size_t>(t)] = dt;
        if (low_bit) px.arows[static_cast<size_t>(t)] = {qt, dt, nullptr};
        if (q8_sums) {
          int32_t* ct = px.c.data() + t * nb;
          for (int64_t b = 0; b < nb; ++b) {
            int32_t sum = 0;
            for (int j = 0; j < 32; ++j) sum += qt[b].qs[j];
            ct[b] = 128 * sum;
          }
          px.crows[static_cast<size_t>(t)] = ct;
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

#if defined(SPW_Q8_0_X16)
// Rows r0..r1 (whole groups: the per-row path's units and the GEMM's row
// blocks are multiples of 16) x tokens t0..t1 of a kQ8_0x16 matrix: tiles of
// kQ8x16GemmToks tokens in a GEMM block, of kTokGroup on the per-row path,
// then single tokens (the same steps per (row, token) in every tile size).
void q8_0x16_block(const WeightMatrix& w, const PreparedX& px, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                   bool gemm, float* y) {
  assert(r0 % kQ8_0x16Rows == 0 && r1 % kQ8_0x16Rows == 0);
  const int64_t nb = px.nb, n_rows = w.n_rows;
  const BlockQ8_0* const* xq = px.qrows.data();
  const float* const* xd = px.drows.data();
  const int32_t* const* xc = px.crows.data();
  int64_t t_amx = t0;  // tokens below this are done (AMX tiles)
#if defined(SPW_AMX_INT8)
  if (gemm && t1 - t0 >= kAmxToks) {
    amx_configure();
    const int64_t gstride = nb * static_cast<int64_t>(kQ8_0x16RecordBytes);
    const auto x_stride = static_cast<int64_t>(px.nb * sizeof(BlockQ8_0));
    for (; t_amx + kAmxToks <= t1; t_amx += kAmxToks) {
      const BlockQ8_0* xt = px.q.data() + t_amx * nb;
      float* yt = y + t_amx * n_rows;
      int64_t r = r0;
      for (; r + 3 * kQ8_0x16Rows <= r1; r += 3 * kQ8_0x16Rows)
        amx_tile_q8_0x16<3>(w.data + r / kQ8_0x16Rows * gstride, gstride, nb, xt, x_stride, xd + t_amx, xc + t_amx,
                            yt + r, n_rows);
      if (r + 2 * kQ8_0x16Rows <= r1) {
        amx_tile_q8_0x16<2>(w.data + r / kQ8_0x16Rows * gstride, gstride, nb, xt, x_stride, xd + t_amx, xc + t_amx,
                            yt + r, n_rows);
        r += 2 * kQ8_0x16Rows;
      }
      if (r < r1)
        amx_tile_q8_0x16<1>(w.data + r / kQ8_0x16Rows * gstride, gstride, nb, xt, x_stride, xd + t_amx, xc + t_amx,
                            yt + r, n_rows);
    }
  }
#endif
  for (int64_t r = r0; r < r1; r += kQ8_0x16Rows) {
    const uint8_t* group = w.data + static_cast<size_t>(r / kQ8_0x16Rows * nb) * kQ8_0x16RecordBytes;
    int64_t t = t_amx;
    if (gemm)
      for (; t + kQ8x16GemmToks <= t1; t += kQ8x16GemmToks)
        tile_q8_0x16<kQ8x16GemmToks>(group, nb, xq + t, xd + t, xc + t, y + t * n_rows + r, n_rows);
    for (; t + kTokGroup <= t1; t += kTokGroup)
      tile_q8_0x16<kTokGroup>(group, nb, xq + t, xd + t, xc + t, y + t * n_rows + r, n_rows);
    for (; t < t1; ++t) tile_q8_0x16<1>(group, nb, xq + t, xd + t, xc + t, y + t * n_rows + r, n_rows);
  }
}

// Rows r0..r1 (whole groups) x tokens t0..t1 of a kQ4_Kx16 matrix: tiles of
// kTokGroup tokens, then single tokens (the same steps per (row, token)).
void q4_kx16_block(const WeightMatrix& w, const PreparedX& px, int64_t r0, int64_t r1, int64_t t0, int64_t t1,
                   float* y) {
  assert(r0 % kQ8_0x16Rows == 0 && r1 % kQ8_0x16Rows == 0);
  const int64_t nb = px.nb, n_rows = w.n_rows;
  const ActRow* x = px.arows.data();
  for (int64_t r = r0; r < r1; r += kQ8_0x16Rows) {
    const uint8_t* group = w.data + static_cast<size_t>(r / kQ8_0x16Rows * nb) * kQ4_Kx16RecordBytes;
    int64_t t = t0;
    for (; t + kTokGroup <= t1; t += kTokGroup) tile_q4_kx16<kTokGroup>(group, nb, x + t, y + t * n_rows + r, n_rows);
    for (; t < t1; ++t) tile_q4_kx16<1>(group, nb, x + t, y + t * n_rows + r, n_rows);
  }
}
#endif

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
#if defined(SPW_Q8_0_X16)
      if (w.layout == WeightLayout::kQ8_0x16) return q8_0x16_block(w, px, r0, r1, t0, t1, gemm, y);
#endif
      assert(w.layout == WeightLayout::kGguf && "a packed matrix reached a variant without its kernels");
      auto dot = [&](int64_t r, int64_t t, int nt, float* out) {
        const BlockQ8_0* wr = reinterpret_cast<const BlockQ8_0*>(row(r));
        const auto ti = static_cast<size_t>(t);
        if (nt == kTokGroup) dot_q8_0_n<kTokGroup>(wr, &px.qrows[ti], &px.drows[ti], px.nb, out);
        else dot_q8_0_n<1>(wr, &px.qrows[ti], &px.drows[ti], px.nb, out);
      };
#if defined(SPW_AVX2) && defined(SPW_FMA) && !defined(SPW_Q8_0_X16)
      // One token (decode's matvec) on AVX2: two rows at a time, each with
      // dot_q8_0_n<1>'s operations (dot_q8_0_rows). Row by row, one chain of
      // dependent FMAs per row, trailed llama.cpp's decode by 4% at one
      // thread on an Intel Xeon; two rows gained 6-7% (110M, 1 and 2
      // threads), four lost 4-8% (PERFORMANCE.md).
      if (!gemm && t1 - t0 == 1) {
        const auto ti = static_cast<size_t>(t0);
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2) {
          const BlockQ8_0* wr[2];
          for (int i = 0; i < 2; ++i) wr[i] = reinterpret_cast<const BlockQ8_0*>(row(r + i));
          dot_q8_0_rows<2>(wr, px.qrows[ti], px.drows[ti], px.nb, y + t0 * n_rows + r);
        }
        return matmul_rows(r, r1, t0, t1, n_rows, y, dot);
      }
#endif
      if (!gemm) return matmul_rows(r0, r1, t0, t1, n_rows, y, dot);
      gemm_block<kFloatTileRows, kTokGroup>(r0, r1, t0, t1, n_rows, y, [&](int64_t r, int64_t t, float* yt) {
        rows_tile<kFloatTileRows, kTokGroup>(r, t, yt, n_rows, dot);
      }, dot);
      return;
    }
    default: {
#if defined(SPW_Q8_0_X16)
      if (w.layout == WeightLayout::kQ4_Kx16) return q4_kx16_block(w, px, r0, r1, t0, t1, y);
#endif
      assert(w.layout == WeightLayout::kGguf && "a packed matrix reached a variant without its kernels");
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
#if defined(SPW_Q8_0_X16)
  const bool q8_sums = has_q8_0;
#else
  const bool q8_sums = false;
  (void)has_q8_0;  // only the kQ8_0x16 kernels read the code sums
#endif
  PreparedX px;
  prepare_x(format, low_bit, q8_sums, x, n_tokens, w0.n_cols, px);
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
