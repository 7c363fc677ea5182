#version 450
// y += x.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform PC { uint n; } pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.n) return;
  y[i] += x[i];
}
