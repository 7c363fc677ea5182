#version 450
// Causal GQA attention over the paged cache, one workgroup per (head, token):
// scores for positions 0..pos (dot(K, q) * scale) go to a scratch row, then a
// max-subtracted softmax (tree reductions) and out[d] = sum_p a_p * V[p][d]
// in position order. Independent of the batch: each (token, head) reads only
// its own q and its own sequence's cache. Rows may belong to several
// sequences: the row table at the head of `bt` (kv_write.comp) gives each
// row its position and where its sequence's block ids start.
//
// EXACT_F64 (devices with float64, CPU builds with AVX2 and FMA): the CPU's
// arithmetic (backend/cpu/attention.cpp) bit for bit, per (token, head): KV
// tiles of 32 positions; a score is dot_f32(k, q) in its order (16 lanes of
// fused steps over the 16-element chunks, pc.tail8: one more 8-element chunk
// into lanes 0..7 as the AVX2 kernel takes it, lanes l and l + 8 added, then
// hsum256's (x0 + x1) + (x2 + x3), then the remaining elements one fused step
// each) times the scale; the tile's maximum, exp_neg(s - m) (attention.cpp's
// steps), tile_sum's fixed tree, the running sum's update, and the output
// rows' fused steps in position order, rescaled when the maximum moved; each
// fused step is exact.glsl's fma_rn. The scores stay in shared memory.
// A sliding window starts at the tile holding the row's lowest position,
// whose earlier positions score -inf (the CPU's tiles from a work item's
// first row add exactly nothing more: attention.h); soft-capping is the
// CPU's tanh_steps (exact.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Q { float q[]; };
// KV_F16: the cache holds halves, two per uint (kv_write.comp), read
// exactly (unpackHalf2x16) and computed with in F32 as the F32 cache is.
#ifdef KV_F16
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
float kval(uint i) { return unpackHalf2x16(kc[i >> 1])[i & 1u]; }
float vval(uint i) { return unpackHalf2x16(vc[i >> 1])[i & 1u]; }
#else
layout(std430, binding = 1) readonly buffer KC { float kc[]; };
layout(std430, binding = 2) readonly buffer VC { float vc[]; };
float kval(uint i) { return kc[i]; }
float vval(uint i) { return vc[i]; }
#endif
layout(std430, binding = 3) readonly buffer BT { int bt[]; };
layout(std430, binding = 4) coherent buffer S { float sc[]; };
layout(std430, binding = 5) writeonly buffer O { float o[]; };

layout(push_constant) uniform PC {
  uint head_dim;
  uint n_head;
  uint n_gqa;
  uint n_kv;
  uint block_tokens;
  uint t0;        // first token of this dispatch (the scratch holds t - t0)
  uint s_stride;  // scratch floats per (token, head)
  uint q_stride;  // floats per token in q and o
  float scale;
  uint tail8;  // EXACT_F64: the CPU's dot order takes an 8-element chunk (AVX2 without AVX-512)
  uint window;    // > 0: a sliding-window layer: positions pos - window < p <= pos only
  float softcap;  // > 0: each scaled score s becomes softcap * tanh(s / softcap) (Gemma 2)
} pc;

#include "exact.glsl"

#ifdef EXACT_F64
#define KV_TILE 32u
shared float ts[KV_TILE];  // a tile's scores, then its weights
shared float run_max, run_sum, tile_m, tile_c;

#else
shared float red[WG];
#endif

uint kv_row(uint boff, uint p, uint kvh) {
  return (uint(bt[boff + p / pc.block_tokens]) * pc.block_tokens + p % pc.block_tokens) * pc.n_kv + kvh * pc.head_dim;
}

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint tl = gl_WorkGroupID.y;
  const uint t = pc.t0 + tl;
  const uint tid = gl_LocalInvocationID.x;
  const uint pos = uint(bt[2u * t]);
  const uint boff = uint(bt[2u * t + 1u]);
  const uint kvh = h / pc.n_gqa;
  const uint qb = t * pc.q_stride + h * pc.head_dim;
  const uint sb = (tl * pc.n_head + h) * pc.s_stride;

#ifdef EXACT_F64
  const uint np = pos + 1u;
  const uint lo = pc.window > 0u && pos + 1u > pc.window ? pos + 1u - pc.window : 0u;  // first position seen
  const uint start = lo / KV_TILE * KV_TILE;
  float acc[4];  // this invocation's output elements d = tid + WG * i (head_dim <= 256)
  for (uint p0 = start; p0 < np; p0 += KV_TILE) {
    const uint len = min(np - p0, KV_TILE);
    const bool first = p0 == start;
    // Positions before the window score -inf unread (their blocks may be
    // given back: KvPool::slide).
    if (tid < len && p0 + tid >= lo) {
      const uint kb = kv_row(boff, p0 + tid, kvh);
      float lane[16];
      for (uint l = 0u; l < 16u; ++l) lane[l] = 0.0;
      uint i0 = 0u;
      for (; i0 + 16u <= pc.head_dim; i0 += 16u)
        for (uint l = 0u; l < 16u; ++l) lane[l] = fma_rn(kval(kb + i0 + l), q[qb + i0 + l], lane[l]);
      if (pc.tail8 != 0u && i0 + 8u <= pc.head_dim) {
        for (uint l = 0u; l < 8u; ++l) lane[l] = fma_rn(kval(kb + i0 + l), q[qb + i0 + l], lane[l]);
        i0 += 8u;
      }
      float y[8];
      for (uint l = 0u; l < 8u; ++l) y[l] = lane[l] + lane[l + 8u];
      const float x0 = y[0] + y[4], x1 = y[1] + y[5], x2 = y[2] + y[6], x3 = y[3] + y[7];
      float d = (x0 + x1) + (x2 + x3);
      for (; i0 < pc.head_dim; ++i0) d = fma_rn(kval(kb + i0), q[qb + i0], d);
      float sv = d * pc.scale;
      if (pc.softcap > 0.0) sv = pc.softcap * tanh_steps(div_rn(sv, pc.softcap));
      ts[tid] = sv;
    } else if (tid < len) {
      ts[tid] = uintBitsToFloat(0xff800000u);
    }
    barrier();
    if (tid == 0u) {
      float tm = ts[0];
      for (uint j = 1u; j < len; ++j) tm = max(tm, ts[j]);
      tile_m = first ? tm : max(run_max, tm);
    }
    barrier();
    if (tid < len) ts[tid] = exp_neg(ts[tid] - tile_m);
    barrier();
    if (tid == 0u) {
      // tile_sum: lane i = s[i] + s[i + 16] (0 past len), then pairwise.
      float h[16];
      for (uint i = 0u; i < 16u; ++i) h[i] = (i < len ? ts[i] : 0.0) + (i + 16u < len ? ts[i + 16u] : 0.0);
      for (uint w = 8u; w >= 1u; w >>= 1)
        for (uint i = 0u; i < w; ++i) h[i] += h[i + w];
      const float m = tile_m;
      float c = 1.0;
      if (first) {
        run_sum = h[0];
      } else if (m != run_max) {
        c = exp_neg(run_max - m);
        run_sum = fma_rn(run_sum, c, h[0]);
      } else {
        run_sum += h[0];
      }
      run_max = m;
      tile_c = c;
    }
    barrier();
    for (uint i = 0u; i < 4u; ++i) {
      const uint d = tid + WG * i;
      if (d >= pc.head_dim) break;
      float a = first ? 0.0 : acc[i];
      if (!first && tile_c != 1.0) a *= tile_c;
      for (uint j = p0 < lo ? lo - p0 : 0u; j < len; ++j)
        a = fma_rn(ts[j], vval(kv_row(boff, p0 + j, kvh) + d), a);
      acc[i] = a;
    }
    barrier();  // ts is the next tile's
  }
  const float inv = div_rn(1.0, run_sum);
  for (uint i = 0u; i < 4u; ++i) {
    const uint d = tid + WG * i;
    if (d < pc.head_dim) o[qb + d] = acc[i] * inv;
  }
}
#else
  // A sliding window: positions lo..pos (sc indexed by position still).
  const uint lo = pc.window > 0u && pos + 1u > pc.window ? pos + 1u - pc.window : 0u;
  float mx = -3.402823466e38;
  for (uint p = lo + tid; p <= pos; p += WG) {
    const uint kb = kv_row(boff, p, kvh);
    float s = 0.0;
    for (uint d = 0u; d < pc.head_dim; ++d) s = fma(kval(kb + d), q[qb + d], s);
    s *= pc.scale;
    if (pc.softcap > 0.0) s = pc.softcap * tanh(s / pc.softcap);
    sc[sb + p] = s;
    mx = max(mx, s);
  }
  red[tid] = mx;
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] = max(red[tid], red[tid + k]);
    barrier();
  }
  mx = red[0];
  barrier();
  float sum = 0.0;
  for (uint p = lo + tid; p <= pos; p += WG) {
    const float e = exp(sc[sb + p] - mx);
    sc[sb + p] = e;
    sum += e;
  }
  red[tid] = sum;
  memoryBarrierBuffer();
  barrier();
  for (uint k = WG / 2u; k > 0u; k >>= 1) {
    if (tid < k) red[tid] += red[tid + k];
    barrier();
  }
  const float inv = 1.0 / red[0];
  for (uint d = tid; d < pc.head_dim; d += WG) {
    float acc = 0.0;
    for (uint p = lo; p <= pos; ++p) acc = fma(sc[sb + p] * inv, vval(kv_row(boff, p, kvh) + d), acc);
    o[qb + d] = acc;
  }
}
#endif
