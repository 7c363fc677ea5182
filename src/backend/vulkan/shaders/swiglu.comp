#version 450
// g = silu(g) * u, in place on g. EXACT_F64 (devices with float64): the
// CPU's swiglu bit for bit: its exp steps (exact.glsl's exp_any) and a
// correctly rounded division.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "exact.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };

layout(push_constant) uniform PC { uint n; } pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.n) return;
  const float v = g[i];
#ifdef EXACT_F64
  precise const float den = 1.0 + exp_any(-v);
  g[i] = div_rn(v, den) * u[i];
#else
  g[i] = v / (1.0 + exp(-v)) * u[i];
#endif
}
