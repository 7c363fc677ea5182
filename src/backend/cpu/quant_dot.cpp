#include "backend/cpu/quant_dot.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/simd.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

#if defined(SPW_AVX2) && defined(SPW_FMA) && defined(SPW_F16C)
#define SPW_QDOT_AVX2 1
#endif

SPW_CPU_KERNELS_BEGIN

using gguf::BlockQ4_0;
using gguf::BlockQ4_1;
using gguf::BlockQ4_K;
using gguf::BlockQ5_0;
using gguf::BlockQ5_1;
using gguf::BlockQ5_K;
using gguf::BlockQ6_K;
using gguf::BlockQ8_1;
using gguf::BlockQ8_K;
using gguf::GgmlType;

ActFormat act_format(GgmlType w) {
  switch (w) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
      return ActFormat::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return ActFormat::kQ8_1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return ActFormat::kQ8_K;
    default:
      return ActFormat::kFloat;
  }
}

int64_t act_block_elems(ActFormat f) { return f == ActFormat::kQ8_K ? 256 : f == ActFormat::kFloat ? 1 : 32; }

size_t act_block_bytes(ActFormat f) {
  switch (f) {
    case ActFormat::kQ8_0: return sizeof(BlockQ8_0);
    case ActFormat::kQ8_1: return sizeof(BlockQ8_1);
    case ActFormat::kQ8_K: return sizeof(BlockQ8_K);
    default: return sizeof(float);
  }
}

void quantize_act_row(ActFormat f, const float* x, int64_t n, void* blocks, float* d, float* s) {
  const auto un = static_cast<size_t>(n);
  switch (f) {
    case ActFormat::kQ8_0: {
      quantize_row_q8_0(x, static_cast<BlockQ8_0*>(blocks), n);  // kernels.h: gguf's bits, SIMD
      const auto* b = static_cast<const BlockQ8_0*>(blocks);
      for (int64_t i = 0; i < n / 32; ++i) d[i] = fp16_to_fp32(b[i].d);
      break;
    }
    case ActFormat::kQ8_1: {
      gguf::quantize_row_q8_1(x, blocks, un);
      const auto* b = static_cast<const BlockQ8_1*>(blocks);
      for (int64_t i = 0; i < n / 32; ++i) {
        d[i] = fp16_to_fp32(b[i].d);
        s[i] = fp16_to_fp32(b[i].s);
      }
      break;
    }
    case ActFormat::kQ8_K:
      gguf::quantize_row_q8_K(x, blocks, un);
      break;
    default:
      assert(false && "not a quantised activation format");
  }
}

namespace {

// ================================================================ 32-element types

// Weight codes of one block in element order (what the dot multiplies).
inline void codes(const BlockQ4_0& b, int8_t* c) {
  for (int j = 0; j < 16; ++j) {
    c[j] = static_cast<int8_t>((b.qs[j] & 15) - 8);
    c[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
  }
}
inline void codes(const BlockQ4_1& b, int8_t* c) {
  for (int j = 0; j < 16; ++j) {
    c[j] = static_cast<int8_t>(b.qs[j] & 15);
    c[j + 16] = static_cast<int8_t>(b.qs[j] >> 4);
  }
}
template <typename B>
inline void codes5(const B& b, int bias, int8_t* c) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    c[j] = static_cast<int8_t>(((b.qs[j] & 15) | ((qh >> j) & 1) << 4) - bias);
    c[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - bias);
  }
}
inline void codes(const BlockQ5_0& b, int8_t* c) { codes5(b, 16, c); }
inline void codes(const BlockQ5_1& b, int8_t* c) { codes5(b, 0, c); }

// Blocks with an offset m (the _1 types) and their activation block type.
template <typename B> constexpr bool kHasOffset = false;
template <> constexpr bool kHasOffset<BlockQ4_1> = true;
template <> constexpr bool kHasOffset<BlockQ5_1> = true;
template <typename B>
using XBlockOf = std::conditional_t<kHasOffset<B>, BlockQ8_1, BlockQ8_0>;

inline float offset_of(const BlockQ4_0&) { return 0; }
inline float offset_of(const BlockQ5_0&) { return 0; }
inline float offset_of(const BlockQ4_1& b) { return fp16_to_fp32(b.m); }
inline float offset_of(const BlockQ5_1& b) { return fp16_to_fp32(b.m); }

inline float reduce_lanes(const float* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// The float step of block b of one token (the contract's lane update).
template <typename B>
inline void lane_update(float& lane, int32_t isum, float dw, float mw, const ActRow& x, int64_t b) {
  lane = std::fma(static_cast<float>(isum), dw * x.d[b], lane);
  if constexpr (kHasOffset<B>) lane = std::fma(mw, x.s[b], lane);
}

template <typename B, int NT>
void legacy_scalar(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  using XB = XBlockOf<B>;
  const auto* w = reinterpret_cast<const B*>(wp);
  const int64_t nb = n_cols / 32;
  float lanes[NT][8] = {};
  int8_t c[32];
  for (int64_t b = 0; b < nb; ++b) {
    codes(w[b], c);
    const float dw = fp16_to_fp32(w[b].d);
    const float mw = offset_of(w[b]);
    for (int t = 0; t < NT; ++t) {
      const int8_t* xq = static_cast<const XB*>(x[t].blocks)[b].qs;
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) isum += static_cast<int32_t>(c[j]) * xq[j];
      lane_update<B>(lanes[t][b & 7], isum, dw, mw, x[t], b);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce_lanes(lanes[t]);
}

// ================================================================ K types (scalar)

// Q4_K / Q5_K codes of a super-block in element order, with scales and mins.
inline void k45_scales(const uint8_t* packed, int32_t* sc, int32_t* m) {
  for (int j = 0; j < 8; ++j) {
    uint8_t s, mm;
    gguf::unpack_scale_min_k4(packed, j, &s, &mm);
    sc[j] = s;
    m[j] = mm;
  }
}
inline void k_codes(const BlockQ4_K& b, uint8_t* c) {
  for (int ch = 0; ch < 4; ++ch)
    for (int l = 0; l < 32; ++l) {
      c[64 * ch + l] = b.qs[32 * ch + l] & 15;
      c[64 * ch + 32 + l] = b.qs[32 * ch + l] >> 4;
    }
}
inline void k_codes(const BlockQ5_K& b, uint8_t* c) {
  for (int ch = 0; ch < 4; ++ch)
    for (int l = 0; l < 32; ++l) {
      c[64 * ch + l] = static_cast<uint8_t>((b.qs[32 * ch + l] & 15) | ((b.qh[l] >> (2 * ch)) & 1) << 4);
      c[64 * ch + 32 + l] = static_cast<uint8_t>((b.qs[32 * ch + l] >> 4) | ((b.qh[l] >> (2 * ch + 1)) & 1) << 4);
    }
}

// The contract's float step of a Q4_K/Q5_K super-block.
inline void k45_update(float& acc, int32_t isum, int32_t imin, float d, float dmin, float dx) {
  acc = std::fma(static_cast<float>(isum), d * dx, acc);
  acc = std::fma(static_cast<float>(-imin), dmin * dx, acc);
}
inline int32_t k45_min_sum(const int32_t* m, const BlockQ8_K& xb) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) s += m[j] * (xb.bsums[2 * j] + xb.bsums[2 * j + 1]);
  return s;
}

template <typename B, int NT>
void k45_scalar(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  const auto* w = reinterpret_cast<const B*>(wp);
  const int64_t nb = n_cols / 256;
  float acc[NT] = {};
  uint8_t c[256];
  int32_t sc[8], m[8];
  for (int64_t b = 0; b < nb; ++b) {
    k_codes(w[b], c);
    k45_scales(w[b].scales, sc, m);
    const float d = fp16_to_fp32(w[b].d), dmin = fp16_to_fp32(w[b].dmin);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& xb = static_cast<const BlockQ8_K*>(x[t].blocks)[b];
      int32_t isum = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) s += c[32 * j + l] * xb.qs[32 * j + l];
        isum += sc[j] * s;
      }
      k45_update(acc[t], isum, k45_min_sum(m, xb), d, dmin, xb.d);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

inline void k_codes(const BlockQ6_K& b, uint8_t* c) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l)
      for (int k = 0; k < 4; ++k)
        c[128 * h + 32 * k + l] = static_cast<uint8_t>(((b.ql[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) |
                                                       ((b.qh[32 * h + l] >> (2 * k)) & 3) << 4);
}

template <int NT>
void q6k_scalar(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wp);
  const int64_t nb = n_cols / 256;
  float acc[NT] = {};
  uint8_t c[256];
  for (int64_t b = 0; b < nb; ++b) {
    k_codes(w[b], c);
    const float d = fp16_to_fp32(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& xb = static_cast<const BlockQ8_K*>(x[t].blocks)[b];
      int32_t isum = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t s = 0;
        for (int l = 0; l < 16; ++l) s += (c[16 * g + l] - 32) * xb.qs[16 * g + l];
        isum += w[b].scales[g] * s;
      }
      acc[t] = std::fma(static_cast<float>(isum), d * xb.d, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

#if defined(SPW_QDOT_AVX2)
// ================================================================ AVX2

// hsum_i32 and dot_u8s8: kernels_internal.h.

// [sum(p0), ..., sum(p7)] of eight int32x8 vectors.
inline __m256i reduce8(const __m256i* p) {
  const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]);
  const __m256i h23 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]);
  const __m256i h67 = _mm256_hadd_epi32(p[6], p[7]);
  const __m256i a = _mm256_hadd_epi32(h01, h23);  // per 128-bit half: partial sums of p0..p3
  const __m256i b = _mm256_hadd_epi32(h45, h67);  // ... of p4..p7
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// 16 bytes of nibbles -> 32 codes in element order (low nibbles, then high).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// Byte i = 0x10 where bit i of the 32-bit qh is set.
inline __m256i fifth_bits(const uint8_t* qh4) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(qh)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

inline __m256i codes_v(const BlockQ4_0& b) { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }
inline __m256i codes_v(const BlockQ4_1& b) { return nibbles(b.qs); }
inline __m256i codes_v(const BlockQ5_0& b) {
  return _mm256_sub_epi8(_mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
}
inline __m256i codes_v(const BlockQ5_1& b) { return _mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh)); }

// Integer dot of weight codes (signed for the _0 types: |w| times x with w's
// sign moved onto x) with one activation block.
template <typename B>
inline __m256i block_dot(__m256i wc, __m256i wabs, const int8_t* xq) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  if constexpr (kHasOffset<B>) return dot_u8s8(wc, xv);
  else return dot_u8s8(wabs, _mm256_sign_epi8(xv, wc));
}

template <typename B, int NT>
void legacy_avx2(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  using XB = XBlockOf<B>;
  const auto* w = reinterpret_cast<const B*>(wp);
  const int64_t nb = n_cols / 32;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i wc[8], wa[8];
    alignas(16) uint16_t dh[8], mh[8] = {};
    for (int k = 0; k < 8; ++k) {
      wc[k] = codes_v(w[b + k]);
      wa[k] = _mm256_sign_epi8(wc[k], wc[k]);
      dh[k] = w[b + k].d;
      if constexpr (kHasOffset<B>) mh[k] = w[b + k].m;
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
    const __m256 mw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh)));
    for (int t = 0; t < NT; ++t) {
      const XB* xb = static_cast<const XB*>(x[t].blocks) + b;
      __m256i p[8];
      for (int k = 0; k < 8; ++k) p[k] = block_dot<B>(wc[k], wa[k], xb[k].qs);
      const __m256 scale = _mm256_mul_ps(dw, _mm256_loadu_ps(x[t].d + b));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(p)), scale, acc[t]);
      if constexpr (kHasOffset<B>) acc[t] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x[t].s + b), acc[t]);
    }
  }
  alignas(32) float lanes[NT][8];
  for (int t = 0; t < NT; ++t) _mm256_store_ps(lanes[t], acc[t]);
  for (; b < nb; ++b) {  // the last nb % 8 blocks, lane by lane
    const __m256i wc = codes_v(w[b]);
    const __m256i wa = _mm256_sign_epi8(wc, wc);
    const float dw = fp16_to_fp32(w[b].d);
    const float mw = offset_of(w[b]);
    for (int t = 0; t < NT; ++t) {
      const int32_t isum = hsum_i32(block_dot<B>(wc, wa, static_cast<const XB*>(x[t].blocks)[b].qs));
      lane_update<B>(lanes[t][b & 7], isum, dw, mw, x[t], b);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce_lanes(lanes[t]);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Q4_K / Q5_K: chunk c (64 elements) gives the codes of sub-blocks 2c and 2c+1.
inline void k_codes_v(const BlockQ4_K& b, int c, __m256i* lo, __m256i* hi) {
  const __m256i q = load256(b.qs + 32 * c);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  *lo = _mm256_and_si256(q, m4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
}
inline void k_codes_v(const BlockQ5_K& b, int c, __m256i* lo, __m256i* hi) {
  const __m256i q = load256(b.qs + 32 * c);
  const __m256i qh = load256(b.qh);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i blo = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
  const __m256i bhi = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
  const __m256i x10 = _mm256_set1_epi8(0x10);
  *lo = _mm256_or_si256(_mm256_and_si256(q, m4),
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, blo), blo), x10));
  *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bhi), bhi), x10));
}

// u8 codes x s8 activations of one 32-element sub-block, times its scale.
inline __m256i scaled_dot(__m256i codes, const int8_t* xq, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, load256(xq)), scale16);
}

template <typename B, int NT>
void k45_avx2(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  const auto* w = reinterpret_cast<const B*>(wp);
  const int64_t nb = n_cols / 256;
  float acc[NT] = {};
  for (int64_t b = 0; b < nb; ++b) {
    // The eight scales and mins by word operations (a third of the decode
    // kernel's time went to unpacking them one sub-block at a time).
    uint32_t sc8[2], m8[2];
    gguf::unpack_scales_mins_k4(w[b].scales, sc8, m8);
    uint8_t sc[8];
    std::memcpy(sc, sc8, 8);
    __m256i cl[4], ch[4];
    for (int c = 0; c < 4; ++c) k_codes_v(w[b], c, &cl[c], &ch[c]);
    // mins paired with the 16-element bsums: (m0, m0, m1, m1, ..., m7, m7).
    const __m128i mins8 = _mm_set_epi32(0, 0, static_cast<int>(m8[1]), static_cast<int>(m8[0]));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));
    const float d = fp16_to_fp32(w[b].d), dmin = fp16_to_fp32(w[b].dmin);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& xb = static_cast<const BlockQ8_K*>(x[t].blocks)[b];
      __m256i si = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        si = _mm256_add_epi32(si, scaled_dot(cl[c], xb.qs + 64 * c, _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c]))));
        si = _mm256_add_epi32(si,
                              scaled_dot(ch[c], xb.qs + 64 * c + 32, _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c + 1]))));
      }
      const int32_t imin = hsum_i32(_mm256_madd_epi16(load256(xb.bsums), mins16));
      k45_update(acc[t], hsum_i32(si), imin, d, dmin, xb.d);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

template <int NT>
void q6k_avx2(const uint8_t* wp, const ActRow* x, int64_t n_cols, float* out) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wp);
  const int64_t nb = n_cols / 256;
  float acc[NT] = {};
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    // Codes (0..63, the -32 is applied through the block sums) of the eight
    // 32-element runs k of halves h: run 4h + k is elements 128h + 32k ...
    __m256i q[8], sc16[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i la = load256(w[b].ql + 64 * h);
      const __m256i lb = load256(w[b].ql + 64 * h + 32);
      const __m256i hb = load256(w[b].qh + 32 * h);
      q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(0x03)), 4));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(0x0C)), 2));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(hb, 2), _mm256_set1_epi8(0x30)));
    }
    for (int r = 0; r < 8; ++r) {  // run r covers sub-blocks 2r (low 16) and 2r+1 (high 16)
      const auto s0 = static_cast<int16_t>(w[b].scales[2 * r]), s1 = static_cast<int16_t>(w[b].scales[2 * r + 1]);
      sc16[r] = _mm256_setr_epi16(s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1);
    }
    alignas(32) int16_t all_sc[16];
    for (int g = 0; g < 16; ++g) all_sc[g] = w[b].scales[g];
    const __m256i scales16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(all_sc));
    const float d = fp16_to_fp32(w[b].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& xb = static_cast<const BlockQ8_K*>(x[t].blocks)[b];
      __m256i si = _mm256_setzero_si256();
      for (int r = 0; r < 8; ++r) si = _mm256_add_epi32(si, scaled_dot(q[r], xb.qs + 32 * r, sc16[r]));
      const int32_t corr = hsum_i32(_mm256_madd_epi16(load256(xb.bsums), scales16));
      const int32_t isum = hsum_i32(si) - 32 * corr;
      acc[t] = std::fma(static_cast<float>(isum), d * xb.d, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = acc[t];
}
#endif  // SPW_QDOT_AVX2

template <template <int> class K>
constexpr QuantDot make() {
  return {K<1>::run, K<4>::run};
}

// Adapters from the kernel templates to QuantDotFn.
#define SPW_QDOT_TABLE(NAME, FN)                  \
  template <int NT>                                \
  struct NAME {                                    \
    static void run(const uint8_t* w, const ActRow* x, int64_t n, float* o) { FN; } \
  };
SPW_QDOT_TABLE(S_Q4_0, (legacy_scalar<BlockQ4_0, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q4_1, (legacy_scalar<BlockQ4_1, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q5_0, (legacy_scalar<BlockQ5_0, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q5_1, (legacy_scalar<BlockQ5_1, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q4_K, (k45_scalar<BlockQ4_K, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q5_K, (k45_scalar<BlockQ5_K, NT>(w, x, n, o)))
SPW_QDOT_TABLE(S_Q6_K, (q6k_scalar<NT>(w, x, n, o)))
#if defined(SPW_QDOT_AVX2)
SPW_QDOT_TABLE(V_Q4_0, (legacy_avx2<BlockQ4_0, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q4_1, (legacy_avx2<BlockQ4_1, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q5_0, (legacy_avx2<BlockQ5_0, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q5_1, (legacy_avx2<BlockQ5_1, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q4_K, (k45_avx2<BlockQ4_K, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q5_K, (k45_avx2<BlockQ5_K, NT>(w, x, n, o)))
SPW_QDOT_TABLE(V_Q6_K, (q6k_avx2<NT>(w, x, n, o)))
#endif
#undef SPW_QDOT_TABLE

constexpr QuantDot kScalar[] = {make<S_Q4_0>(), make<S_Q4_1>(), make<S_Q5_0>(), make<S_Q5_1>(),
                                make<S_Q4_K>(), make<S_Q5_K>(), make<S_Q6_K>()};
#if defined(SPW_QDOT_AVX2)
constexpr QuantDot kSimd[] = {make<V_Q4_0>(), make<V_Q4_1>(), make<V_Q5_0>(), make<V_Q5_1>(),
                              make<V_Q4_K>(), make<V_Q5_K>(), make<V_Q6_K>()};
#else
constexpr const QuantDot* kSimd = kScalar;
#endif

int table_index(GgmlType w) {
  switch (w) {
    case GgmlType::kQ4_0: return 0;
    case GgmlType::kQ4_1: return 1;
    case GgmlType::kQ5_0: return 2;
    case GgmlType::kQ5_1: return 3;
    case GgmlType::kQ4_K: return 4;
    case GgmlType::kQ5_K: return 5;
    case GgmlType::kQ6_K: return 6;
    default: return -1;
  }
}

}  // namespace

const QuantDot* quant_dot(GgmlType w) {
  const int i = table_index(w);
  return i < 0 ? nullptr : &kSimd[i];
}

const QuantDot* quant_dot_scalar(GgmlType w) {
  const int i = table_index(w);
  return i < 0 ? nullptr : &kScalar[i];
}

const char* quant_dot_isa() {
#if defined(SPW_QDOT_AVX2) && defined(SPW_AVX512VNNI) && defined(SPW_AVX512VL)
  return "avx2+vnni";
#elif defined(SPW_QDOT_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

SPW_CPU_KERNELS_END
