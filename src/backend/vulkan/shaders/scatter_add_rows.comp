#version 450
// x[idx[first + r]] += w[first + r] * y[r] for r < rows, rows of `width`
// floats: a mixture of experts adds one expert's weighted outputs to the
// residual of the rows routed to it (vulkan_forward.cpp). The table holds
// the row ids, then at `weights` the weights' float bits. One expert's rows
// are distinct, so no two invocations write one element.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer T { int table[]; };

layout(push_constant) uniform PC {
  uint count;    // rows * width
  uint width;
  uint first;    // the expert's first entry
  uint weights;  // where the weights start in `table`
} pc;

void main() {
  const uint i = flat_invocation();
  if (i >= pc.count) return;
  const uint r = i / pc.width;
  const float w = intBitsToFloat(table[pc.weights + pc.first + r]);
  // precise: w * y rounded, then added, as the CPU's combine.
  precise float p = w * y[i];
  const uint at = uint(table[pc.first + r]) * pc.width + i % pc.width;
  x[at] = x[at] + p;
}
