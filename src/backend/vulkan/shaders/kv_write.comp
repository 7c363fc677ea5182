#version 450
// Stores the batch's K and V rows into the paged cache of one layer. The rows
// may belong to several sequences: the row table at the head of `bt` gives
// each row its position and where its sequence's block table starts in the
// same buffer (bt[2t] = position, bt[2t + 1] = offset of its block ids);
// position p of that sequence lives in block ids[p / block_tokens], slot
// p % block_tokens.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer KC { float kc[]; };
layout(std430, binding = 3) writeonly buffer VC { float vc[]; };
layout(std430, binding = 4) readonly buffer BT { int bt[]; };

layout(push_constant) uniform PC {
  uint n_tokens;
  uint n_kv;
  uint block_tokens;
} pc;

void main() {
  const uint g = flat_invocation();
  if (g >= pc.n_tokens * pc.n_kv) return;
  const uint t = g / pc.n_kv, j = g % pc.n_kv;
  const uint pos = uint(bt[2u * t]);
  const uint boff = uint(bt[2u * t + 1u]);
  const uint dst = (uint(bt[boff + pos / pc.block_tokens]) * pc.block_tokens + pos % pc.block_tokens) * pc.n_kv + j;
  kc[dst] = k[g];
  vc[dst] = v[g];
}
