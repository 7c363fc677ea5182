#include "backend/cpu/kernels.h"

#include "backend/cpu/attention.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/simd.h"
#include "gguf/fp16.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

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

// ---------------------------------------------------------------- fp16

// Scalar conversions are gguf/fp16.h's (the one portable implementation);
// F16C does the same rounding in one instruction where the CPU has it.
float fp16_to_fp32(uint16_t h) {
#if defined(SPW_F16C)
  return _cvtsh_ss(h);
#else
  return gguf::fp16_to_fp32(h);
#endif
}

uint16_t fp32_to_fp16(float f) {
#if defined(SPW_F16C)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return gguf::fp32_to_fp16(f);
#endif
}

// ---------------------------------------------------------------- Q8_0

// Activations are quantised exactly as ggml quantises weights (gguf/quant.h),
// which is what makes our Q8_0 dot products llama.cpp's.
// The AVX-512 path repeats gguf's operations exactly: amax by fmax (NaN
// inputs ignored, as std::fmax does), d = amax / 127, id = 1 / d, fp16 of d
// by gguf's converter, q = roundf(x * id) with roundf (half away from zero)
// as trunc(v) + (|v - trunc(v)| >= 0.5 ? sign(v) : 0), exact because
// v - trunc(v) is exact. kernels_test compares it with gguf bitwise,
// halfway cases included.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  assert(n % 32 == 0);
#if defined(SPW_AVX512F)
  const __m512 zero = _mm512_setzero_ps();
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign_bit = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    // max(NaN, 0) is 0 (the second operand), so NaNs drop out here as in fmax.
    const __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), zero), _mm512_max_ps(_mm512_abs_ps(x1), zero));
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = gguf::fp32_to_fp16(d);
    const __m512 idv = _mm512_set1_ps(id);
    for (int h = 0; h < 2; ++h) {
      const __m512 v = _mm512_mul_ps(h == 0 ? x0 : x1, idv);
      const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
      const __mmask16 up = _mm512_cmp_ps_mask(frac, half, _CMP_GE_OQ);
      const __m512 step = _mm512_or_ps(one, _mm512_and_ps(v, sign_bit));  // +-1 with v's sign
      const __m512 r = _mm512_mask_add_ps(t, up, t, step);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
    }
  }
#elif defined(SPW_AVX2)
  // The same operations on four 8-lane vectors a block. Decode quantises
  // every matmul's activation row: a 2048-wide row took 13.5 us in the
  // scalar code and takes 0.8 us here (Zen 3), against ~13 us for a
  // 64 KiB matrix's dot products.
  const __m256 zero = _mm256_setzero_ps();
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // packs_epi32 then packs_epi16 interleave the four vectors' 4-lane groups
  // per 128-bit half; this puts the 32 bytes back in element order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b) {
    __m256 v[4];
    __m256 m = zero;
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      // max(NaN, 0) is 0 (the second operand): NaNs drop out as in fmax.
      m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[i]), zero));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = gguf::fp32_to_fp16(d);
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 s = _mm256_mul_ps(v[i], idv);
      const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(s, t));
      const __m256 up = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
      const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(s, sign_bit)));  // +-1 or 0
      q[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
    }
    const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), _mm256_permutevar8x32_epi32(q16, order));
  }
#else
  gguf::quantize_row_q8_0(x, y, static_cast<size_t>(n));
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
template <int NT>
static void dot_q8_0_n(const BlockQ8_0* w, const BlockQ8_0* const* x, const float* const* xd, int64_t nb,
                       float* out) {
#if defined(SPW_AVX2) && defined(SPW_FMA)
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
#if !(defined(SPW_AVX512VNNI) && defined(SPW_AVX512VL))
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    // |w| as unsigned, sign of w moved onto x, so the u8*s8 multiply-add is exact.
    const __m256i aw = _mm256_sign_epi8(qw, qw);
    const float dw = fp16_to_fp32(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][b].qs));
      const __m256i sx = _mm256_sign_epi8(qx, qw);
#if defined(SPW_AVX512VNNI) && defined(SPW_AVX512VL)
      const __m256i s32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#else
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
#endif
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[t][b]), _mm256_cvtepi32_ps(s32), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum256(acc[t]);
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

float dot_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, int64_t n_blocks) {
  std::vector<float> xd(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) xd[static_cast<size_t>(b)] = fp16_to_fp32(x[b].d);
  const float* xdp = xd.data();
  float out;
  dot_q8_0_n<1>(w, &x, &xdp, n_blocks, &out);
  return out;
}

float dot_f32(const float* w, const float* x, int64_t n) {
  float out;
  dot_f32_n<1>(w, &x, n, &out);
  return out;
}

float dot_f16(const uint16_t* w, const float* x, int64_t n) {
  float out;
  dot_f16_n<1>(w, &x, n, &out);
  return out;
}

// ---------------------------------------------------------------- attention helpers
// K and V rows are F32, or F16 read from an F16 KV cache as they are: an F16
// value converts to F32 exactly, so the same fused steps on the converted
// lanes give bitwise what the F32 kernels give on a converted copy.

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
void dot_f32_x4(const float* w, const float* const* x, int64_t n, float* out) { dot_xn<4>(w, x, n, out); }
void dot_f32_x4(const float* w, const uint16_t* const* x, int64_t n, float* out) { dot_xn<4>(w, x, n, out); }

#if defined(SPW_AVX512F)
// dot_xn<P> for two w rows at once: each x chunk is loaded once for both
// rows, 2 * P independent accumulators. NC = n / 16 chunks when known at
// compile time (a head's width: the loops unroll and the accumulators stay in
// registers), 0 for any n.
template <int P, int NC, typename XT>
static inline void dot_2xp_impl(const float* const* w, const XT* const* x, int64_t n, float* out0, float* out1) {
  if constexpr (NC > 0) n = 16 * NC;
  __m512 a[2][P];
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < P; ++t) a[r][t] = _mm512_setzero_ps();
  int64_t i0 = 0;
  for (; i0 + 16 <= n; i0 += 16) {
    const __m512 w0 = _mm512_loadu_ps(w[0] + i0), w1 = _mm512_loadu_ps(w[1] + i0);
    for (int t = 0; t < P; ++t) {
      const __m512 xv = load16(x[t] + i0);
      a[0][t] = _mm512_fmadd_ps(w0, xv, a[0][t]);
      a[1][t] = _mm512_fmadd_ps(w1, xv, a[1][t]);
    }
  }
  float* out[2] = {out0, out1};
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < P; t += 4) reduce_x4(a[r] + t, out[r] + t);
    if constexpr (NC == 0) {  // a width that is not a multiple of 16
      for (int64_t i = i0; i < n; ++i)
        for (int t = 0; t < P; ++t) out[r][t] = madd(w[r][i], scalar_w(x[t] + i), out[r][t]);
    }
  }
}

template <int P, typename XT, size_t... I>
static constexpr auto fixed_2xp(std::index_sequence<I...>) {
  using Fixed = void (*)(const float* const*, const XT* const*, int64_t, float*, float*);
  return std::array<Fixed, sizeof...(I)>{dot_2xp_impl<P, static_cast<int>(I) + 1, XT>...};
}
#endif

template <int P, typename XT>
static void dot_2xp(const float* const* w, const XT* const* x, int64_t n, float* out0, float* out1) {
#if defined(SPW_AVX512F)
  static constexpr auto kFixed = fixed_2xp<P, XT>(std::make_index_sequence<16>());  // widths 16..256
  if (n % 16 == 0 && n >= 16 && n <= 256) return kFixed[static_cast<size_t>(n / 16 - 1)](w, x, n, out0, out1);
  dot_2xp_impl<P, 0, XT>(w, x, n, out0, out1);
#else
  dot_xn<P>(w[0], x, n, out0);
  dot_xn<P>(w[1], x, n, out1);
#endif
}

void dot_f32_2x4(const float* const* w, const float* const* x, int64_t n, float* out0, float* out1) {
  dot_2xp<4>(w, x, n, out0, out1);
}
void dot_f32_2x4(const float* const* w, const uint16_t* const* x, int64_t n, float* out0, float* out1) {
  dot_2xp<4>(w, x, n, out0, out1);
}
void dot_f32_2x8(const float* const* w, const float* const* x, int64_t n, float* out0, float* out1) {
  dot_2xp<8>(w, x, n, out0, out1);
}
void dot_f32_2x8(const float* const* w, const uint16_t* const* x, int64_t n, float* out0, float* out1) {
  dot_2xp<8>(w, x, n, out0, out1);
}


#if defined(SPW_AVX512F)
// weighted_rows for R rows of weights over the same V rows: R * NC
// independent chains (one row's NC chains wait on the FMA latency at every
// position), each V chunk loaded once for the R rows.
template <int R, int NC, typename VT>
static void weighted_rows_reg(const VT* const* v, const float* const* a, int64_t n_pos, float* const* out,
                              bool accumulate) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = accumulate ? _mm512_loadu_ps(out[r] + 16 * c) : _mm512_setzero_ps();
  for (int64_t p = 0; p < n_pos; ++p) {
    for (int c = 0; c < NC; ++c) {
      const __m512 vc = load16(v[p] + 16 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(a[r][p]), vc, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}
#endif

#if defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C) && !defined(SPW_AVX512F)
// weighted_rows for R rows of weights over 8 * NC of the V rows' columns
// starting at d0: R * NC chains of the same fused steps (madd), each V chunk
// loaded once for the R rows.
template <int R, int NC, typename VT>
static void weighted_rows_reg8(const VT* const* v, const float* const* a, int64_t n_pos, int64_t d0,
                               float* const* out, bool accumulate) {
  __m256 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c)
      acc[r][c] = accumulate ? _mm256_loadu_ps(out[r] + d0 + 8 * c) : _mm256_setzero_ps();
  for (int64_t p = 0; p < n_pos; ++p) {
    __m256 ap[R];
    for (int r = 0; r < R; ++r) ap[r] = _mm256_set1_ps(a[r][p]);
    for (int c = 0; c < NC; ++c) {
      const __m256 vc = load8(v[p] + d0 + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(ap[r], vc, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out[r] + d0 + 8 * c, acc[r][c]);
}

// R rows over the columns [0, dim) (dim % 8 == 0): blocks of 8 x NC columns
// (8 accumulators, R broadcast weights and one V chunk in registers).
template <int R, typename VT>
static void weighted_rows_avx2(const VT* const* v, const float* const* a, int64_t n_pos, int64_t dim,
                               float* const* out, bool accumulate) {
  constexpr int NC = 8 / R;
  int64_t d0 = 0;
  for (; d0 + 8 * NC <= dim; d0 += 8 * NC) weighted_rows_reg8<R, NC, VT>(v, a, n_pos, d0, out, accumulate);
  for (; d0 < dim; d0 += 8) weighted_rows_reg8<R, 1, VT>(v, a, n_pos, d0, out, accumulate);
}
#endif

template <typename VT>
static void weighted_rows_one(const VT* const* v, const float* a, int64_t n_pos, int64_t dim, float* out,
                              bool accumulate) {
#if defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C) && !defined(SPW_AVX512F)
  if (dim % 8 == 0) return weighted_rows_avx2<1, VT>(v, &a, n_pos, dim, &out, accumulate);
#endif
#if defined(SPW_AVX512F)
  // The same fused multiply-adds as the loop below (madd), with the sums
  // kept in registers.
  using Reg = void (*)(const VT* const*, const float* const*, int64_t, float* const*, bool);
  static constexpr Reg kReg[] = {weighted_rows_reg<1, 1, VT>,  weighted_rows_reg<1, 2, VT>,
                                 weighted_rows_reg<1, 3, VT>,  weighted_rows_reg<1, 4, VT>,
                                 weighted_rows_reg<1, 5, VT>,  weighted_rows_reg<1, 6, VT>,
                                 weighted_rows_reg<1, 7, VT>,  weighted_rows_reg<1, 8, VT>,
                                 weighted_rows_reg<1, 9, VT>,  weighted_rows_reg<1, 10, VT>,
                                 weighted_rows_reg<1, 11, VT>, weighted_rows_reg<1, 12, VT>,
                                 weighted_rows_reg<1, 13, VT>, weighted_rows_reg<1, 14, VT>,
                                 weighted_rows_reg<1, 15, VT>, weighted_rows_reg<1, 16, VT>};
  if (dim % 16 == 0 && dim >= 16 && dim <= 256) return kReg[dim / 16 - 1](v, &a, n_pos, &out, accumulate);
#endif
  if (!accumulate) std::fill(out, out + dim, 0.0f);
  for (int64_t p = 0; p < n_pos; ++p) {
    const float ap = a[p];
    const VT* vp = v[p];
    for (int64_t d = 0; d < dim; ++d) out[d] = madd(ap, scalar_w(vp + d), out[d]);
  }
}

template <typename VT>
static void weighted_rows_four(const VT* const* v, const float* const* a, int64_t n_pos, int64_t dim,
                               float* const* out, bool accumulate) {
#if defined(SPW_AVX512F)
  using Reg = void (*)(const VT* const*, const float* const*, int64_t, float* const*, bool);
  static constexpr Reg kFour[] = {weighted_rows_reg<4, 1, VT>, weighted_rows_reg<4, 2, VT>,
                                  weighted_rows_reg<4, 3, VT>, weighted_rows_reg<4, 4, VT>};
  static constexpr Reg kTwo[] = {weighted_rows_reg<2, 5, VT>, weighted_rows_reg<2, 6, VT>,
                                 weighted_rows_reg<2, 7, VT>, weighted_rows_reg<2, 8, VT>};
  if (dim % 16 == 0 && dim >= 16 && dim <= 64) return kFour[dim / 16 - 1](v, a, n_pos, out, accumulate);
  if (dim % 16 == 0 && dim > 64 && dim <= 128) {
    kTwo[dim / 16 - 5](v, a, n_pos, out, accumulate);
    kTwo[dim / 16 - 5](v, a + 2, n_pos, out + 2, accumulate);
    return;
  }
#endif
#if defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C) && !defined(SPW_AVX512F)
  if (dim % 8 == 0) return weighted_rows_avx2<4, VT>(v, a, n_pos, dim, out, accumulate);
#endif
  for (int r = 0; r < 4; ++r) weighted_rows_one(v, a[r], n_pos, dim, out[r], accumulate);
}

void weighted_rows(const float* const* v, const float* a, int64_t n_pos, int64_t dim, float* out, bool accumulate) {
  weighted_rows_one(v, a, n_pos, dim, out, accumulate);
}
void weighted_rows(const uint16_t* const* v, const float* a, int64_t n_pos, int64_t dim, float* out,
                   bool accumulate) {
  weighted_rows_one(v, a, n_pos, dim, out, accumulate);
}
void weighted_rows_x4(const float* const* v, const float* const* a, int64_t n_pos, int64_t dim, float* const* out,
                      bool accumulate) {
  weighted_rows_four(v, a, n_pos, dim, out, accumulate);
}
void weighted_rows_x4(const uint16_t* const* v, const float* const* a, int64_t n_pos, int64_t dim,
                      float* const* out, bool accumulate) {
  weighted_rows_four(v, a, n_pos, dim, out, accumulate);
}

// ---------------------------------------------------------------- rows / matmul

void dequantize_row(const WeightMatrix& w, int64_t row, float* out) {
  const uint8_t* p = w.data + static_cast<size_t>(row) * w.row_bytes;
  switch (w.type) {
    case gguf::GgmlType::kF32:
      std::memcpy(out, p, static_cast<size_t>(w.n_cols) * sizeof(float));
      break;
    case gguf::GgmlType::kF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < w.n_cols; ++i) out[i] = fp16_to_fp32(h[i]);
      break;
    }
    case gguf::GgmlType::kQ8_0: {
      const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(p);
      for (int64_t k = 0; k < w.n_cols / 32; ++k) {
        const float d = fp16_to_fp32(b[k].d);
        for (int j = 0; j < 32; ++j) out[k * 32 + j] = d * static_cast<float>(b[k].qs[j]);
      }
      break;
    }
    default: {
      // The low-bit types: the reference dequantiser (one row per token
      // for embedding lookups; bit-exact with ggml's).
      [[maybe_unused]] const Status st = gguf::dequantize_row(w.type, p, out, static_cast<size_t>(w.n_cols));
      assert(st.ok() && "unsupported type");
    }
  }
}

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
      const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, wq));
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

// ---------------------------------------------------------------- elementwise

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  double ss = 0.0;  // double: the sum of squares of thousands of floats
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void rope_table(int32_t pos0, int32_t n_tokens, int32_t n_rot, float freq_base, float* cos_out,
                float* sin_out, const RopeScaling& scaling) {
  const int32_t half = n_rot / 2;
  for (int32_t t = 0; t < n_tokens; ++t) {
    const double pos = static_cast<double>(pos0 + t);
    for (int32_t i = 0; i < half; ++i) {
      double theta = pos * std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
      if (scaling.freq_scale != 1.0f) theta *= static_cast<double>(scaling.freq_scale);
      if (scaling.factors != nullptr) theta /= static_cast<double>(scaling.factors[i]);
      cos_out[t * half + i] = static_cast<float>(std::cos(theta));
      sin_out[t * half + i] = static_cast<float>(std::sin(theta));
    }
  }
}

void rope_apply(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float* cos_row,
                const float* sin_row, bool neox) {
  const int32_t half = n_rot / 2;
  // The two elements of pair i: (2i, 2i+1) normal, (i, i+half) NeoX.
  const int32_t stride = neox ? 1 : 2;
  const int32_t other = neox ? half : 1;
  for (int32_t h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim;
    for (int32_t i = 0; i < half; ++i) {
      float* p0 = xh + stride * i;
      const float x0 = p0[0];
      const float x1 = p0[other];
      // One fused multiply-add each where the target has FMA (madd): left to
      // the compiler, -O2 contracts these and -O1 (the sanitizer builds) does
      // not, and an F16 KV cache then rounds the two builds' keys differently.
      p0[0] = madd(x0, cos_row[i], -(x1 * sin_row[i]));
      p0[other] = madd(x0, sin_row[i], x1 * cos_row[i]);
    }
  }
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += bias[i];
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// swiglu's exp(-g) is attention.cpp's exp_neg (within 2 ulp), whose steps
// hold for positive arguments too up to 88 (2^n stays a normal float), and
// +inf above (g / (1 + e) is then -0 where expf would give ~-1e-37, for
// g < -88). Not std::exp: the C library's expf is nothing a shader can
// repeat, and the Vulkan backend's swiglu.comp computes these same bits
// (issue 31). exp_neg_shifted takes 16 at a time (its AVX-512 lanes give
// exp_neg's bits); x - 0 is x.
void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  float e[16];
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - i0);
    for (int64_t j = 0; j < m; ++j) e[j] = -gate[i0 + j];
    exp_neg_shifted(e, m, 0.0f);
    for (int64_t j = 0; j < m; ++j) {
      const float g = gate[i0 + j];
      const float ex = -g > 88.0f ? std::numeric_limits<float>::infinity() : e[j];
      out[i0 + j] = g / (1.0f + ex) * up[i0 + j];  // out may be gate: g is read first
    }
  }
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

SPW_CPU_KERNELS_END
