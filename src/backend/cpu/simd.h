// The ISA the CPU kernel sources (kernels.cpp, gemm.cpp, attention.cpp,
// quant_dot.cpp and their private kernels_internal.h; never a public header)
// are compiled for, as SPW_* macros, and the x86 intrinsics where that ISA
// has any.
//
// A kernel variant (kernel_variant.h) is these sources compiled once more
// for a higher ISA than the binary's baseline. Its build passes SPW_CPU_TARGET
// (a GCC target string such as "avx2,fma,f16c") and the SPW_* macros of that
// ISA; each source opens SPW_CPU_KERNELS_BEGIN after its #includes, which
// raises the target of the function definitions that follow, and only
// those. Everything included before it -- the standard library's templates,
// our own inline helpers -- keeps the baseline, so an inline function that
// several variants instantiate (std::vector<float>'s growth, say) never
// carries AVX-512 code into a caller on a CPU without it: the linker keeps
// one copy of it for the whole program. (Compiling the variant's files with
// -mavx512f instead would make that copy's ISA the linker's choice.) GCC's
// C++ front end does not redefine __AVX2__ & co. after a target pragma,
// hence SPW_* rather than the compiler's macros.
//
// Without SPW_CPU_TARGET (the baseline variant, a -march=native build, the
// scalar test builds) the SPW_* macros follow the compiler's own.
//
// GCC 12's AVX-512 intrinsics (_mm512_cvtph_ps, _mm512_reduce_add_ps,
// _mm512_roundscale_ps, ...) use _mm512_undefined_* internally and trip
// -W(maybe-)uninitialized at every inlined call site although the values are
// fully defined; those two warnings are off for the rest of the including
// file.
#pragma once

#include "backend/cpu/variant_ns.h"

#if !defined(SPW_CPU_TARGET)
#if defined(__AVX2__)
#define SPW_AVX2 1
#endif
#if defined(__FMA__)
#define SPW_FMA 1
#endif
#if defined(__F16C__)
#define SPW_F16C 1
#endif
#if defined(__AVX512F__)
#define SPW_AVX512F 1
#endif
#if defined(__AVX512BW__)
#define SPW_AVX512BW 1
#endif
#if defined(__AVX512VL__)
#define SPW_AVX512VL 1
#endif
#if defined(__AVX512VNNI__)
#define SPW_AVX512VNNI 1
#endif
#endif

// gemm.cpp's Q8_0 and Q4_K kernels over the kQ8_0x16 and kQ4_Kx16 layouts
// (packed_weights.h; KernelTraits::q8_0_x16), and the block order of every
// Q8_0 dot product.
#if defined(SPW_AVX512F) && defined(SPW_AVX512VNNI) && defined(SPW_AVX512BW)
#define SPW_Q8_0_X16 1
#endif

// AMX (SPW_AMX_INT8) only ever comes from a variant's build (x86-64-v4-amx),
// never from the compiler's macros: a -march=native build on an AMX CPU
// does not use it, as its use needs the kernel's per-process permission
// that kernel_variant.cpp requests when it chooses that variant.
#if defined(SPW_AMX_INT8) && !defined(SPW_Q8_0_X16)
#error "the AMX variant builds on the AVX-512 VNNI kernels"
#endif

#if defined(SPW_AVX2) || defined(SPW_AVX512F) || defined(SPW_F16C) || defined(SPW_FMA)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define SPW_CPU_DO_PRAGMA(x) _Pragma(#x)
#define SPW_CPU_PRAGMA(x) SPW_CPU_DO_PRAGMA(x)
#if defined(SPW_CPU_TARGET)
#define SPW_CPU_TARGET_PUSH SPW_CPU_DO_PRAGMA(GCC push_options) SPW_CPU_PRAGMA(GCC target(SPW_CPU_TARGET))
#define SPW_CPU_TARGET_POP SPW_CPU_DO_PRAGMA(GCC pop_options)
#else
#define SPW_CPU_TARGET_PUSH
#define SPW_CPU_TARGET_POP
#endif

// Opens the kernel definitions of a source (after its last #include) and
// closes them (at its end): the variant's target and namespace.
// clang-format off
#define SPW_CPU_KERNELS_BEGIN SPW_CPU_TARGET_PUSH namespace spw::cpu { SPW_CPU_NS_BEGIN
#define SPW_CPU_KERNELS_END SPW_CPU_NS_END } SPW_CPU_TARGET_POP
// clang-format on
