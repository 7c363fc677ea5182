// Reference (scalar) quantisation and dequantisation with ggml's exact semantics.
//
// These are the ground truth that optimised CPU/Vulkan kernels are tested
// against, and the fallback path for types a backend does not implement.
// Layouts of every block type: gguf/quant_blocks.h.
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

// ---------------------------------------------------------------- Q4_0 .. Q6_K
//
// Quantisers reproduce ggml's quantize_row_<type>_ref (what llama-quantize
// writes without an importance matrix) byte for byte: the same search over
// scales, in the same float operations and order, rounding with ggml's
// nearest_int (round half to even via 1.5 * 2^23) or its truncating casts
// where ggml truncates. The file is compiled with -ffp-contract=off so that no
// product-sum is fused into an FMA: ggml-quants.c lives in ggml-base, which
// llama.cpp builds for the baseline ISA (no FMA on x86-64), so its sums are
// rounded after every operation too. A llama.cpp built so that the compiler
// fuses them (e.g. -march with FMA and -ffp-contract=fast) can choose a
// different scale for a few K-quant sub-blocks; bit identity is only
// defined against the unfused build. Tests: quant_ref_test (bytes of ggml's
// own quantisers for fixed inputs).
// Dequantisers are bit-exact with ggml's dequantize_row_<type>: every value is
// one correctly rounded float operation on exact products (fp16 scale times a
// small integer), so the order of operations cannot change it.
// n must be a multiple of 32 (legacy types) or 256 (K types, Q8_K); asserted.
// Q8_1 and Q8_K are the activation formats of the CPU dot products
// (quantize_row_q8_1 = ggml's quantize_row_q8_1_ref, quantize_row_q8_K =
// quantize_row_q8_K_ref, except that an all-zero Q8_K block also gets zero
// bsums, which ggml leaves unwritten).
void quantize_row_q4_0(const float* x, void* blocks, size_t n);
void quantize_row_q4_1(const float* x, void* blocks, size_t n);
void quantize_row_q5_0(const float* x, void* blocks, size_t n);
void quantize_row_q5_1(const float* x, void* blocks, size_t n);
void quantize_row_q8_1(const float* x, void* blocks, size_t n);
void quantize_row_q4_K(const float* x, void* blocks, size_t n);
void quantize_row_q5_K(const float* x, void* blocks, size_t n);
void quantize_row_q6_K(const float* x, void* blocks, size_t n);
void quantize_row_q8_K(const float* x, void* blocks, size_t n);

void dequantize_row_q4_0(const void* blocks, float* y, size_t n);
void dequantize_row_q4_1(const void* blocks, float* y, size_t n);
void dequantize_row_q5_0(const void* blocks, float* y, size_t n);
void dequantize_row_q5_1(const void* blocks, float* y, size_t n);
void dequantize_row_q8_1(const void* blocks, float* y, size_t n);
void dequantize_row_q4_K(const void* blocks, float* y, size_t n);
void dequantize_row_q5_K(const void* blocks, float* y, size_t n);
void dequantize_row_q6_K(const void* blocks, float* y, size_t n);
void dequantize_row_q8_K(const void* blocks, float* y, size_t n);

// True for the weight types these functions (de)quantise: F32, F16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (the `supported` ones of
// ggml_types.h).
bool has_reference_codec(GgmlType type);

// Dequantises `n` elements of a supported type (has_reference_codec) starting
// at `src` (e.g. one row of TensorInfo::data). InvalidArgument naming the type
// when it is not one of these, or when n is not a multiple of its block size.
Status dequantize_row(GgmlType type, const void* src, float* y, size_t n);
// Inverse for the same types (F32 copies).
Status quantize_row(GgmlType type, const float* x, void* dst, size_t n);

}  // namespace spw::gguf
