#version 450
// y[t * y_stride + row0 + r] = dot(W row r, x row t), one workgroup per row r
// and tile of MM_TT tokens: MM_WG invocations stride over the columns (F32,
// F16) or over 32-element units (the quantised types), each reading its weight
// unit once and applying it to every token of the tile, then a fixed
// shared-memory tree reduction per token. Each (r, t) is computed the same way
// whatever the batch size and whichever tile t falls in (the same invocation
// sums the same units in the same order), so results are batch-invariant.
// WTYPE as in weights.glsl.
//
// The quantised types follow backend/cpu/quant_dot.h: the activations arrive
// quantised in the weight type's paired format (quantize_act.comp: xq the
// int8 codes, xd the per-block scale), each unit's integer dot is exact, and
// the float steps are the CPU's:
//   Q8_0, Q4_0, Q5_0:  s = fma(float(isum), d_w * d_x, s)
//   Q4_1, Q5_1:        then s = fma(m_w, s_x, s)                 (Q8_1's s)
// For these the CPU splits blocks over 8 lanes; here each unit is a step and
// the tree reduction adds them, so the two agree to float rounding.
// The K types are bitwise the CPU's (quant_dot.h's contract): a pass covers
// 8 super-blocks, one 32-element sub-block per invocation; the invocations'
// integer parts (sc * dot, and m * sum(x codes) or Q6_K's two scaled
// half-dots) go to shared memory, where integers add exactly in any order, and
// invocation 0 alone applies each super-block's float steps in the CPU's
// order, one accumulator over the whole row:
//   Q4_K, Q5_K:  acc = fma(float(i), d * d_x, acc); acc = fma(float(-k), dmin * d_x, acc)
//   Q6_K:        acc = fma(float(i), d * d_x, acc)
// (`precise` keeps each product rounded on its own, as the CPU's is; fma is
// exact.glsl's fma_rn, fused for certain in the EXACT_F64 variant.)
//
// The token tile is a specialization constant (MM_TT, default 8, at most
// MM_WG): a prompt chunk's weights are read and unpacked once per MM_TT
// tokens instead of once per token (prefill was no faster than decode per
// token before). A tile's last tokens past n_tokens are skipped by a branch
// that is uniform across the workgroup, so a decode step does one token's work.
// The workgroup size is a specialization constant (MM_WG, default 64): the
// backend picks it per device (VulkanBackend's matmul_workgroup). A GPU wants
// wide groups; a CPU Vulkan device (lavapipe) runs a group's invocations as
// one SIMD loop and pays for every barrier, so a group of one vector's width
// runs several times faster there. Any size that is a power of two >= 8 gives
// the same contract: batch-invariant, K types bitwise the CPU's.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(constant_id = 0) const uint MM_WG = 64;
layout(constant_id = 1) const uint MM_TT = 8;
layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
#if WTYPE >= 2
layout(std430, binding = 1) readonly buffer XQ { uint xq[]; };
layout(std430, binding = 2) readonly buffer XD { uint xd[]; };
#else
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer XUnused { float x_unused[]; };
#endif
layout(std430, binding = 3) writeonly buffer Y { float y[]; };

layout(push_constant) uniform PC {
  uint n_cols;    // elements per row
  uint n_rows;    // rows in this chunk
  uint row0;      // first output row of this chunk
  uint y_stride;  // output floats per token
  uint row_bytes; // bytes per weight row (quantised types)
  uint n_tokens;  // tokens in x (the grid's y covers them in tiles of MM_TT)
} pc;

#include "weights.glsl"
#include "exact.glsl"

#if WTYPE < WT_Q4_K
shared float red[MM_TT][MM_WG];
#else
shared int ired[MM_TT][MM_WG];  // a pass's integer parts, token by token, invocation by invocation
shared int kred[MM_TT][MM_WG];
#endif

#if WTYPE >= 2
// The four bytes of a word as signed ints, each less `bias` (the weights of a
// unit are unpacked once per tile, then dotted with each token's codes).
ivec4 unpack4(uint codes, int bias) {
  return ivec4(int(codes & 0xffu), int((codes >> 8) & 0xffu), int((codes >> 16) & 0xffu), int(codes >> 24)) - bias;
}
ivec4 unpack4s(uint word) {
  const int v = int(word);
  return ivec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8), bitfieldExtract(v, 16, 8),
               bitfieldExtract(v, 24, 8));
}
// sum_b wv[b] * (signed byte b of xword): exact integer arithmetic, so any
// grouping gives the CPU's integer dot.
int dot4(ivec4 wv, uint xword) {
  const ivec4 xv = unpack4s(xword);
  return wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
}
int sum4(uint xword) {
  const ivec4 xv = unpack4s(xword);
  return xv.x + xv.y + xv.z + xv.w;
}
#endif

void main() {
  const uint r = gl_WorkGroupID.z * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * MM_TT;
  const uint tid = gl_LocalInvocationID.x;
  if (r >= pc.n_rows) return;  // uniform per workgroup
  const uint nt = min(MM_TT, pc.n_tokens - t0);  // tokens in this tile, >= 1
#if WTYPE < WT_Q4_K
  float s[MM_TT];
  for (uint k = 0u; k < MM_TT; ++k) s[k] = 0.0;
#if WTYPE == WT_F32
  const uint wb = r * pc.n_cols;
  for (uint c = tid; c < pc.n_cols; c += MM_WG) {
    const float wv = uintBitsToFloat(w[wb + c]);
    for (uint k = 0u; k < MM_TT; ++k)
      if (k < nt) s[k] = fma(wv, x[(t0 + k) * pc.n_cols + c], s[k]);
  }
#elif WTYPE == WT_F16
  const uint wb = (r * pc.n_cols) >> 1;  // n_cols is even
  for (uint c2 = tid; c2 < (pc.n_cols >> 1); c2 += MM_WG) {
    const vec2 wv = unpackHalf2x16(w[wb + c2]);
    for (uint k = 0u; k < MM_TT; ++k) {
      if (k < nt) {
        const uint xb = (t0 + k) * pc.n_cols + 2u * c2;
        s[k] = fma(wv.x, x[xb], s[k]);
        s[k] = fma(wv.y, x[xb + 1u], s[k]);
      }
    }
  }
#else
  const uint n_units = pc.n_cols / 32u;
  const uint rb = r * pc.row_bytes;
  const uint xwords = pc.n_cols / 4u;  // xq words per token
  for (uint u = tid; u < n_units; u += MM_WG) {
    ivec4 wq[8];
#if WTYPE == WT_Q8_0
    const uint o = rb + u * 34u;
    for (uint i = 0u; i < 8u; ++i) wq[i] = unpack4s(w_u32(o + 2u + 4u * i));
#else
    const uint o = rb + u * BLOCK_BYTES;
    const int bias = WTYPE == WT_Q4_0 ? 8 : WTYPE == WT_Q5_0 ? 16 : 0;
    for (uint i = 0u; i < 8u; ++i) wq[i] = unpack4(unit_codes(o, 0u, i), bias);
#endif
    const float dw = w_half(o);
#if WTYPE == WT_Q4_1 || WTYPE == WT_Q5_1
    const float mw = w_half(o + 2u);
#endif
    for (uint k = 0u; k < MM_TT; ++k) {
      if (k < nt) {
        const uint t = t0 + k;
        const uint xo = t * xwords + 8u * u;
        int isum = 0;
        for (uint i = 0u; i < 8u; ++i) isum += dot4(wq[i], xq[xo + i]);
#if WTYPE == WT_Q4_1 || WTYPE == WT_Q5_1
        const vec2 ds = unpackHalf2x16(xd[t * n_units + u]);  // Q8_1: (d, s)
        s[k] = fma(float(isum), dw * ds.x, s[k]);
        s[k] = fma(mw, ds.y, s[k]);
#else
        s[k] = fma(float(isum), dw * uintBitsToFloat(xd[t * n_units + u]), s[k]);
#endif
      }
    }
  }
#endif
  for (uint k = 0u; k < MM_TT; ++k) red[k][tid] = s[k];
  barrier();
  for (uint h = MM_WG / 2u; h > 0u; h >>= 1) {
    if (tid < h)
      for (uint k = 0u; k < MM_TT; ++k)
        if (k < nt) red[k][tid] += red[k][tid + h];
    barrier();
  }
  if (tid < nt) y[(t0 + tid) * pc.y_stride + pc.row0 + r] = red[tid][0];
#else
  const uint n_sb = pc.n_cols / 256u;
  const uint rb = r * pc.row_bytes;
  const uint xwords = pc.n_cols / 4u;
  // Invocation k < nt applies token t0 + k's float steps, in the order
  // invocation 0 applied them when a workgroup held one token.
  float acc = 0.0;
  for (uint b0 = 0u; b0 < n_sb; b0 += MM_WG / 8u) {
    const uint b = b0 + (tid >> 3), j = tid & 7u;
    if (b < n_sb) {
      const uint o = rb + b * BLOCK_BYTES;
      ivec4 wq[8];
      for (uint i = 0u; i < 8u; ++i) wq[i] = unpack4(unit_codes(o, j, i), WTYPE == WT_Q6_K ? 32 : 0);
#if WTYPE == WT_Q6_K
      const int sc0 = bitfieldExtract(int(w_u8(o + 192u + 2u * j)), 0, 8);
      const int sc1 = bitfieldExtract(int(w_u8(o + 193u + 2u * j)), 0, 8);
#else
      const ivec2 sm = k4_scale_min(o + 4u, j);
#endif
      for (uint k = 0u; k < MM_TT; ++k) {
        if (k < nt) {
          const uint xo = (t0 + k) * xwords + 64u * b + 8u * j;
#if WTYPE == WT_Q6_K
          int i0 = 0, i1 = 0;
          for (uint i = 0u; i < 4u; ++i) i0 += dot4(wq[i], xq[xo + i]);
          for (uint i = 4u; i < 8u; ++i) i1 += dot4(wq[i], xq[xo + i]);
          ired[k][tid] = sc0 * i0 + sc1 * i1;
          kred[k][tid] = 0;
#else
          int isum = 0, xsum = 0;
          for (uint i = 0u; i < 8u; ++i) {
            isum += dot4(wq[i], xq[xo + i]);
            xsum += sum4(xq[xo + i]);
          }
          ired[k][tid] = sm.x * isum;
          kred[k][tid] = sm.y * xsum;
#endif
        }
      }
    }
    barrier();
    if (tid < nt) {
      const uint t = t0 + tid;
      for (uint kb = 0u; kb < MM_WG / 8u && b0 + kb < n_sb; ++kb) {
        int i = 0, m = 0;
        for (uint jj = 0u; jj < 8u; ++jj) {
          i += ired[tid][8u * kb + jj];
          m += kred[tid][8u * kb + jj];
        }
        const uint o = rb + (b0 + kb) * BLOCK_BYTES;
        const float dx = uintBitsToFloat(xd[t * n_sb + b0 + kb]);
#if WTYPE == WT_Q6_K
        precise const float dd = w_half(o + 208u) * dx;
        acc = fma_rn(float(i), dd, acc);
#else
        precise const float dd = w_half(o) * dx;
        precise const float dm = w_half(o + 2u) * dx;
        acc = fma_rn(float(i), dd, acc);
        acc = fma_rn(float(-m), dm, acc);
#endif
      }
    }
    barrier();  // ired/kred are rewritten by the next pass
  }
  if (tid < nt) y[(t0 + tid) * pc.y_stride + pc.row0 + r] = acc;
#endif
}
