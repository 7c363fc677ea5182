#version 450
// g = silu(g) * u, in place on g.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform PC { uint n; } pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.n) return;
  const float v = g[i];
  g[i] = v / (1.0 + exp(-v)) * u[i];
}
