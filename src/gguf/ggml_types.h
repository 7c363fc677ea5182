// Tensor element types as GGUF/ggml number them, with their block layouts.
//
// Quantised types store elements in blocks: `block_size` elements occupy
// `type_size` bytes. Q8_0: a block of 32 weights is one fp16 scale d followed by
// 32 int8 quants q, value = d * q (34 bytes); the other computed types' layouts
// are in gguf/quant_blocks.h. Only the types listed with supported=true (F32,
// F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are computed by
// Spillway's CPU engine (the Vulkan backend computes only F32, F16 and Q8_0);
// the rest are known by name so that errors can name them.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace spw::gguf {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
};

inline constexpr uint32_t kQ8_0BlockSize = 32;
inline constexpr uint32_t kQ8_0BlockBytes = 34;

struct GgmlTypeInfo {
  const char* name;     // "Q8_0"
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool supported;       // computed by Spillway's engine
};

// nullptr when `type` is not a ggml type id at all.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
// "Q8_0", or "unknown(77)".
std::string ggml_type_name(uint32_t type);

// Bytes for `n_elements` of `type`. InvalidArgument when the type is unknown or
// n_elements is not a multiple of the block size; Corruption on overflow.
Result<uint64_t> ggml_nbytes(uint32_t type, uint64_t n_elements);

}  // namespace spw::gguf
