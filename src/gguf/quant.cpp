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

namespace {

// The (de)quantiser of each computed type, with its block size.
struct Codec {
  uint32_t block;
  void (*quantize)(const float*, void*, size_t);
  void (*dequantize)(const void*, float*, size_t);
};

const Codec* codec_of(GgmlType type) {
  static const Codec q8_0{32, quantize_row_q8_0, dequantize_row_q8_0};
  static const Codec q4_0{32, quantize_row_q4_0, dequantize_row_q4_0};
  static const Codec q4_1{32, quantize_row_q4_1, dequantize_row_q4_1};
  static const Codec q5_0{32, quantize_row_q5_0, dequantize_row_q5_0};
  static const Codec q5_1{32, quantize_row_q5_1, dequantize_row_q5_1};
  static const Codec q4_k{256, quantize_row_q4_K, dequantize_row_q4_K};
  static const Codec q5_k{256, quantize_row_q5_K, dequantize_row_q5_K};
  static const Codec q6_k{256, quantize_row_q6_K, dequantize_row_q6_K};
  switch (type) {
    case GgmlType::kQ8_0: return &q8_0;
    case GgmlType::kQ4_0: return &q4_0;
    case GgmlType::kQ4_1: return &q4_1;
    case GgmlType::kQ5_0: return &q5_0;
    case GgmlType::kQ5_1: return &q5_1;
    case GgmlType::kQ4_K: return &q4_k;
    case GgmlType::kQ5_K: return &q5_k;
    case GgmlType::kQ6_K: return &q6_k;
    default: return nullptr;
  }
}

const char* kCodecList = "F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

Status check_blocks(const char* what, GgmlType type, const Codec& c, size_t n) {
  if (n % c.block == 0) return Status::ok_status();
  return Status::invalid_argument(std::string(what) + " " + ggml_type_name(static_cast<uint32_t>(type)) +
                                  ": n=" + std::to_string(n) + " is not a multiple of " + std::to_string(c.block));
}

}  // namespace

bool has_reference_codec(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || codec_of(type) != nullptr;
}

Status dequantize_row(GgmlType type, const void* src, float* y, size_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(y, src, n * sizeof(float));
      return Status::ok_status();
    case GgmlType::kF16:
      dequantize_row_f16(src, y, n);
      return Status::ok_status();
    default:
      break;
  }
  const Codec* c = codec_of(type);
  if (c == nullptr) {
    return Status::invalid_argument("dequantize: type " + ggml_type_name(static_cast<uint32_t>(type)) +
                                    " is not supported (" + kCodecList + " only)");
  }
  SPW_RETURN_IF_ERROR(check_blocks("dequantize", type, *c, n));
  c->dequantize(src, y, n);
  return Status::ok_status();
}

Status quantize_row(GgmlType type, const float* x, void* dst, size_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, x, n * sizeof(float));
      return Status::ok_status();
    case GgmlType::kF16:
      quantize_row_f16(x, dst, n);
      return Status::ok_status();
    default:
      break;
  }
  const Codec* c = codec_of(type);
  if (c == nullptr) {
    return Status::invalid_argument("quantize: type " + ggml_type_name(static_cast<uint32_t>(type)) +
                                    " is not supported (" + kCodecList + " only)");
  }
  SPW_RETURN_IF_ERROR(check_blocks("quantize", type, *c, n));
  c->quantize(x, dst, n);
  return Status::ok_status();
}

}  // namespace spw::gguf
