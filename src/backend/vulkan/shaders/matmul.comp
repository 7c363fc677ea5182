#version 450
// y[t * y_stride + row0 + r] = dot(W row r, x row t), one workgroup per (r, t):
// MM_WG invocations stride over the columns (F32, F16) or over 32-element units
// (the quantised types), then a fixed shared-memory tree reduction. Each
// (r, t) is computed the same way whatever the batch size, so results are
// batch-invariant. WTYPE as in weights.glsl.
//
// The quantised types follow backend/cpu/quant_dot.h: the activations arrive
// quantised in the weight type's paired format (quantize_act.comp: xq the
// int8 codes, xd the per-block scale), each unit's integer dot is exact, and
// the float steps are the CPU's:
//   Q8_0, Q4_0, Q5_0:  s = fma(float(isum), d_w * d_x, s)
//   Q4_1, Q5_1:        then s = fma(m_w, s_x, s)                 (Q8_1's s)
// For these the CPU splits blocks over 8 lanes; here each unit is a step and
// the tree reduction adds them, so the two agree to float rounding.
// The K types are bitwise the CPU's (quant_dot.h's contract): a pass covers
// 8 super-blocks, one 32-element sub-block per invocation; the invocations'
// integer parts (sc * dot, and m * sum(x codes) or Q6_K's two scaled
// half-dots) go to shared memory, where integers add exactly in any order, and
// invocation 0 alone applies each super-block's float steps in the CPU's
// order, one accumulator over the whole row:
//   Q4_K, Q5_K:  acc = fma(float(i), d * d_x, acc); acc = fma(float(-k), dmin * d_x, acc)
//   Q6_K:        acc = fma(float(i), d * d_x, acc)
// (`precise` keeps each product rounded on its own, as the CPU's is; fma is
// exact.glsl's fma_rn, fused for certain in the EXACT_F64 variant.)
//
// The workgroup size is a specialization constant (MM_WG, default 64): the
// backend picks it per device (VulkanBackend's matmul_workgroup). A GPU wants
// wide groups; a CPU Vulkan device (lavapipe) runs a group's invocations as
// one SIMD loop and pays for every barrier, so a group of one vector's width
// runs several times faster there. Any size that is a power of two >= 8 gives
// the same contract: batch-invariant, K types bitwise the CPU's.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(constant_id = 0) const uint MM_WG = 64;
layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
#if WTYPE >= 2
layout(std430, binding = 1) readonly buffer XQ { uint xq[]; };
layout(std430, binding = 2) readonly buffer XD { uint xd[]; };
#else
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer XUnused { float x_unused[]; };
#endif
layout(std430, binding = 3) writeonly buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n_cols;    // elements per row
  uint n_rows;    // rows in this chunk
  uint row0;      // first output row of this chunk
  uint y_stride;  // output floats per token
  uint row_bytes; // bytes per weight row (quantised types)
} pc;

#include "weights.glsl"
#include "exact.glsl"

#if WTYPE < WT_Q4_K
shared float red[MM_WG];
#else
shared int ired[MM_WG];  // a pass's integer parts, invocation by invocation
shared int kred[MM_WG];
#endif

#if WTYPE >= 2
// sum_i (code_i - bias) * x_i over the four bytes of each word.
int dot4(uint codes, int bias, uint xword) {
  const int xv = int(xword);
  int s = 0;
  for (int b = 0; b < 4; ++b)
    s += (int((codes >> (8 * b)) & 0xffu) - bias) * bitfieldExtract(xv, 8 * b, 8);
  return s;
}
// The same over signed bytes on both sides (Q8_0 weights).
int dot4s(uint wword, uint xword) {
  const int wv = int(wword), xv = int(xword);
  int s = 0;
  for (int b = 0; b < 4; ++b) s += bitfieldExtract(wv, 8 * b, 8) * bitfieldExtract(xv, 8 * b, 8);
  return s;
}
int sum4(uint xword) {
  const int xv = int(xword);
  return bitfieldExtract(xv, 0, 8) + bitfieldExtract(xv, 8, 8) + bitfieldExtract(xv, 16, 8) + bitfieldExtract(xv, 24, 8);
}
#endif

void main() {
  const uint r = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  const uint t = gl_WorkGroupID.y;
  const uint tid = gl_LocalInvocationID.x;
  if (r >= pc.n_rows) return;  // uniform per workgroup
#if WTYPE < WT_Q4_K
  float s = 0.0;
#if WTYPE == WT_F32
  const uint wb = r * pc.n_cols, xb = t * pc.n_cols;
  for (uint c = tid; c < pc.n_cols; c += MM_WG) s = fma(uintBitsToFloat(w[wb + c]), x[xb + c], s);
#elif WTYPE == WT_F16
  const uint wb = (r * pc.n_cols) >> 1, xb = t * pc.n_cols;  // n_cols is even
  for (uint c2 = tid; c2 < (pc.n_cols >> 1); c2 += MM_WG) {
    const vec2 wv = unpackHalf2x16(w[wb + c2]);
    s = fma(wv.x, x[xb + 2u * c2], s);
    s = fma(wv.y, x[xb + 2u * c2 + 1u], s);
  }
#else
  const uint n_units = pc.n_cols / 32u;
  const uint rb = r * pc.row_bytes;
  const uint xw0 = t * (pc.n_cols / 4u);  // this token's first xq word
  for (uint u = tid; u < n_units; u += MM_WG) {
    const uint xo = xw0 + 8u * u;
#if WTYPE == WT_Q8_0
    const uint o = rb + u * 34u;
    int isum = 0;
    for (uint i = 0u; i < 8u; ++i) isum += dot4s(w_u32(o + 2u + 4u * i), xq[xo + i]);
    s = fma(float(isum), w_half(o) * uintBitsToFloat(xd[t * n_units + u]), s);
#else
    const uint o = rb + u * BLOCK_BYTES;
    const int bias = WTYPE == WT_Q4_0 ? 8 : WTYPE == WT_Q5_0 ? 16 : 0;
    int isum = 0;
    for (uint i = 0u; i < 8u; ++i) isum += dot4(unit_codes(o, 0u, i), bias, xq[xo + i]);
#if WTYPE == WT_Q4_0 || WTYPE == WT_Q5_0
    s = fma(float(isum), w_half(o) * uintBitsToFloat(xd[t * n_units + u]), s);
#else
    const vec2 ds = unpackHalf2x16(xd[t * n_units + u]);  // Q8_1: (d, s)
    s = fma(float(isum), w_half(o) * ds.x, s);
    s = fma(w_half(o + 2u), ds.y, s);
#endif
#endif
  }
#endif
  red[tid] = s;
  barrier();
  for (uint k = MM_WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  if (tid == 0u) y[t * pc.y_stride + pc.row0 + r] = red[0];
#else
  const uint n_sb = pc.n_cols / 256u;
  const uint rb = r * pc.row_bytes;
  const uint xw0 = t * (pc.n_cols / 4u);
  float acc = 0.0;  // invocation 0's
  for (uint b0 = 0u; b0 < n_sb; b0 += MM_WG / 8u) {
    const uint b = b0 + (tid >> 3), j = tid & 7u;
    int ip = 0, kp = 0;
    if (b < n_sb) {
      const uint o = rb + b * BLOCK_BYTES;
      const uint xo = xw0 + 64u * b + 8u * j;
#if WTYPE == WT_Q6_K
      int i0 = 0, i1 = 0;
      for (uint i = 0u; i < 4u; ++i) i0 += dot4(unit_codes(o, j, i), 32, xq[xo + i]);
      for (uint i = 4u; i < 8u; ++i) i1 += dot4(unit_codes(o, j, i), 32, xq[xo + i]);
      ip = bitfieldExtract(int(w_u8(o + 192u + 2u * j)), 0, 8) * i0 +
           bitfieldExtract(int(w_u8(o + 193u + 2u * j)), 0, 8) * i1;
#else
      int isum = 0, xsum = 0;
      for (uint i = 0u; i < 8u; ++i) {
        isum += dot4(unit_codes(o, j, i), 0, xq[xo + i]);
        xsum += sum4(xq[xo + i]);
      }
      const ivec2 sm = k4_scale_min(o + 4u, j);
      ip = sm.x * isum;
      kp = sm.y * xsum;
#endif
    }
    ired[tid] = ip;
    kred[tid] = kp;
    barrier();
    if (tid == 0u) {
      for (uint k = 0u; k < MM_WG / 8u && b0 + k < n_sb; ++k) {
        int i = 0, m = 0;
        for (uint jj = 0u; jj < 8u; ++jj) {
          i += ired[8u * k + jj];
          m += kred[8u * k + jj];
        }
        const uint o = rb + (b0 + k) * BLOCK_BYTES;
        const float dx = uintBitsToFloat(xd[t * n_sb + b0 + k]);
#if WTYPE == WT_Q6_K
        precise const float dd = w_half(o + 208u) * dx;
        acc = fma_rn(float(i), dd, acc);
#else
        precise const float dd = w_half(o) * dx;
        precise const float dm = w_half(o + 2u) * dx;
        acc = fma_rn(float(i), dd, acc);
        acc = fma_rn(float(-m), dm, acc);
#endif
      }
    }
    barrier();  // ired/kred are rewritten by the next pass
  }
  if (tid == 0u) y[t * pc.y_stride + pc.row0 + r] = acc;
#endif
}
