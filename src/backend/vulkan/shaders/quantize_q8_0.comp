#version 450
// Activations to Q8_0 blocks (ggml's quantize_row_q8_0_ref): per block of 32,
// d = amax / 127, q = round-half-away(x / d) (using the fp32 d), and the scale
// kept as fp16-rounded float. One invocation per block.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer XQ { uint xq[]; };
layout(std430, binding = 2) writeonly buffer XD { float xd[]; };

layout(push_constant) uniform PC {
  uint n_blocks;  // total blocks = n_tokens * n_cols / 32
} pc;

int round_away(float v) {
  const float t = trunc(v);
  return int(abs(v - t) >= 0.5 ? t + sign(v) : t);
}

void main() {
  const uint b = flat_invocation();
  if (b >= pc.n_blocks) return;
  const uint xb = b * 32u;
  float amax = 0.0;
  for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(x[xb + j]));
  const float d = amax / 127.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  xd[b] = unpackHalf2x16(packHalf2x16(vec2(d, 0.0))).x;
  for (uint k = 0u; k < 8u; ++k) {
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
      const int q = round_away(x[xb + 4u * k + j] * id);
      word |= (uint(q) & 0xffu) << (8u * j);
    }
    xq[b * 8u + k] = word;
  }
}
