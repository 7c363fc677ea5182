// The kernel headers' plain functions (spw::cpu::matmul, ...): each calls the
// chosen variant's (kernel_variant.h). An indirect call per kernel call --
// a matmul, a layer's norm -- never per element: the kernels call each other
// directly inside their variant.
#include "backend/cpu/kernel_table.h"

namespace spw::cpu {

#define SPW_CPU_FORWARD(ret, name, member, params, args) \
  ret name params { return active_kernel_table().member args; }
SPW_CPU_KERNEL_LIST(SPW_CPU_FORWARD)
#undef SPW_CPU_FORWARD

}  // namespace spw::cpu
