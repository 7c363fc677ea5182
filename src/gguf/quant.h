// Reference (scalar) quantisation and dequantisation with ggml's exact semantics.
//
// These are the ground truth that optimised CPU/Vulkan kernels are tested
// against, and the fallback path for types a backend does not implement.
//
// Q8_0 block (34 bytes, no padding, little-endian):
//   uint16_t d;      // fp16 scale
//   int8_t   qs[32]; // quants; element j = fp16_to_fp32(d) * qs[j]
// quantize_row_q8_0 matches ggml's quantize_row_q8_0_ref bit for bit:
//   amax = max_j |x[j]|;  d = amax / 127 (fp32);  id = d != 0 ? 1/d : 0;
//   d is stored as fp32_to_fp16(d) (round-to-nearest-even);
//   qs[j] = roundf(x[j] * id)   (round half away from zero, using the fp32 d,
//   not the fp16-rounded one, so |qs| <= 127).
// An all-zero block gets d = 0 and qs = 0. NaN inputs are not defined (ggml's
// behaviour there is not specified either).
//
// Preconditions (checked by assert in debug builds only; these are hot paths):
// `n` is a multiple of kQ8_0BlockSize (32) for the Q8_0 functions; buffers hold
// n floats / (n/32)*34 bytes / n halves and do not overlap. `blocks` needs no
// particular alignment (it is read and written with memcpy).
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "gguf/ggml_types.h"

namespace spw::gguf {

void quantize_row_q8_0(const float* x, void* blocks, size_t n);
void dequantize_row_q8_0(const void* blocks, float* y, size_t n);

// fp16 (raw IEEE half bits, little-endian, any alignment) to float; any n.
void dequantize_row_f16(const void* src, float* y, size_t n);
// float to fp16 with round-to-nearest-even; any n.
void quantize_row_f16(const float* x, void* dst, size_t n);

// Dequantises `n` elements of a supported type (F32, F16, Q8_0) starting at
// `src` (e.g. one row of TensorInfo::data). InvalidArgument naming the type
// when it is not one of these, or when n is not a multiple of its block size.
Status dequantize_row(GgmlType type, const void* src, float* y, size_t n);
// Inverse for the same types (F32 copies).
Status quantize_row(GgmlType type, const float* x, void* dst, size_t n);

}  // namespace spw::gguf
