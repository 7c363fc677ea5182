#version 450
// RoPE in place: llama.cpp's "normal" pairs (2i, 2i+1), or with NEOX the
// pairs (i, i + n_rot/2) (Qwen2/3), i < n_rot/2, of every head rotated by the
// host-computed table (cos then sin, [n_tokens][half]).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "exact.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { float cs[]; };

layout(push_constant) uniform PC {
  uint n_tokens;
  uint n_heads;
  uint head_dim;
  uint half_rot;
  uint stride;  // floats per token in x
} pc;

void main() {
  const uint g = flat_invocation();
  if (g >= pc.n_tokens * pc.n_heads * pc.half_rot) return;
  const uint i = g % pc.half_rot;
  const uint h = (g / pc.half_rot) % pc.n_heads;
  const uint t = g / (pc.half_rot * pc.n_heads);
#ifdef NEOX
  const uint o = t * pc.stride + h * pc.head_dim + i;
  const uint o1 = o + pc.half_rot;
#else
  const uint o = t * pc.stride + h * pc.head_dim + 2u * i;
  const uint o1 = o + 1u;
#endif
  const float c = cs[t * pc.half_rot + i];
  const float s = cs[pc.n_tokens * pc.half_rot + t * pc.half_rot + i];
  const float x0 = x[o], x1 = x[o1];
#ifdef EXACT_F64
  // The CPU's rope_apply with FMA: one fused step each (exact.glsl).
  const float a = fma_rn(x0, c, -(x1 * s));
  const float b = fma_rn(x0, s, x1 * c);
#else
  precise float a = x0 * c - x1 * s;
  precise float b = x0 * s + x1 * c;
#endif
  x[o] = a;
  x[o1] = b;
}
