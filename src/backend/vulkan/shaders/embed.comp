#version 450
// out[t][:] = row tok[t] of the embedding matrix, dequantised to F32, for the
// tokens whose row lies in this chunk [row0, row0 + n_rows). One workgroup per
// token. WTYPE as in matmul.comp.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer T { int tok[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint n_cols;
  uint n_rows;
  uint row0;
  uint row_bytes;
} pc;

#if WTYPE != 0
uint half_at(uint hidx) {
  const uint word = w[hidx >> 1];
  return (hidx & 1u) == 0u ? (word & 0xffffu) : (word >> 16);
}
#endif

void main() {
  const uint t = gl_WorkGroupID.x;
  const int id = tok[t];
  if (id < int(pc.row0) || id >= int(pc.row0 + pc.n_rows)) return;
  const uint r = uint(id) - pc.row0;
  for (uint c = gl_LocalInvocationID.x; c < pc.n_cols; c += WG) {
#if WTYPE == 0
    const float v = uintBitsToFloat(w[r * pc.n_cols + c]);
#elif WTYPE == 1
    const float v = unpackHalf2x16(half_at(r * pc.n_cols + c)).x;
#else
    const uint h0 = ((r * pc.row_bytes) >> 1) + (c / 32u) * 17u;
    const float d = unpackHalf2x16(half_at(h0)).x;
    const uint j = c % 32u;
    const uint hv = half_at(h0 + 1u + j / 2u);
    const int q = bitfieldExtract(int(hv), int((j & 1u) * 8u), 8);
    const float v = d * float(q);
#endif
    o[t * pc.n_cols + c] = v;
  }
}
