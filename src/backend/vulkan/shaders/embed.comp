#version 450
// out[t][:] = row tok[t] of the embedding matrix, dequantised to F32 as the
// CPU's dequantize_row does (weights.glsl), for the tokens whose row lies in
// this chunk [row0, row0 + n_rows). One workgroup per token. WTYPE as in
// weights.glsl.
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

#include "weights.glsl"

void main() {
  const uint t = gl_WorkGroupID.x;
  const int id = tok[t];
  if (id < int(pc.row0) || id >= int(pc.row0 + pc.n_rows)) return;
  const uint rb = (uint(id) - pc.row0) * pc.row_bytes;
  for (uint c = gl_LocalInvocationID.x; c < pc.n_cols; c += WG) o[t * pc.n_cols + c] = dequant(rb, c);
}
