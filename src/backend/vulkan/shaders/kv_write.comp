#version 450
// Stores the batch's K and V rows into the paged cache of one layer. The rows
// may belong to several sequences: the row table at the head of `bt` gives
// each row its position and where its sequence's block table starts in the
// same buffer (bt[2t] = position, bt[2t + 1] = offset of its block ids);
// position p of that sequence lives in block ids[p / block_tokens], slot
// p % block_tokens.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

// KV_F16: the cache holds IEEE halves, two per uint (element 2i in the low
// 16 bits), rounded to nearest even exactly as the CPU's KV (gguf/fp16.h:
// fp32_to_fp16, spelled out below so no driver's packHalf2x16 rounding mode
// matters); one invocation writes one uint, elements j and j + 1 of a row
// (n_kv is even).
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
#ifdef KV_F16
layout(std430, binding = 2) writeonly buffer KC { uint kc[]; };
layout(std430, binding = 3) writeonly buffer VC { uint vc[]; };
#else
layout(std430, binding = 2) writeonly buffer KC { float kc[]; };
layout(std430, binding = 3) writeonly buffer VC { float vc[]; };
#endif
layout(std430, binding = 4) readonly buffer BT { int bt[]; };

layout(push_constant) uniform PC {
  uint n_tokens;
  uint n_kv;
  uint block_tokens;
} pc;

#ifdef KV_F16
uint f32_to_f16(float f) {
  uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return x == 0x7f800000u ? (sign | 0x7c00u) : (sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (x < 0x38800000u) {                        // subnormal or zero
    if (x <= 0x33000000u) return sign;
    const uint e = x >> 23;
    const uint m = (x & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - e;
    uint r = m >> shift;
    const uint rem = m & ((1u << shift) - 1u);
    const uint halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u) != 0u)) ++r;
    return sign | r;
  }
  uint h = (x - 0x38000000u) >> 13;
  const uint rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) ++h;
  return sign | h;
}
#endif

void main() {
#ifdef KV_F16
  const uint g = 2u * flat_invocation();  // first element of the pair
#else
  const uint g = flat_invocation();
#endif
  if (g >= pc.n_tokens * pc.n_kv) return;
  const uint t = g / pc.n_kv, j = g % pc.n_kv;
  const uint pos = uint(bt[2u * t]);
  const uint boff = uint(bt[2u * t + 1u]);
  const uint dst = (uint(bt[boff + pos / pc.block_tokens]) * pc.block_tokens + pos % pc.block_tokens) * pc.n_kv + j;
#ifdef KV_F16
  kc[dst >> 1] = f32_to_f16(k[g]) | (f32_to_f16(k[g + 1u]) << 16);
  vc[dst >> 1] = f32_to_f16(v[g]) | (f32_to_f16(v[g + 1u]) << 16);
#else
  kc[dst] = k[g];
  vc[dst] = v[g];
#endif
}
