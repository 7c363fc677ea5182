#include "backend/cpu/kernels.h"

#include "backend/cpu/attention.h"
#include "backend/cpu/kernels_internal.h"
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
#include <type_traits>
#include <utility>
#include <vector>

SPW_CPU_KERNELS_BEGIN

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

// The one-token dot products: dot_*_n<1> (kernels_internal.h).
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

// ---------------------------------------------------------------- rows (matmul: gemm.cpp)

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

float tanh_steps(float x) {
  const float e = exp_neg(-2.0f * std::fabs(x));
  const float t = (1.0f - e) / (1.0f + e);  // 1 - e is exact for e in [0.5, 1] (Sterbenz)
  return std::signbit(x) ? -t : t;
}

namespace {
// tanh_steps over 16 values at a time: the exp_neg of every lane comes
// from exp_neg_shifted (its 16-lane form gives exp_neg's bits, and x - 0 is
// x), the rest are lane-wise IEEE steps the compiler vectorises: the same
// bits as tanh_steps value by value, at a fraction of the scalar loop's cost
// (geglu is one per FFN activation: most of a Gemma prefill's non-matmul time).
void tanh_steps16(const float* x, float* t, int64_t m) {
  float e[16];
  for (int64_t j = 0; j < m; ++j) e[j] = -2.0f * std::fabs(x[j]);
  exp_neg_shifted(e, m, 0.0f);
  for (int64_t j = 0; j < m; ++j) {
    const float v = (1.0f - e[j]) / (1.0f + e[j]);
    t[j] = std::signbit(x[j]) ? -v : v;
  }
}
}  // namespace

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.797884560802865355f;
  float y[16], t[16];
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - i0);
    for (int64_t j = 0; j < m; ++j) {
      const float g = gate[i0 + j];
      y[j] = (kSqrt2OverPi * g) * std::fma(0.044715f * g, g, 1.0f);
    }
    tanh_steps16(y, t, m);
    for (int64_t j = 0; j < m; ++j) {
      const float g = gate[i0 + j];
      out[i0 + j] = ((0.5f * g) * (1.0f + t[j])) * up[i0 + j];  // out may be gate: g is read first
    }
  }
}

void softcap(float* x, int64_t n, float cap) {
  float y[16], t[16];
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - i0);
    for (int64_t j = 0; j < m; ++j) y[j] = x[i0 + j] / cap;
    tanh_steps16(y, t, m);
    for (int64_t j = 0; j < m; ++j) x[i0 + j] = cap * t[j];
  }
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
