// KvType: the element type of the KV cache (`--kv-type f32|f16|q8_0`).
//
// Contract: one enum shared by the KV cache (kv/kv_cache.h stores rows of
// this type), the backends and the estimator (admission/estimator.h sizes
// them), so the pool, the device buffers and the estimate agree on one byte
// count: kv_row_bytes(type, n) is the storage of one K (or V) row of n
// elements:
//   f32   4 n bytes;
//   f16   2 n bytes, IEEE binary16, rounded to nearest even;
//   q8_0  n / 32 GGUF Q8_0 blocks of 34 bytes (fp16 scale + 32 int8), the
//         quantisation of gguf/quant.h (ggml's quantize_row_q8_0_ref).
// check_kv_type() refuses a row shape the type cannot store: q8_0 needs
// n_embd_kv and head_dim to be multiples of 32 (a block must not straddle two
// rows, nor two heads, so each head's slice of a row is whole blocks);
// InvalidArgument naming the type and the number. parse_kv_type() accepts the
// flag spellings (f32, f16, q8_0, case-insensitive) and names a bad value.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace spw {

enum class KvType : uint8_t { kF32 = 0, kF16 = 1, kQ8_0 = 2 };

inline constexpr KvType kAllKvTypes[] = {KvType::kF32, KvType::kF16, KvType::kQ8_0};

// "f32", "f16", "q8_0": the flag's spelling.
std::string_view kv_type_name(KvType t);
Result<KvType> parse_kv_type(std::string_view s);
// Bytes of one K or V row of n elements (n a multiple of 32 for q8_0).
uint64_t kv_row_bytes(KvType t, uint64_t n);
Status check_kv_type(KvType t, int64_t n_embd_kv, int64_t head_dim);
// What a device (Vulkan) KV buffer holds: f32, or f16 packed two halves per
// 32-bit word, so n_embd_kv and head_dim must be even (a head's slice starts
// on a word; InvalidArgument naming both); q8_0 is not stored there
// (Unimplemented: its 34-byte blocks would need byte writes shared between
// shader invocations). The one rule for the backend and the estimator.
Status check_device_kv_type(KvType t, int64_t n_embd_kv, int64_t head_dim);

}  // namespace spw
