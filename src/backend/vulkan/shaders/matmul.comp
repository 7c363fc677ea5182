#version 450
// y[t * y_stride + row0 + r] = dot(W row r, x row t), one workgroup per (r, t):
// 64 invocations stride over the columns (or Q8_0 blocks), then a fixed
// shared-memory tree reduction. Each (r, t) is computed the same way whatever
// the batch size, so results are batch-invariant.
// WTYPE 0: F32 weights; 1: F16 (pairs of halves per uint); 2: Q8_0 (34-byte
// blocks read as 16-bit halves) against activations quantised to Q8_0
// (xq: 8 uints of packed int8 per block, xd: the fp16-rounded scale as float),
// integer dot per block then scaled by d_w * d_x, as llama.cpp does.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
#if WTYPE == 2
layout(std430, binding = 1) readonly buffer XQ { uint xq[]; };
layout(std430, binding = 2) readonly buffer XD { float xd[]; };
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
  uint row_bytes; // bytes per weight row (Q8_0)
} pc;

shared float red[WG];

#if WTYPE == 2
uint half_at(uint hidx) {  // 16-bit unit hidx of the weight chunk
  const uint word = w[hidx >> 1];
  return (hidx & 1u) == 0u ? (word & 0xffffu) : (word >> 16);
}
#endif

void main() {
  const uint r = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  const uint t = gl_WorkGroupID.y;
  const uint tid = gl_LocalInvocationID.x;
  if (r >= pc.n_rows) return;  // uniform per workgroup
  float s = 0.0;
#if WTYPE == 0
  const uint wb = r * pc.n_cols, xb = t * pc.n_cols;
  for (uint c = tid; c < pc.n_cols; c += WG) s = fma(uintBitsToFloat(w[wb + c]), x[xb + c], s);
#elif WTYPE == 1
  const uint wb = (r * pc.n_cols) >> 1, xb = t * pc.n_cols;  // n_cols is even
  for (uint c2 = tid; c2 < (pc.n_cols >> 1); c2 += WG) {
    const vec2 wv = unpackHalf2x16(w[wb + c2]);
    s = fma(wv.x, x[xb + 2u * c2], s);
    s = fma(wv.y, x[xb + 2u * c2 + 1u], s);
  }
#else
  const uint nb = pc.n_cols / 32u;
  const uint hb = (r * pc.row_bytes) >> 1;  // row_bytes = 34 * nb is even
  for (uint b = tid; b < nb; b += WG) {
    const uint h0 = hb + b * 17u;
    const float dw = unpackHalf2x16(half_at(h0)).x;
    const uint xo = (t * nb + b) * 8u;
    int isum = 0;
    for (uint j = 0u; j < 8u; ++j) {
      const uint lo = half_at(h0 + 1u + 2u * j), hi = half_at(h0 + 2u + 2u * j);
      const int wq = int(lo | (hi << 16));
      const int xv = int(xq[xo + j]);
      isum += bitfieldExtract(wq, 0, 8) * bitfieldExtract(xv, 0, 8);
      isum += bitfieldExtract(wq, 8, 8) * bitfieldExtract(xv, 8, 8);
      isum += bitfieldExtract(wq, 16, 8) * bitfieldExtract(xv, 16, 8);
      isum += bitfieldExtract(wq, 24, 8) * bitfieldExtract(xv, 24, 8);
    }
    s = fma(float(isum), dw * xd[t * nb + b], s);
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
