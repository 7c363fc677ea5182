// The namespace of one kernel variant's functions (kernel_variant.h).
//
// The kernel headers (kernels.h, attention.h, quant_dot.h) declare their
// functions between SPW_CPU_NS_BEGIN and SPW_CPU_NS_END. A variant's build
// defines SPW_CPU_VARIANT (e.g. x86_64_v3): its sources then declare and
// define spw::cpu::x86_64_v3::matmul & co. in an inline namespace, so the
// kernels' calls to each other stay direct calls inside the variant, and
// several variants link into one binary. Everything else sees the plain
// declarations, spw::cpu::matmul, which kernel_dispatch.cpp defines to call
// the chosen variant. The types of those headers stay outside: every variant
// shares them. (Without SPW_CPU_VARIANT, as in the scalar test builds that
// compile the sources straight in, the sources define the plain names.)
#pragma once

#if defined(SPW_CPU_VARIANT)
#define SPW_CPU_NS_BEGIN inline namespace SPW_CPU_VARIANT {
#define SPW_CPU_NS_END }
#else
#define SPW_CPU_NS_BEGIN
#define SPW_CPU_NS_END
#endif
