#version 450
// Stores the batch's K and V rows into the paged cache of one layer: position
// p lives in block blocks[p / block_tokens], slot p % block_tokens.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer KC { float kc[]; };
layout(std430, binding = 3) writeonly buffer VC { float vc[]; };
layout(std430, binding = 4) readonly buffer BT { int blocks[]; };

layout(push_constant) uniform PC {
  uint n_tokens;
  uint n_kv;
  uint block_tokens;
  uint pos0;
} pc;

void main() {
  const uint g = flat_invocation();
  if (g >= pc.n_tokens * pc.n_kv) return;
  const uint t = g / pc.n_kv, j = g % pc.n_kv;
  const uint pos = pc.pos0 + t;
  const uint dst = (uint(blocks[pos / pc.block_tokens]) * pc.block_tokens + pos % pc.block_tokens) * pc.n_kv + j;
  kc[dst] = k[g];
  vc[dst] = v[g];
}
