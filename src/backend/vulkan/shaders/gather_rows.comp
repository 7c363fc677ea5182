#version 450
// dst[r] = src[idx[first + r]] for r < rows, rows of `width` floats: a
// mixture of experts gathers the rows routed to one expert (vulkan_forward.cpp).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer S { float src[]; };
layout(std430, binding = 1) writeonly buffer D { float dst[]; };
layout(std430, binding = 2) readonly buffer T { int table[]; };

layout(push_constant) uniform PC {
  uint count;  // rows * width
  uint width;
  uint first;  // the expert's first entry of the row ids in `table`
} pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.count) return;
  const uint r = i / pc.width;
  dst[i] = src[uint(table[pc.first + r]) * pc.width + i % pc.width];
}
