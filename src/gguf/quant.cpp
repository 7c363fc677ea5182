#include "gguf/quant.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "gguf/fp16.h"

namespace spw::gguf {

void quantize_row_q8_0(const float* x, void* blocks, size_t n) {
  assert(n % kQ8_0BlockSize == 0);
  uint8_t* out = static_cast<uint8_t*>(blocks);
  const size_t nb = n / kQ8_0BlockSize;
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0.0f;
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    uint8_t* ob = out + b * kQ8_0BlockBytes;
    std::memcpy(ob, &dh, 2);
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j) {
      const int8_t q = static_cast<int8_t>(std::roundf(xb[j] * id));
      std::memcpy(ob + 2 + j, &q, 1);
    }
  }
}

void dequantize_row_q8_0(const void* blocks, float* y, size_t n) {
  assert(n % kQ8_0BlockSize == 0);
  const uint8_t* in = static_cast<const uint8_t*>(blocks);
  const size_t nb = n / kQ8_0BlockSize;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* ib = in + b * kQ8_0BlockBytes;
    uint16_t dh;
    std::memcpy(&dh, ib, 2);
    const float d = fp16_to_fp32(dh);
    for (uint32_t j = 0; j < kQ8_0BlockSize; ++j) {
      y[b * kQ8_0BlockSize + j] = d * static_cast<float>(static_cast<int8_t>(ib[2 + j]));
    }
  }
}

void dequantize_row_f16(const void* src, float* y, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = fp16_to_fp32(h);
  }
}

void quantize_row_f16(const float* x, void* dst, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

Status dequantize_row(GgmlType type, const void* src, float* y, size_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(y, src, n * sizeof(float));
      return Status::ok_status();
    case GgmlType::kF16:
      dequantize_row_f16(src, y, n);
      return Status::ok_status();
    case GgmlType::kQ8_0:
      if (n % kQ8_0BlockSize != 0) {
        return Status::invalid_argument("dequantize Q8_0: n=" + std::to_string(n) +
                                        " is not a multiple of 32");
      }
      dequantize_row_q8_0(src, y, n);
      return Status::ok_status();
    default:
      return Status::invalid_argument("dequantize: type " +
                                      ggml_type_name(static_cast<uint32_t>(type)) +
                                      " is not supported (F32, F16, Q8_0 only)");
  }
}

Status quantize_row(GgmlType type, const float* x, void* dst, size_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, x, n * sizeof(float));
      return Status::ok_status();
    case GgmlType::kF16:
      quantize_row_f16(x, dst, n);
      return Status::ok_status();
    case GgmlType::kQ8_0:
      if (n % kQ8_0BlockSize != 0) {
        return Status::invalid_argument("quantize Q8_0: n=" + std::to_string(n) +
                                        " is not a multiple of 32");
      }
      quantize_row_q8_0(x, dst, n);
      return Status::ok_status();
    default:
      return Status::invalid_argument("quantize: type " +
                                      ggml_type_name(static_cast<uint32_t>(type)) +
                                      " is not supported (F32, F16, Q8_0 only)");
  }
}

}  // namespace spw::gguf
