#version 450
// Causal GQA attention over the paged cache, one workgroup per (head, token):
// scores for positions 0..pos (dot(K, q) * scale) go to a scratch row, then a
// max-subtracted softmax (tree reductions) and out[d] = sum_p a_p * V[p][d]
// in position order. Independent of the batch: each (token, head) reads only
// its own q and its own sequence's cache. Rows may belong to several
// sequences: the row table at the head of `bt` (kv_write.comp) gives each
// row its position and where its sequence's block ids start.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Q { float q[]; };
// KV_F16: the cache holds halves, two per uint (kv_write.comp), read
// exactly (unpackHalf2x16) and computed with in F32 as the F32 cache is.
#ifdef KV_F16
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
float kval(uint i) { return unpackHalf2x16(kc[i >> 1])[i & 1u]; }
float vval(uint i) { return unpackHalf2x16(vc[i >> 1])[i & 1u]; }
#else
layout(std430, binding = 1) readonly buffer KC { float kc[]; };
layout(std430, binding = 2) readonly buffer VC { float vc[]; };
float kval(uint i) { return kc[i]; }
float vval(uint i) { return vc[i]; }
#endif
layout(std430, binding = 3) readonly buffer BT { int bt[]; };
layout(std430, binding = 4) coherent buffer S { float sc[]; };
layout(std430, binding = 5) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint head_dim;
  uint n_head;
  uint n_gqa;
  uint n_kv;
  uint block_tokens;
  uint t0;        // first token of this dispatch (the scratch holds t - t0)
  uint s_stride;  // scratch floats per (token, head)
  uint q_stride;  // floats per token in q and o
  float scale;
} pc;

shared float red[WG];

uint kv_row(uint boff, uint p, uint kvh) {
  return (uint(bt[boff + p / pc.block_tokens]) * pc.block_tokens + p % pc.block_tokens) * pc.n_kv + kvh * pc.head_dim;
}

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint tl = gl_WorkGroupID.y;
  const uint t = pc.t0 + tl;
  const uint tid = gl_LocalInvocationID.x;
  const uint pos = uint(bt[2u * t]);
  const uint boff = uint(bt[2u * t + 1u]);
  const uint kvh = h / pc.n_gqa;
  const uint qb = t * pc.q_stride + h * pc.head_dim;
  const uint sb = (tl * pc.n_head + h) * pc.s_stride;

  float mx = -3.402823466e38;
  for (uint p = tid; p <= pos; p += WG) {
    const uint kb = kv_row(boff, p, kvh);
    float s = 0.0;
    for (uint d = 0u; d < pc.head_dim; ++d) s = fma(kval(kb + d), q[qb + d], s);
    s *= pc.scale;
    sc[sb + p] = s;
    mx = max(mx, s);
  }
  red[tid] = mx;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] = max(red[tid], red[tid + k]);
    barrier();
  }
  mx = red[0];
  barrier();
  float sum = 0.0;
  for (uint p = tid; p <= pos; p += WG) {
    const float e = exp(sc[sb + p] - mx);
    sc[sb + p] = e;
    sum += e;
  }
  red[tid] = sum;
  memoryBarrierBuffer();
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  const float inv = 1.0 / red[0];
  for (uint d = tid; d < pc.head_dim; d += WG) {
    float acc = 0.0;
    for (uint p = 0u; p <= pos; ++p) acc = fma(sc[sb + p] * inv, vval(kv_row(boff, p, kvh) + d), acc);
    o[qb + d] = acc;
  }
}
