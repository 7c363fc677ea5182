// One kernel variant's entry points as a table of function pointers: what
// kernel_dispatch.cpp calls through. Internal to backend/cpu.
//
// SPW_CPU_KERNEL_LIST(X) names every function the kernel headers declare
// between SPW_CPU_NS_BEGIN/END as X(return type, name, table member,
// (parameters), (arguments)); the member tells overloads apart. From the one
// list: the table's members (here), its filling in each variant's build
// (kernel_table.cpp) and the plain functions that forward to the chosen
// table (kernel_dispatch.cpp). A function added to a header without its line
// here leaves its plain name undefined, which the link reports.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/attention.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/quant_dot.h"

// clang-format off
#define SPW_CPU_KERNEL_LIST(X)                                                                                     \
  X(float, fp16_to_fp32, fp16_to_fp32, (uint16_t h), (h))                                                          \
  X(uint16_t, fp32_to_fp16, fp32_to_fp16, (float f), (f))                                                          \
  X(void, quantize_row_q8_0, quantize_row_q8_0, (const float* x, BlockQ8_0* y, int64_t n), (x, y, n))              \
  X(float, dot_f32, dot_f32, (const float* w, const float* x, int64_t n), (w, x, n))                               \
  X(float, dot_f16, dot_f16, (const uint16_t* w, const float* x, int64_t n), (w, x, n))                            \
  X(float, dot_q8_0, dot_q8_0, (const BlockQ8_0* w, const BlockQ8_0* x, int64_t nb), (w, x, nb))                   \
  X(void, dot_f32_x4, dot_f32_x4, (const float* w, const float* const* x, int64_t n, float* out), (w, x, n, out))  \
  X(void, dot_f32_2x4, dot_f32_2x4,                                                                                \
    (const float* const* w, const float* const* x, int64_t n, float* o0, float* o1), (w, x, n, o0, o1))            \
  X(void, dot_f32_2x8, dot_f32_2x8,                                                                                \
    (const float* const* w, const float* const* x, int64_t n, float* o0, float* o1), (w, x, n, o0, o1))            \
  X(void, dot_f32_x4, dot_f32_x4_f16, (const float* w, const uint16_t* const* x, int64_t n, float* out),           \
    (w, x, n, out))                                                                                                \
  X(void, dot_f32_2x4, dot_f32_2x4_f16,                                                                            \
    (const float* const* w, const uint16_t* const* x, int64_t n, float* o0, float* o1), (w, x, n, o0, o1))         \
  X(void, dot_f32_2x8, dot_f32_2x8_f16,                                                                            \
    (const float* const* w, const uint16_t* const* x, int64_t n, float* o0, float* o1), (w, x, n, o0, o1))         \
  X(void, weighted_rows, weighted_rows,                                                                            \
    (const float* const* v, const float* a, int64_t n_pos, int64_t dim, float* out, bool acc),                     \
    (v, a, n_pos, dim, out, acc))                                                                                  \
  X(void, weighted_rows_x4, weighted_rows_x4,                                                                      \
    (const float* const* v, const float* const* a, int64_t n_pos, int64_t dim, float* const* out, bool acc),       \
    (v, a, n_pos, dim, out, acc))                                                                                  \
  X(void, weighted_rows, weighted_rows_f16,                                                                        \
    (const uint16_t* const* v, const float* a, int64_t n_pos, int64_t dim, float* out, bool acc),                  \
    (v, a, n_pos, dim, out, acc))                                                                                  \
  X(void, weighted_rows_x4, weighted_rows_x4_f16,                                                                  \
    (const uint16_t* const* v, const float* const* a, int64_t n_pos, int64_t dim, float* const* out, bool acc),    \
    (v, a, n_pos, dim, out, acc))                                                                                  \
  X(void, dequantize_row, dequantize_row, (const WeightMatrix& w, int64_t row, float* out), (w, row, out))         \
  X(void, matmul, matmul, (const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool),   \
    (w, x, n_tokens, y, pool))                                                                                     \
  X(void, matmul_fused, matmul_fused,                                                                              \
    (const MatmulOut* outs, int n_outs, const float* x, int64_t n_tokens, ThreadPool* pool),                       \
    (outs, n_outs, x, n_tokens, pool))                                                                             \
  X(void, rms_norm, rms_norm, (const float* x, const float* weight, int64_t n, float eps, float* y),               \
    (x, weight, n, eps, y))                                                                                        \
  X(void, rope_table, rope_table,                                                                                  \
    (int32_t pos0, int32_t n_tokens, int32_t n_rot, float freq_base, float* c, float* s, const RopeScaling& sc),   \
    (pos0, n_tokens, n_rot, freq_base, c, s, sc))                                                                  \
  X(void, rope_apply, rope_apply,                                                                                  \
    (float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float* c, const float* s, bool neox),       \
    (x, n_heads, head_dim, n_rot, c, s, neox))                                                                     \
  X(void, add_bias, add_bias, (float* y, const float* bias, int64_t rows, int64_t n), (y, bias, rows, n))          \
  X(void, softmax, softmax, (float* x, int64_t n), (x, n))                                                         \
  X(void, swiglu, swiglu, (const float* gate, const float* up, float* out, int64_t n), (gate, up, out, n))         \
  X(void, add, add, (float* y, const float* x, int64_t n), (y, x, n))                                              \
  X(float, tanh_steps, tanh_steps, (float x), (x))                                                                \
  X(void, geglu, geglu, (const float* gate, const float* up, float* out, int64_t n), (gate, up, out, n))           \
  X(void, softcap, softcap, (float* x, int64_t n, float cap), (x, n, cap))                                         \
  X(ActFormat, act_format, act_format, (gguf::GgmlType w), (w))                                                    \
  X(int64_t, act_block_elems, act_block_elems, (ActFormat f), (f))                                                 \
  X(size_t, act_block_bytes, act_block_bytes, (ActFormat f), (f))                                                  \
  X(void, quantize_act_row, quantize_act_row,                                                                      \
    (ActFormat f, const float* x, int64_t n, void* blocks, float* d, float* s), (f, x, n, blocks, d, s))           \
  X(const QuantDot*, quant_dot, quant_dot, (gguf::GgmlType w), (w))                                                \
  X(const QuantDot*, quant_dot_scalar, quant_dot_scalar, (gguf::GgmlType w), (w))                                  \
  X(const char*, quant_dot_isa, quant_dot_isa, (), ())                                                             \
  X(int64_t, attention_items, attention_items, (std::span<const SeqSlice> slices, int32_t n_head),                 \
    (slices, n_head))                                                                                              \
  X(void, attention, attention,                                                                                    \
    (std::span<const SeqSlice> slices, int32_t layer, const AttentionShape& shape, const float* q, float* out,     \
     ThreadPool* pool),                                                                                            \
    (slices, layer, shape, q, out, pool))                                                                          \
  X(float, exp_neg, exp_neg, (float x), (x))                                                                       \
  X(void, exp_neg_shifted, exp_neg_shifted, (float* x, int64_t n, float shift), (x, n, shift))
// clang-format on

namespace spw::cpu {

struct KernelTable {
  const char* isa = "";  // the SPW_* extensions the variant was built for (simd.h), space-separated
  KernelTraits traits;   // from the same macros
#define SPW_CPU_TABLE_MEMBER(ret, name, member, params, args) ret(*member) params = nullptr;
  SPW_CPU_KERNEL_LIST(SPW_CPU_TABLE_MEMBER)
#undef SPW_CPU_TABLE_MEMBER
};

SPW_CPU_NS_BEGIN
// The variant's table (kernel_table.cpp, built once per variant).
const KernelTable& kernel_table();
SPW_CPU_NS_END

// The table of the chosen variant (kernel_variant.cpp; chooses the best that
// runs here on the first call).
const KernelTable& active_kernel_table();

}  // namespace spw::cpu
