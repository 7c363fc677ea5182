// The x86 intrinsics the CPU kernels use, where the target has them, for the
// kernel sources only (kernels.cpp, attention.cpp; never a public header).
// GCC 12's AVX-512 intrinsics (_mm512_cvtph_ps, _mm512_reduce_add_ps,
// _mm512_roundscale_ps, ...) use _mm512_undefined_* internally and trip
// -W(maybe-)uninitialized at every inlined call site although the values are
// fully defined; those two warnings are off for the rest of the including
// file.
#pragma once

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
