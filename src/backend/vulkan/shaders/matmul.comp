#version 450
// y[t * y_stride + row0 + r] = dot(W row r, x row t), one workgroup per (r, t):
// 64 invocations stride over the columns (F32, F16) or over 32-element units
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
//   Q4_K, Q5_K:        s = fma(float(sc * isum), d * d_x, s);
//                      s = fma(float(-m * sum(x codes)), dmin * d_x, s)
//   Q6_K:              s = fma(float(sc0 * isum0 + sc1 * isum1), d * d_x, s)
// The CPU applies the K types' float steps once per 256-element super-block
// and splits blocks over 8 lanes; here each unit is a step and the tree
// reduction adds them, so the two backends agree to float rounding (the
// equivalence probe and the tests measure it), not bitwise.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

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

shared float red[WG];

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
  float s = 0.0;
#if WTYPE == WT_F32
  const uint wb = r * pc.n_cols, xb = t * pc.n_cols;
  for (uint c = tid; c < pc.n_cols; c += WG) s = fma(uintBitsToFloat(w[wb + c]), x[xb + c], s);
#elif WTYPE == WT_F16
  const uint wb = (r * pc.n_cols) >> 1, xb = t * pc.n_cols;  // n_cols is even
  for (uint c2 = tid; c2 < (pc.n_cols >> 1); c2 += WG) {
    const vec2 wv = unpackHalf2x16(w[wb + c2]);
    s = fma(wv.x, x[xb + 2u * c2], s);
    s = fma(wv.y, x[xb + 2u * c2 + 1u], s);
  }
#else
  const uint n_units = pc.n_cols / 32u;
  const uint rb = r * pc.row_bytes;
  const uint xw0 = t * (pc.n_cols / 4u);  // this token's first xq word
  for (uint u = tid; u < n_units; u += WG) {
    const uint xo = xw0 + 8u * u;
#if WTYPE == WT_Q8_0
    const uint o = rb + u * 34u;
    int isum = 0;
    for (uint i = 0u; i < 8u; ++i) isum += dot4s(w_u32(o + 2u + 4u * i), xq[xo + i]);
    s = fma(float(isum), w_half(o) * uintBitsToFloat(xd[t * n_units + u]), s);
#elif WTYPE <= WT_Q5_1
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
#else  // K types: unit u is sub-block u % 8 of super-block u / 8
    const uint b = u >> 3, j = u & 7u;
    const uint o = rb + b * BLOCK_BYTES;
    const float dx = uintBitsToFloat(xd[t * (n_units >> 3) + b]);
#if WTYPE == WT_Q6_K
    int i0 = 0, i1 = 0;
    for (uint i = 0u; i < 4u; ++i) i0 += dot4(unit_codes(o, j, i), 32, xq[xo + i]);
    for (uint i = 4u; i < 8u; ++i) i1 += dot4(unit_codes(o, j, i), 32, xq[xo + i]);
    const int sc0 = bitfieldExtract(int(w_u8(o + 192u + 2u * j)), 0, 8);
    const int sc1 = bitfieldExtract(int(w_u8(o + 193u + 2u * j)), 0, 8);
    s = fma(float(sc0 * i0 + sc1 * i1), w_half(o + 208u) * dx, s);
#else
    int isum = 0, xsum = 0;
    for (uint i = 0u; i < 8u; ++i) {
      isum += dot4(unit_codes(o, j, i), 0, xq[xo + i]);
      xsum += sum4(xq[xo + i]);
    }
    const ivec2 sm = k4_scale_min(o + 4u, j);
    s = fma(float(sm.x * isum), w_half(o) * dx, s);
    s = fma(float(-(sm.y * xsum)), w_half(o + 2u) * dx, s);
#endif
#endif
  }
#endif
  red[tid] = s;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  if (tid == 0u) y[t * pc.y_stride + pc.row0 + r] = red[0];
}
