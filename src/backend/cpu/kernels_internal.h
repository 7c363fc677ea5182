// The CPU kernel sources' shared internals: the scalar and SIMD helpers
// (madd, the horizontal sums, the F32/F16 loads) and the multi-token dot
// kernels (dot_*_n, dot_xn) that kernels.cpp's entry points and attention
// helpers and gemm.cpp's per-row and GEMM paths all run, so that every path
// performs one operation sequence per (row, token). Private to backend/cpu's
// kernel sources; not a kernel header (kernel_table.h lists none of this).
//
// Included with a source's other #includes: its definitions open their own
// SPW_CPU_KERNELS_BEGIN / END (simd.h), so they are compiled for the
// including variant's ISA and inside its namespace, as the source's own
// kernels are. All static: each source has its own copy, as when they were
// kernels.cpp's alone (a unity build's batch shares one, #pragma once).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"

SPW_CPU_KERNELS_BEGIN

// a * b + c with one rounding where the target has FMA (as the AVX-512 path's
// vfmadd), two otherwise: spelled out rather than left to the compiler's
// contraction, which -O1 (the sanitizer builds) does not do. The scalar
// paths use it too: std::fma on a CPU without FMA is a library call per
// element (software on the CPUs the baseline variant is for), which made
// the baseline's F32 GEMM ~90x slower than the AVX2 one where a multiply and
// an add cost two instructions.
static inline float madd(float a, float b, float c) {
#if defined(SPW_FMA)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

#if defined(SPW_AVX2)
static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

// Integer helpers of the quantised dot products (here and quant_dot.cpp).
static inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// u8 x s8 products summed in groups of four into int32 lanes. Exact where
// each u8*s8 pair sum stays below 2^15, as for every caller: at most
// 2 * 128 * 127 (Q8_0's |w| against activation codes), 2 * 63 * 127 for
// the K types' codes.
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(SPW_AVX512VNNI) && defined(SPW_AVX512VL)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

#if defined(SPW_AVX512F)
// The F32/F16 dot order with AVX-512: one 16-lane accumulator per (weight
// row, activation row), a fused multiply-add per 16 elements in k order, then
// this reduction (the two 256-bit halves added, hsum256), then the scalar tail.
// One accumulator rather than two interleaved ones is what lets a GEMM tile
// hold 24 (row, token) pairs in registers (4 x 6); a one-token matvec gets its
// independent chains from rows side by side instead.
static inline float reduce512(__m512 a) {
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(a),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
}
#endif

// Multi-token dot products: one weight row against NT activation rows. The
// weight row is loaded once per chunk; every token's accumulation is exactly
// the sequence of operations the NT = 1 instantiation performs, so batching
// never changes a result bit (the batch-invariance contract).

// xd: per-block float scales of the quantised activations (fp16 -> fp32 done once).
// Two orders (KernelTraits::q8_0_x16): with the kQ8_0x16 kernels (AVX-512
// VNNI) the block order, per block the exact integer dot and then
// acc = fma(float(i), d_w * d_x, acc), which is what those kernels do per
// (row, token) and what the scalar kernels do; otherwise the lane order,
// block b's eight partial sums into eight lanes, reduced at the end.
template <int NT>
static void dot_q8_0_n(const BlockQ8_0* w, const BlockQ8_0* const* x, const float* const* xd, int64_t nb,
                       float* out) {
#if defined(SPW_AVX2) && defined(SPW_FMA)
  // Block b's eight exact lane sums per token, then the variant's float step:
  // the block order sums the lanes as integers first (matrices that are not
  // packed, rows not a multiple of 16, and dot_q8_0), the lane order keeps
  // them in eight float lanes reduced at the end.
#if defined(SPW_Q8_0_X16)
  float acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#else
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
#endif
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    // |w| as unsigned, sign of w moved onto x, so the u8*s8 multiply-add is exact.
    const __m256i aw = _mm256_sign_epi8(qw, qw);
    const float dw = fp16_to_fp32(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs));
      const __m256i s32 = dot_u8s8(aw, _mm256_sign_epi8(qx, qw));
#if defined(SPW_Q8_0_X16)
      acc[t] = madd(static_cast<float>(hsum_i32(s32)), dw * xd[t][b], acc[t]);
#else
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[t][b]), _mm256_cvtepi32_ps(s32), acc[t]);
#endif
    }
  }
#if defined(SPW_Q8_0_X16)
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
#else
  for (int t = 0; t < NT; ++t) out[t] = hsum256(acc[t]);
#endif
#else
  float sum[NT];
  for (int t = 0; t < NT; ++t) sum[t] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = fp16_to_fp32(w[b].d);
    for (int t = 0; t < NT; ++t) {
      int32_t si = 0;
      for (int j = 0; j < 32; ++j) si += static_cast<int32_t>(w[b].qs[j]) * static_cast<int32_t>(x[t][b].qs[j]);
      sum[t] = madd(static_cast<float>(si), dw * xd[t][b], sum[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
#endif
}

#if defined(SPW_AVX2) && defined(SPW_FMA) && !defined(SPW_Q8_0_X16)
// R weight rows against one activation row, each row's operations exactly
// dot_q8_0_n<1>'s (its lane-order accumulator, the same products in block
// order), so a row's result does not depend on the rows beside it. A decode
// matvec gets R independent FMA chains and R weight streams in flight, and
// loads each activation block once for the R rows.
template <int R>
static void dot_q8_0_rows(const BlockQ8_0* const* w, const BlockQ8_0* x, const float* xd, int64_t nb, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const float dx = xd[b];
    for (int r = 0; r < R; ++r) {
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][b].qs));
      const __m256i s32 = dot_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(w[r][b].d) * dx), _mm256_cvtepi32_ps(s32), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum256(acc[r]);
}
#endif

// Loads of F32 values, or of F16 values converted to F32 (exact): what lets
// one kernel read F32 rows and an F16 KV cache's rows in place.
static inline float scalar_w(const float* p) { return *p; }
static inline float scalar_w(const uint16_t* p) { return fp16_to_fp32(*p); }

#if defined(SPW_AVX2)
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t* p) {
#if defined(SPW_F16C)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  return _mm256_setr_ps(fp16_to_fp32(p[0]), fp16_to_fp32(p[1]), fp16_to_fp32(p[2]), fp16_to_fp32(p[3]),
                        fp16_to_fp32(p[4]), fp16_to_fp32(p[5]), fp16_to_fp32(p[6]), fp16_to_fp32(p[7]));
#endif
}
#endif

#if defined(SPW_AVX512F)
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

// x: F32 activation rows, or F16 rows (XT uint16_t: the F16 KV cache's K
// rows against a query, converted as they load, which gives bitwise the F32
// kernel's result on the converted rows).
template <int NT, typename XT = float>
static void dot_f32_n(const float* w, const XT* const* x, int64_t n, float* out) {
  int64_t i0 = 0;
#if defined(SPW_AVX512F)
  __m512 a[NT];
  for (int t = 0; t < NT; ++t) a[t] = _mm512_setzero_ps();
  for (; i0 + 16 <= n; i0 += 16) {
    const __m512 wv = _mm512_loadu_ps(w + i0);
    for (int t = 0; t < NT; ++t) a[t] = _mm512_fmadd_ps(wv, load16(x[t] + i0), a[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce512(a[t]);
#elif defined(SPW_AVX2) && defined(SPW_FMA)
  __m256 a0[NT], a1[NT];
  for (int t = 0; t < NT; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  for (; i0 + 16 <= n; i0 += 16) {
    const __m256 w0 = _mm256_loadu_ps(w + i0), w1 = _mm256_loadu_ps(w + i0 + 8);
    for (int t = 0; t < NT; ++t) {
      a0[t] = _mm256_fmadd_ps(w0, load8(x[t] + i0), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, load8(x[t] + i0 + 8), a1[t]);
    }
  }
  if (i0 + 8 <= n) {
    const __m256 w0 = _mm256_loadu_ps(w + i0);
    for (int t = 0; t < NT; ++t) a0[t] = _mm256_fmadd_ps(w0, load8(x[t] + i0), a0[t]);
    i0 += 8;
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum256(_mm256_add_ps(a0[t], a1[t]));
#else
  float acc[NT][8];
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 8; ++j) acc[t][j] = 0.0f;
  for (; i0 + 8 <= n; i0 += 8)
    for (int t = 0; t < NT; ++t)
      for (int j = 0; j < 8; ++j) acc[t][j] = madd(w[i0 + j], scalar_w(x[t] + i0 + j), acc[t][j]);
  for (int t = 0; t < NT; ++t) {
    const float* a = acc[t];
    out[t] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
#endif
  for (int64_t i = i0; i < n; ++i)
    for (int t = 0; t < NT; ++t) out[t] = madd(w[i], scalar_w(x[t] + i), out[t]);
}

template <int NT>
static void dot_f16_n(const uint16_t* w, const float* const* x, int64_t n, float* out) {
  int64_t i0 = 0;
#if defined(SPW_AVX512F)
  __m512 a[NT];
  for (int t = 0; t < NT; ++t) a[t] = _mm512_setzero_ps();
  for (; i0 + 16 <= n; i0 += 16) {
    const __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i0)));
    for (int t = 0; t < NT; ++t) a[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[t] + i0), a[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce512(a[t]);
#elif defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C)
  __m256 a0[NT], a1[NT];
  for (int t = 0; t < NT; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  for (; i0 + 16 <= n; i0 += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i0)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i0 + 8)));
    for (int t = 0; t < NT; ++t) {
      a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i0), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[t] + i0 + 8), a1[t]);
    }
  }
  if (i0 + 8 <= n) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i0)));
    for (int t = 0; t < NT; ++t) a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[t] + i0), a0[t]);
    i0 += 8;
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum256(_mm256_add_ps(a0[t], a1[t]));
#else
  float acc[NT][8];
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 8; ++j) acc[t][j] = 0.0f;
  for (; i0 + 8 <= n; i0 += 8)
    for (int j = 0; j < 8; ++j) {
      const float wv = fp16_to_fp32(w[i0 + j]);
      for (int t = 0; t < NT; ++t) acc[t][j] = madd(wv, x[t][i0 + j], acc[t][j]);
    }
  for (int t = 0; t < NT; ++t) {
    const float* a = acc[t];
    out[t] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
#endif
  for (int64_t i = i0; i < n; ++i) {
    const float wv = fp16_to_fp32(w[i]);
    for (int t = 0; t < NT; ++t) out[t] = madd(wv, x[t][i], out[t]);
  }
}

// ---------------------------------------------------------------- rows side by side
// (kernels.cpp's attention helpers and gemm.cpp's decode matvec and tiles)

#if defined(SPW_AVX512F)
// reduce512 (the dot order's final reduction) of four accumulators side by
// side: every add is one of reduce512's adds on the same two operands (fp
// addition commutes), so each lane holds the one-token result bitwise.
// Returns the four sums in order.
static inline __m128 reduce4_512(const __m512* z) {
  // y_i = low 256 + high 256 of z_i, two per register.
  const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x44), _mm512_shuffle_f32x4(z[0], z[1], 0xEE));
  const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x44), _mm512_shuffle_f32x4(z[2], z[3], 0xEE));
  // hsum256: x = low 128 + high 128 (z_i's in 128-bit lane i), then
  // (x0 + x1) + (x2 + x3).
  const __m512 xs = _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88), _mm512_shuffle_f32x4(y01, y23, 0xDD));
  const __m512 s2 = _mm512_add_ps(xs, _mm512_movehdup_ps(xs));
  const __m512 r = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0x02));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), r));
}
// The same, stored: out[t] is bitwise what dot_f32 returns for row t.
static inline void reduce_x4(const __m512* a, float* out) { _mm_storeu_ps(out, reduce4_512(a)); }
#endif

// out[j] = dot_f32(x[j], w, n) bitwise for j < N (N a multiple of 4): w is
// loaded once for the N rows, whose accumulators are N independent chains.
template <int N, typename XT>
static void dot_xn(const float* w, const XT* const* x, int64_t n, float* out) {
  static_assert(N % 4 == 0, "rows in fours");
#if defined(SPW_AVX512F)
  // dot_f32_n<N>'s accumulation, then its reductions four at a time.
  __m512 a[N];
  for (int t = 0; t < N; ++t) a[t] = _mm512_setzero_ps();
  int64_t i0 = 0;
  for (; i0 + 16 <= n; i0 += 16) {
    const __m512 wv = _mm512_loadu_ps(w + i0);
    for (int t = 0; t < N; ++t) a[t] = _mm512_fmadd_ps(wv, load16(x[t] + i0), a[t]);
  }
  for (int t = 0; t < N; t += 4) reduce_x4(a + t, out + t);
  for (int64_t i = i0; i < n; ++i)
    for (int t = 0; t < N; ++t) out[t] = madd(w[i], scalar_w(x[t] + i), out[t]);
#else
  // dot_f32_n<4>'s steps (for F16 rows, dot_f16(x[t], w, n)'s sequence with
  // the product's operands swapped), w loaded once for four rows.
  for (int g = 0; g < N; g += 4) dot_f32_n<4>(w, x + g, n, out + g);
#endif
}

SPW_CPU_KERNELS_END
