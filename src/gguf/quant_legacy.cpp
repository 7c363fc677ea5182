// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_1: 32-element blocks with one fp16 scale (and
// an fp16 offset for the _1 types). Semantics and the bit-identity contract:
// quant.h; layouts: quant_blocks.h.
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "gguf/fp16.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

namespace spw::gguf {
namespace {

// Scale for the symmetric types: ggml takes the element of largest magnitude
// *with its sign* (the first one on ties) and maps it to the code -2^(bits-1),
// so the most negative code is used exactly and the range is asymmetric
// towards the side that element is on.
float signed_max(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float* mn, float* mx) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  *mn = lo;
  *mx = hi;
}

// ggml rounds these codes by adding 8.5 / 16.5 / 0.5 and truncating towards
// zero (a C cast), not with roundf; the sums are >= 0 up to rounding, where
// truncation and flooring agree.
inline int trunc_code(float v) { return static_cast<int>(v); }

}  // namespace

void quantize_row_q4_0(const float* x, void* blocks, size_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ4_0*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, x += kQK) {
    const float d = signed_max(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, trunc_code(x[j] * id + 8.5f));
      const int hi = std::min(15, trunc_code(x[j + 16] * id + 8.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

void quantize_row_q4_1(const float* x, void* blocks, size_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ4_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, x += kQK) {
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(mn);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, trunc_code((x[j] - mn) * id + 0.5f));
      const int hi = std::min(15, trunc_code((x[j + 16] - mn) * id + 0.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

void quantize_row_q5_0(const float* x, void* blocks, size_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ5_0*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, x += kQK) {
    const float d = signed_max(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(31, trunc_code(x[j] * id + 16.5f));
      const int hi = std::min(31, trunc_code(x[j + 16] * id + 16.5f));
      y[b].qs[j] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, 4);
  }
}

void quantize_row_q5_1(const float* x, void* blocks, size_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ5_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, x += kQK) {
    float mn, mx;
    min_max(x, &mn, &mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      // No clamp here in ggml either: (x - min) * id <= 31 up to rounding, and
      // truncating 31.5 + tiny gives 31.
      const int lo = trunc_code((x[j] - mn) * id + 0.5f) & 31;
      const int hi = trunc_code((x[j + 16] - mn) * id + 0.5f) & 31;
      y[b].qs[j] = static_cast<uint8_t>((lo & 15) | (hi & 15) << 4);
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, 4);
  }
}

void quantize_row_q8_1(const float* x, void* blocks, size_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ8_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
      sum += y[b].qs[j];
    }
    // s uses the float d, not the fp16-rounded one (as ggml).
    y[b].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

void dequantize_row_q4_0(const void* blocks, float* y, size_t n) {
  assert(n % kQK == 0);
  const auto* x = static_cast<const BlockQ4_0*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((x[b].qs[j] & 15) - 8) * d;
      y[j + 16] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_row_q4_1(const void* blocks, float* y, size_t n) {
  assert(n % kQK == 0);
  const auto* x = static_cast<const BlockQ4_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(x[b].qs[j] & 15) * d + m;
      y[j + 16] = static_cast<float>(x[b].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_row_q5_0(const void* blocks, float* y, size_t n) {
  assert(n % kQK == 0);
  const auto* x = static_cast<const BlockQ5_0*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int lo = (x[b].qs[j] & 15) | static_cast<int>((qh >> j) & 1) << 4;
      const int hi = (x[b].qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_row_q5_1(const void* blocks, float* y, size_t n) {
  assert(n % kQK == 0);
  const auto* x = static_cast<const BlockQ5_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    const float m = fp16_to_fp32(x[b].m);
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int lo = (x[b].qs[j] & 15) | static_cast<int>((qh >> j) & 1) << 4;
      const int hi = (x[b].qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(lo) * d + m;
      y[j + 16] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequantize_row_q8_1(const void* blocks, float* y, size_t n) {
  assert(n % kQK == 0);
  const auto* x = static_cast<const BlockQ8_1*>(blocks);
  for (size_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

}  // namespace spw::gguf
