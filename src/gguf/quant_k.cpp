// Q4_K, Q5_K, Q6_K and Q8_K: 256-element super-blocks whose sub-block scales
// are themselves quantised against one fp16 super-scale. Semantics and the
// bit-identity contract: quant.h; layouts: quant_blocks.h.
//
// The quantisers follow ggml's reference algorithm:
//  * Q4_K / Q5_K: per sub-block of 32, an affine fit x ~ scale * q - min with
//    q in [0, nmax], searched over a few candidate inverse scales and chosen
//    by weighted squared error (weights av|x| + |x|); the eight scales and
//    mins are then quantised to 6 bits against max/63, and the codes are
//    recomputed from the rounded scales.
//  * Q6_K: per sub-block of 16, a symmetric fit over 19 candidate scales
//    chosen by x^2-weighted error; scales to int8 against -128/max.
// Every float operation below is written in ggml's order; changing one (even
// `a * b * c` into `a * (b * c)`) changes a few codes.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "gguf/fp16.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

namespace spw::gguf {
namespace {

// Amplitudes below this are treated as an all-zero group (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves
// the integer in the low mantissa bits (ggml's nearest_int).
inline int nearest_int(float v) {
  assert(std::fabs(v) <= 4194303.0f);
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Affine fit of n values: returns scale, sets *neg_min (>= 0) and codes L in
// [0, nmax] so that x ~ scale * L - *neg_min. Starts from the min/max grid,
// then tries iscale = (nmax + rmin + rdelta * k) / (max - min) for k <= nstep,
// solving weighted least squares for (scale, min) with the codes of each try,
// and keeps the one with the smallest weighted squared error.
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, uint8_t* Laux,
                 float rmin, float rdelta, int nstep) {
  float mn = x[0], mx = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < mn) mn = x[i];
    if (x[i] > mx) mx = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -mn;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (mx - mn);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - mn));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + mn - x[i];
    diff = diff * diff;
    best += w[i] * diff;
  }
  for (int k = 0; k <= nstep; ++k) {
    iscale = (rmin + rdelta * static_cast<float>(k) + static_cast<float>(nmax)) / (mx - mn);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - mn));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        err += w[i] * diff;
      }
      if (err < best) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best = err;
        scale = this_scale;
        mn = this_min;
      }
    }
  }
  *neg_min = -mn;
  return scale;
}

// Symmetric fit of n values with x^2 weights (ggml's make_qx_quants with
// rmse_type 1): codes L in [0, 2 nmax) meaning L - nmax; returns the scale.
// Tries iscale = -(nmax + 0.1 k) / max for k in [-9, 9] and keeps the best
// least-squares scale.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = -fnmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(fnmax + 0.1f * static_cast<float>(k)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      const float fl = static_cast<float>(l);
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared by Q4_K and Q5_K (they differ in nmax, the search grid and how the
// codes are packed): fills d, dmin, scales and the 256 codes L.
template <typename Block>
void quantize_superblock_k45(const float* x, Block& y, int nmax, float rmin, float rdelta, int nstep,
                             uint8_t* L) {
  float scales[8], mins[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_affine(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int into a uint8_t before clamping (both are in
    // [0, 63] here anyway).
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      y.scales[j] = ls;
      y.scales[j + 4] = lm;
    } else {
      y.scales[j + 4] = static_cast<uint8_t>((ls & 15) | (lm & 15) << 4);
      y.scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y.scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y.d = fp32_to_fp16(max_scale / 63.0f);
  y.dmin = fp32_to_fp16(max_min / 63.0f);
  // Codes again, against the scales as stored; a sub-block whose scale
  // rounded to 0 keeps the codes of its fit.
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(y.scales, j, &sc, &m);
    const float d = fp16_to_fp32(y.d) * static_cast<float>(sc);
    if (d == 0) continue;
    const float dm = fp16_to_fp32(y.dmin) * static_cast<float>(m);
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + dm) / d);
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

}  // namespace

void quantize_row_q4_K(const float* x, void* blocks, size_t n) {
  assert(n % kQK_K == 0);
  auto* y = static_cast<BlockQ4_K*>(blocks);
  uint8_t L[kQK_K];
  for (size_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    std::memset(y[b].scales, 0, sizeof y[b].scales);
    quantize_superblock_k45(x, y[b], 15, -1.0f, 0.1f, 20, L);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | L[64 * c + 32 + l] << 4);
  }
}

void quantize_row_q5_K(const float* x, void* blocks, size_t n) {
  assert(n % kQK_K == 0);
  auto* y = static_cast<BlockQ5_K*>(blocks);
  uint8_t L[kQK_K];
  for (size_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    std::memset(y[b].scales, 0, sizeof y[b].scales);
    quantize_superblock_k45(x, y[b], 31, -0.5f, 0.1f, 15, L);
    std::memset(y[b].qh, 0, sizeof y[b].qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        y[b].qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
        y[b].qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
      }
    }
  }
}

void quantize_row_q6_K(const float* x, void* blocks, size_t n) {
  assert(n % kQK_K == 0);
  auto* y = static_cast<BlockQ6_K*>(blocks);
  int8_t L[kQK_K];
  for (size_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[b], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[b].d = fp32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; ++j)
      y[b].scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[b].d) * static_cast<float>(y[b].scales[j]);
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i) {
        const int l = nearest_int(x[16 * j + i] / d);
        L[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = y[b].ql + 64 * h;
      uint8_t* qh = y[b].qh + 32 * h;
      const int8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = Lh[l], q1 = Lh[l + 32], q2 = Lh[l + 64], q3 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q0 & 15) | (q2 & 15) << 4);
        ql[l + 32] = static_cast<uint8_t>((q1 & 15) | (q3 & 15) << 4);
        qh[l] = static_cast<uint8_t>((q0 >> 4) | (q1 >> 4) << 2 | (q2 >> 4) << 4 | (q3 >> 4) << 6);
      }
    }
  }
}

void quantize_row_q8_K(const float* x, void* blocks, size_t n) {
  assert(n % kQK_K == 0);
  auto* y = static_cast<BlockQ8_K*>(blocks);
  for (size_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    // -127 (not -128) maps the signed max to -127, so |q| <= 127 and
    // |q| * 255 fits the int16 pair sums of a u8 x s8 multiply-add.
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) y[b].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[16 * g + i];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

namespace {

// Q4_K and Q5_K share their super-block: per 64 values two 6-bit scale/min
// pairs, the low nibbles then the high ones; Q5_K adds a fifth bit per value
// from qh (bit 2c for the low half of chunk c, 2c+1 for the high half).
template <class Block, bool kFifthBit>
void dequantize_row_k45(const void* blocks, float* y, size_t n) {
  assert(n % kQK_K == 0);
  const auto* x = static_cast<const Block*>(blocks);
  for (size_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(x[b].scales, 2 * c, &sc0, &m0);
      unpack_scale_min_k4(x[b].scales, 2 * c + 1, &sc1, &m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      const uint8_t* q = x[b].qs + 32 * c;
      for (int l = 0; l < 32; ++l) {
        int lo = q[l] & 15, hi = q[l] >> 4;
        if constexpr (kFifthBit) {
          lo |= ((x[b].qh[l] >> (2 * c)) & 1) << 4;
          hi |= ((x[b].qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        y[64 * c + l] = d0 * static_cast<float>(lo) - o0;
        y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - o1;
      }
    }
  }
}

}  // namespace

void dequantize_row_q4_K(const void* blocks, float* y, size_t n) {
  dequantize_row_k45<BlockQ4_K, false>(blocks, y, n);
}

void dequantize_row_q5_K(const void* blocks, float* y, size_t n) {
  dequantize_row_k45<BlockQ5_K, true>(blocks, y, n);
}

void dequantize_row_q6_K(const void* blocks, float* y, size_t n) {
  assert(n % kQK_K == 0);
  const auto* x = static_cast<const BlockQ6_K*>(blocks);
  for (size_t b = 0; b < n / kQK_K; ++b, y += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        for (int k = 0; k < 4; ++k) {
          const int q = ((ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) | ((qh[l] >> (2 * k)) & 3) << 4;
          const int i = 128 * h + l + 32 * k;
          // d * sc * (q - 32) is exact in float (11 + 8 + 6 significant bits).
          y[i] = d * static_cast<float>(x[b].scales[i / 16]) * static_cast<float>(q - 32);
        }
      }
    }
  }
}

void dequantize_row_q8_K(const void* blocks, float* y, size_t n) {
  assert(n % kQK_K == 0);
  const auto* x = static_cast<const BlockQ8_K*>(blocks);
  for (size_t b = 0; b < n / kQK_K; ++b, y += kQK_K)
    for (int j = 0; j < kQK_K; ++j) y[j] = x[b].d * static_cast<float>(x[b].qs[j]);
}

}  // namespace spw::gguf
