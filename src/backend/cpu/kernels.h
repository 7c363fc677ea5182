// CPU compute kernels for the llama forward pass.
//
// Contract: plain functions over host F32 activations and weights in their GGUF
// layout (F32, F16, Q8_0 here; Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K through
// quant_dot.h, whose kernels matmul uses with the same invariance contract).
// SIMD paths (AVX-512 / AVX2+FMA+F16C / VNNI) are chosen at compile time from
// the ISA a source is built for (simd.h), with scalar fallbacks; the binary
// holds one build per ISA level and calls the one kernel_variant.h chose at
// start. Every dot product of a given weight row with a given
// activation row is computed by one function with a fixed summation order, so a
// matmul over a batch gives bitwise the same values as matvecs token by token,
// and the result does not depend on the thread count (rows and tokens are
// split, never the reduction). From 8 tokens on, matmul runs as a GEMM:
// blocks of rows x tokens are the parallel work items and register tiles
// replay the one-token operation sequence per (row, token) (gemm.cpp).
// With AVX-512 an F32/F16 dot product keeps one 16-lane accumulator in k
// order and reduces it at the end (kernels_internal.h, reduce512); one F32 token
// (decode's matvec) runs eight rows side by side, each row's operations
// unchanged.
// Q8_0 follows llama.cpp: the activation row is quantised to Q8_0 blocks
// (d = max|x|/127 stored as fp16, q = round(x/d)), and each block's integer dot
// is scaled by d_w * d_x.
// Preconditions (checked by callers, asserted here): n_cols is a multiple of
// the weight type's block (32, or 256 for the K types).
// Thread safety: pure functions; matmul uses the given pool (may be null = 1 thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "backend/cpu/variant_ns.h"
#include "model/model.h"

namespace spw::cpu {

struct BlockQ8_0 {
  uint16_t d;      // fp16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");

SPW_CPU_NS_BEGIN

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);  // n % 32 == 0

float dot_f32(const float* w, const float* x, int64_t n);
float dot_f16(const uint16_t* w, const float* x, int64_t n);
float dot_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, int64_t n_blocks);

// Attention helpers (cpu_backend.cpp), same results as the plain loops:
// out[j] = dot_f32(x[j], w, n) bitwise for j < 4 (four positions' scores
// against one query; fma's product is symmetric, so the query may be the
// "weight" row and is loaded once for the four).
void dot_f32_x4(const float* w, const float* const* x, int64_t n, float* out);
// out0[j] = dot_f32(x[j], w[0], n) and out1[j] = dot_f32(x[j], w[1], n)
// bitwise for j < 4 (two query rows against four positions; each x row is
// loaded once for both).
void dot_f32_2x4(const float* const* w, const float* const* x, int64_t n, float* out0, float* out1);
// dot_f32_2x4 over eight positions (16 independent accumulators: a head of
// 48-64 values is only 3-4 fused steps per chain, too short to hide the FMA
// latency with eight).
void dot_f32_2x8(const float* const* w, const float* const* x, int64_t n, float* out0, float* out1);
// The same helpers over F16 K/V rows (an F16 KV cache read in place):
// bitwise what the F32 forms give on the rows converted to F32 (exact), as
// dot_f16(x, w, n) is dot_f32 of the converted row.
void dot_f32_x4(const float* w, const uint16_t* const* x, int64_t n, float* out);
void dot_f32_2x4(const float* const* w, const uint16_t* const* x, int64_t n, float* out0, float* out1);
void dot_f32_2x8(const float* const* w, const uint16_t* const* x, int64_t n, float* out0, float* out1);
// out[d] = 0 (unless `accumulate`: out's values go on), then for p < n_pos in
// order out[d] = a[p] * v[p][d] + out[d], for d < dim, one fused multiply-add
// per term where the target has FMA (spelled out, so every optimisation level
// gives the same bits), a multiply and an add otherwise; accumulates in
// registers when dim is a multiple of 16 up to 256 with AVX-512 (one head's output).
// Calls over consecutive position ranges, the first without `accumulate`,
// give bitwise what one call over all of them gives.
void weighted_rows(const float* const* v, const float* a, int64_t n_pos, int64_t dim, float* out,
                   bool accumulate = false);
// weighted_rows(v, a[r], n_pos, dim, out[r], accumulate) for r < 4, bitwise,
// with each V row loaded once for the four (four query rows of a tile).
void weighted_rows_x4(const float* const* v, const float* const* a, int64_t n_pos, int64_t dim, float* const* out,
                      bool accumulate = false);
void weighted_rows(const uint16_t* const* v, const float* a, int64_t n_pos, int64_t dim, float* out,
                   bool accumulate = false);
void weighted_rows_x4(const uint16_t* const* v, const float* const* a, int64_t n_pos, int64_t dim,
                      float* const* out, bool accumulate = false);

// One row of a weight matrix as F32.
void dequantize_row(const WeightMatrix& w, int64_t row, float* out);

// y[t * n_rows + r] = dot(row r of w, x + t * n_cols) for t < n_tokens.
void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

SPW_CPU_NS_END

// Several matrices over the same input in one parallel region (Q/K/V, gate/up):
// one synchronisation and one quantisation of x when their types share an
// activation format (Q4_K and Q6_K do: a Q4_K_M file's mixed Q/K/V stays
// fused). Each output is bitwise what matmul() gives.
struct MatmulOut {
  const WeightMatrix* w;
  float* y;  // [n_tokens][w->n_rows]
};

SPW_CPU_NS_BEGIN

void matmul_fused(const MatmulOut* outs, int n_outs, const float* x, int64_t n_tokens, ThreadPool* pool);

// y = x / sqrt(mean(x^2) + eps) * weight. y may alias x.
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y);

SPW_CPU_NS_END

// RoPE frequency scaling as llama.cpp applies it without YaRN: theta is
// multiplied by freq_scale (1 / the linear factor) and divided by the
// frequency's factor (Llama 3's rope_freqs.weight, [n_rot/2]) when given.
struct RopeScaling {
  float freq_scale = 1.0f;
  const float* factors = nullptr;
};

// The model's scaling (hparams' linear scale, the rope_freqs factors).
inline RopeScaling rope_scaling(const Model& m) {
  return {m.hparams().rope_freq_scale, m.rope_freq_factors().empty() ? nullptr : m.rope_freq_factors().data()};
}

SPW_CPU_NS_BEGIN

// Cos/sin table for positions pos0..pos0+n_tokens-1: [n_tokens][n_rot/2] each.
// theta_i = pos * freq_scale * base^(-2i/n_rot) / factor_i, computed in double.
void rope_table(int32_t pos0, int32_t n_tokens, int32_t n_rot, float freq_base, float* cos_out,
                float* sin_out, const RopeScaling& scaling = {});
// RoPE on one token's heads: for i < n_rot/2, llama.cpp's "normal" style
// rotates the pair (x[2i], x[2i+1]) of each head by theta_i, the NeoX style
// (neox = true; Qwen2/3) the pair (x[i], x[i + n_rot/2]); dims >= n_rot are
// unchanged.
void rope_apply(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float* cos_row,
                const float* sin_row, bool neox = false);
// y[i] += bias[i % n] for a [rows][n] block (Qwen2's Q/K/V biases).
void add_bias(float* y, const float* bias, int64_t rows, int64_t n);

void softmax(float* x, int64_t n);  // in place, max-subtracted
void swiglu(const float* gate, const float* up, float* out, int64_t n);  // silu(gate) * up
void add(float* y, const float* x, int64_t n);  // y += x
// tanh(x) as (1 - e) / (1 + e), e = exp_neg(-2|x|) (attention.h), the sign
// restored: within 1.2e-7 of tanh absolutely (the rounding of e), exactly
// +-1 past |x| = 43.5. Steps a shader repeats bit for bit (exact.glsl's
// tanh_steps), which the C library's tanhf is not.
float tanh_steps(float x);
// Gemma's FFN gate: gelu(gate) * up with GELU's tanh form, 0.5 g (1 +
// tanh(sqrt(2/pi) (g + 0.044715 g^3))), in these steps: a = fma(0.044715 g, g,
// 1), t = tanh_steps((sqrt(2/pi) g) a), out = ((0.5 g) (1 + t)) up. out may
// be gate.
void geglu(const float* gate, const float* up, float* out, int64_t n);
// x[i] = cap * tanh_steps(x[i] / cap) (Gemma 2's soft-capping; cap > 0).
void softcap(float* x, int64_t n, float cap);

SPW_CPU_NS_END

}  // namespace spw::cpu
