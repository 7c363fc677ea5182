// A kernel variant's table of entry points (kernel_table.h), compiled with
// the variant's other sources: inside its namespace the plain names are the
// variant's own functions. Compiled for the baseline ISA (no
// SPW_CPU_KERNELS_BEGIN): listing a variant's entry points must be safe on a
// CPU that cannot run them.
#include "backend/cpu/kernel_table.h"

#include "backend/cpu/simd.h"

namespace spw::cpu {
SPW_CPU_NS_BEGIN

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    t.isa =
        ""
#if defined(SPW_AMX_INT8)
        "amx-int8 "
#endif
#if defined(SPW_AVX512VNNI)
        "avx512vnni "
#endif
#if defined(SPW_AVX512F)
        "avx512f "
#endif
#if defined(SPW_AVX512BW)
        "avx512bw "
#endif
#if defined(SPW_AVX512VL)
        "avx512vl "
#endif
#if defined(SPW_AVX2)
        "avx2 "
#endif
#if defined(SPW_FMA)
        "fma "
#endif
#if defined(SPW_F16C)
        "f16c "
#endif
        ;
#if defined(SPW_Q8_0_X16)
    t.traits.q8_0_x16 = true;
#endif
#if defined(SPW_AVX2) && defined(SPW_FMA)
    t.traits.fused_dot_order = true;
#if !defined(SPW_AVX512F)
    t.traits.dot_tail8 = true;  // kernels.cpp's dot_f32: the AVX2 form's 8-element chunk
#endif
#endif
#define SPW_CPU_TABLE_FILL(ret, name, member, params, args) t.member = static_cast<ret(*) params>(&name);
    SPW_CPU_KERNEL_LIST(SPW_CPU_TABLE_FILL)
#undef SPW_CPU_TABLE_FILL
    return t;
  }();
  return table;
}

SPW_CPU_NS_END
}  // namespace spw::cpu
