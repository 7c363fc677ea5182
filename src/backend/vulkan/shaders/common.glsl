// Shared helpers. Every shader runs 64 invocations per workgroup; work that is
// larger than 65535 groups in x is spread over y (see flat_group()).
#define WG 64

// Index of this workgroup in a 2-D grid flattened row-major (x fastest).
uint flat_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }
uint flat_invocation() { return flat_group() * WG + gl_LocalInvocationID.x; }
