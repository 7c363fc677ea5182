#version 450
// Activations quantised the way ggml's reference quantisers do, bit for bit,
// for the weight type's paired format (backend/cpu/quant_dot.h):
//   AFMT 0, Q8_0 (quantize_row_q8_0_ref): per block of 32, d = amax / 127 and
//     id = 1 / d (correctly rounded fp32 divisions), q = round-half-away(x * id),
//     d stored as fp16 rounded to nearest even. xd[block] = float(fp16 d).
//   AFMT 1, Q8_1 (quantize_row_q8_1_ref): Q8_0's d and q, and s = fp16(sum(q) * d)
//     with the float d. xd[block] = packHalf2x16(d, s) (both exact halves).
//   AFMT 2, Q8_K (quantize_row_q8_K_ref): per block of 256, max = the first
//     element of largest magnitude (sign kept), iscale = -127 / max,
//     q = min(127, round-half-even(iscale * x)), d = 1 / iscale as float.
//     xd[block] = d. (ggml's 16-element bsums are not stored: the matmul sums
//     the codes of each sub-block as it reads them.)
// xq holds the int8 codes, four per uint, in element order, for every format.
// One invocation per block.
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
layout(std430, binding = 2) writeonly buffer XD { uint xd[]; };

layout(push_constant) uniform PC {
  uint n_blocks;  // total blocks = n_tokens * n_cols / (32, or 256 for Q8_K)
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

// Round to nearest even is symmetric, so a signed value rounds as its magnitude.
float half_rne_signed(float v) { return v < 0.0 ? -half_rne(-v) : half_rne(v); }

#ifdef EXACT_F64
// float(q) for a float64 q >= 0, rounded to nearest (the conversion's own rounding
// mode is not pinned down either): the candidate and its neighbours, nearest.
float to_float_rn(double q) {
  float f = float(q);
  const float up = uintBitsToFloat(floatBitsToUint(f) + 1u);
  const float dn = f > 0.0 ? uintBitsToFloat(floatBitsToUint(f) - 1u) : f;
  if (abs(double(up) - q) < abs(double(f) - q)) f = up;
  if (abs(double(dn) - q) < abs(double(f) - q)) f = dn;
  return f;
}
// On magnitudes (to_float_rn looks at both neighbours of a non-negative
// value only): Q8_K divides by a signed max.
float div_exact(float a, float b) {
  const float q = to_float_rn(abs(double(a) / double(b)));
  return (a < 0.0) != (b < 0.0) ? -q : q;
}
#else
float div_exact(float a, float b) { return a / b; }
#endif

uint pack4(int q0, int q1, int q2, int q3) {
  return (uint(q0) & 0xffu) | ((uint(q1) & 0xffu) << 8) | ((uint(q2) & 0xffu) << 16) | ((uint(q3) & 0xffu) << 24);
}

#if AFMT == 2
void main() {
  const uint b = flat_invocation();
  if (b >= pc.n_blocks) return;
  const uint xb = b * 256u;
  float amax = 0.0, mx = 0.0;
  for (uint j = 0u; j < 256u; ++j) {
    const float ax = abs(x[xb + j]);
    if (ax > amax) {
      amax = ax;
      mx = x[xb + j];
    }
  }
  if (amax == 0.0) {
    for (uint k = 0u; k < 64u; ++k) xq[b * 64u + k] = 0u;
    xd[b] = floatBitsToUint(0.0);
    return;
  }
  const float iscale = div_exact(-127.0, mx);
  for (uint k = 0u; k < 64u; ++k) {
    int q[4];
    for (uint j = 0u; j < 4u; ++j) {
      precise const float v = iscale * x[xb + 4u * k + j];
      q[j] = min(127, int(roundEven(v)));
    }
    xq[b * 64u + k] = pack4(q[0], q[1], q[2], q[3]);
  }
  xd[b] = floatBitsToUint(div_exact(1.0, iscale));
}
#else
void main() {
  const uint b = flat_invocation();
  if (b >= pc.n_blocks) return;
  const uint xb = b * 32u;
  float amax = 0.0;
  for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(x[xb + j]));
  const float d = div_exact(amax, 127.0);
  const float id = d != 0.0 ? div_exact(1.0, d) : 0.0;
  int sum = 0;
  for (uint k = 0u; k < 8u; ++k) {
    int q[4];
    for (uint j = 0u; j < 4u; ++j) {
      precise const float v = x[xb + 4u * k + j] * id;
      q[j] = round_away(v);
      sum += q[j];
    }
    xq[b * 8u + k] = pack4(q[0], q[1], q[2], q[3]);
  }
#if AFMT == 1
  precise const float s = float(sum) * d;
  xd[b] = packHalf2x16(vec2(half_rne(d), half_rne_signed(s)));
#else
  xd[b] = floatBitsToUint(half_rne(d));
#endif
}
#endif
