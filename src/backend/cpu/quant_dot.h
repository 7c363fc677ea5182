// Dot products of llama.cpp's low-bit weight types with quantised activations.
//
// Contract: like llama.cpp, each weight type is paired with an activation
// format, and the activation row is quantised once per matmul:
//   Q4_0, Q5_0 (and Q8_0, kernels.h) with Q8_0 activations,
//   Q4_1, Q5_1 with Q8_1 (its s = d * sum(q) carries the weights' offset),
//   Q4_K, Q5_K, Q6_K with Q8_K (float d, 16-element sums for the mins).
// The quantisers are gguf/quant.h's (ggml's reference quantisers).
//
// Every dot product is an exact integer part followed by a fixed sequence of
// float operations, so the SIMD kernels (AVX2, VNNI where the target has it,
// chosen at compile time like kernels.cpp) and the scalar kernels give
// bitwise the same result; tests compare them. Per weight row:
//  * 32-element types: block b's integer dot i_b = sum q_w * q_x (codes
//    minus 8 / 16 for the _0 types) accumulates into lane b mod 8:
//      lane = fma(float(i_b), d_w * d_x, lane)     then, for _1 types,
//      lane = fma(m_w, s_x, lane);
//    the result is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
//  * K types, per super-block (one accumulator, in order):
//      Q4_K/Q5_K: i = sum_j sc_j * dot_j, k = sum_j m_j * (bsums of j);
//                 acc = fma(float(i), d_w * d_x, acc);
//                 acc = fma(float(-k), dmin_w * d_x, acc)
//      Q6_K:      i = sum_g sc_g * sum (q - 32) * q_x;  acc = fma(float(i), d_w * d_x, acc)
// The integers are exact (int32 with room to spare), so results are
// independent of how SIMD lanes split the sums. The NT = 4 kernels compute
// each token exactly as the NT = 1 kernel does (batch invariance, backend.h).
// Error against dequantise-then-F32: the activation rounding (half a Q8 step
// per element) dominates; quant_dot_test states and checks the bound.
// Preconditions: n_cols a multiple of the type's block (32 or 256); x[t]
// points at n_cols / block activation blocks of the paired format.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/variant_ns.h"
#include "gguf/ggml_types.h"

namespace spw::cpu {

enum class ActFormat : uint8_t { kFloat, kQ8_0, kQ8_1, kQ8_K };

SPW_CPU_NS_BEGIN

// The activation format of weight type `w` (kFloat for F32/F16).
ActFormat act_format(gguf::GgmlType w);
// Elements and bytes of one activation block (32/34, 32/36, 256/292).
int64_t act_block_elems(ActFormat f);
size_t act_block_bytes(ActFormat f);

SPW_CPU_NS_END

// One token's quantised activations.
struct ActRow {
  const void* blocks = nullptr;  // BlockQ8_0 / gguf::BlockQ8_1 / gguf::BlockQ8_K
  const float* d = nullptr;      // Q8_0, Q8_1: float of each block's fp16 d
  const float* s = nullptr;      // Q8_1: float of each block's fp16 s
};

SPW_CPU_NS_BEGIN

// Quantises n activations into `blocks` of format f (not kFloat), filling the
// per-block floats d (Q8_0, Q8_1) and s (Q8_1); d/s may be null for Q8_K.
void quantize_act_row(ActFormat f, const float* x, int64_t n, void* blocks, float* d, float* s);

SPW_CPU_NS_END

// out[t] = dot(weight row w, token t) for t < NT (NT = 1 or 4).
using QuantDotFn = void (*)(const uint8_t* w, const ActRow* x, int64_t n_cols, float* out);
struct QuantDot {
  QuantDotFn one;
  QuantDotFn four;
};

SPW_CPU_NS_BEGIN

// The kernels of weight type `w` (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K):
// SIMD where compiled in, else scalar. nullptr for other types.
const QuantDot* quant_dot(gguf::GgmlType w);
// Always the scalar kernels (for tests: must equal quant_dot() bitwise).
const QuantDot* quant_dot_scalar(gguf::GgmlType w);
// "avx2", "avx2+vnni" or "scalar": what quant_dot() runs.
const char* quant_dot_isa();

SPW_CPU_NS_END

}  // namespace spw::cpu
