#version 450
// y[i] += bias[i % n] over a [rows][n] block (Qwen2's Q/K/V biases), one
// invocation per element.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };

layout(push_constant) uniform PC {
  uint count;  // rows * n
  uint n;
} pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.count) return;
  y[i] += b[i % pc.n];
}
