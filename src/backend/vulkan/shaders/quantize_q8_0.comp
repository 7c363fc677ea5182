#version 450
// Activations to Q8_0 blocks, bit for bit as ggml's quantize_row_q8_0_ref: per
// block of 32, d = amax / 127 and id = 1 / d (both correctly rounded fp32
// divisions), q = round-half-away(x * id), and the scale stored as fp16 rounded
// to nearest even. One invocation per block.
//
// Two things a shader does not give for free (both seen on NVIDIA's driver,
// where lavapipe happened to agree): fp32 division is only required to be
// within 2.5 ulp, and packHalf2x16's rounding is implementation-defined (it
// truncated). So the divisions run in float64 where the device has it
// (EXACT_F64: a float64 quotient of two floats, within a few float64 ulp, rounds
// to the correctly rounded fp32 quotient, since neither a / 127 nor 1 / d can
// lie that close to a midpoint between floats), and the fp16 scale is rounded
// by hand.
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

// The fp16 value nearest to v >= 0 (ties to the even one), as a float. Starts
// from packHalf2x16's guess and settles between its neighbours; the
// differences are exact (Sterbenz), so the comparison is too.
float half_rne(float v) {
  uint h = packHalf2x16(vec2(v, 0.0)) & 0xffffu;
  if (h >= 0x7c00u) return unpackHalf2x16(h).x;  // inf/nan: past fp16's range
  float lo = unpackHalf2x16(h).x;
  if (lo > v) {
    h -= 1u;
    lo = unpackHalf2x16(h).x;
  }
  if (lo == v || h + 1u >= 0x7c00u) return lo;
  const float hi = unpackHalf2x16(h + 1u).x;
  precise const float dl = v - lo;
  precise const float dh = hi - v;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (h & 1u) == 0u ? lo : hi;
}

#ifdef EXACT_F64
// float(q) for a float64 q, rounded to nearest (the conversion's own rounding
// mode is not pinned down either): the candidate and its neighbours, nearest.
float to_float_rn(double q) {
  float f = float(q);
  const float up = uintBitsToFloat(floatBitsToUint(f) + 1u);
  const float dn = f > 0.0 ? uintBitsToFloat(floatBitsToUint(f) - 1u) : f;
  if (abs(double(up) - q) < abs(double(f) - q)) f = up;
  if (abs(double(dn) - q) < abs(double(f) - q)) f = dn;
  return f;
}
float div_exact(float a, float b) { return to_float_rn(double(a) / double(b)); }
#else
float div_exact(float a, float b) { return a / b; }
#endif

void main() {
  const uint b = flat_invocation();
  if (b >= pc.n_blocks) return;
  const uint xb = b * 32u;
  float amax = 0.0;
  for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(x[xb + j]));
  const float d = div_exact(amax, 127.0);
  const float id = d != 0.0 ? div_exact(1.0, d) : 0.0;
  xd[b] = half_rne(d);
  for (uint k = 0u; k < 8u; ++k) {
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
      precise const float v = x[xb + 4u * k + j] * id;
      const int q = round_away(v);
      word |= (uint(q) & 0xffu) << (8u * j);
    }
    xq[b * 8u + k] = word;
  }
}
