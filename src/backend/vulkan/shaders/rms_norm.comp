#version 450
// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight; one workgroup per row (a
// token, or a head for Qwen3's Q/K norms; rows over a 2-D grid: flat_group),
// fixed tree reduction. y may alias x only through separate bindings of
// distinct buffers (callers never alias).
// EXACT_F64 (devices with float64): backend/cpu/kernels.cpp's rms_norm bit for
// bit: invocation 0 sums the squares in float64 in element order (each square
// is exact in float64, so the sum's order is the only freedom, and it is the
// CPU's), and the scale is float(1 / sqrt(ss / n + eps)) in float64. The
// quantised types' Q8_K activations carry a float scale, so an ulp here would
// reach every K-type matmul; the serial sum costs n float64 adds per row.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n;
  float eps;
  uint rows;
} pc;

#ifdef EXACT_F64
shared float scale_sh;
#else
shared float red[WG];
#endif

void main() {
  const uint t = flat_group();
  if (t >= pc.rows) return;  // the whole workgroup: the barriers below stay uniform
  const uint tid = gl_LocalInvocationID.x;
  const uint b = t * pc.n;
#ifdef EXACT_F64
  if (tid == 0u) {
    precise double ss = 0.0LF;
    for (uint i = 0u; i < pc.n; ++i) ss += double(x[b + i]) * double(x[b + i]);
    precise const double v = 1.0LF / sqrt(ss / double(pc.n) + double(pc.eps));
    scale_sh = float(v);
  }
  barrier();
  const float scale = scale_sh;
#else
  float s = 0.0;
  for (uint i = tid; i < pc.n; i += WG) s = fma(x[b + i], x[b + i], s);
  red[tid] = s;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  const float scale = 1.0 / sqrt(red[0] / float(pc.n) + pc.eps);
#endif
  for (uint i = tid; i < pc.n; i += WG) y[b + i] = x[b + i] * scale * wt[i];
}
