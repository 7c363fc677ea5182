#version 450
// g = gelu(g) * u (GELU's tanh form, Gemma's FFN gate), in place on g.
// EXACT_F64 (devices with float64): the CPU's geglu bit for bit
// (kernels.h: its steps, and tanh_steps from exact.glsl); otherwise GLSL's
// tanh.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "exact.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform PC { uint n; } pc;

const float kSqrt2OverPi = 0.797884560802865355;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.n) return;
  const float v = g[i];
#ifdef EXACT_F64
  const float a = fma_rn(0.044715 * v, v, 1.0);
  precise const float y = (kSqrt2OverPi * v) * a;
  const float t = tanh_steps(y);
  precise const float r = ((0.5 * v) * (1.0 + t)) * u[i];
  g[i] = r;
#else
  const float t = tanh(kSqrt2OverPi * v * (1.0 + 0.044715 * v * v));
  g[i] = 0.5 * v * (1.0 + t) * u[i];
#endif
}
