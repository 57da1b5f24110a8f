/* The kernels for x86-64-v3 (AVX2, FMA, F16C); chosen at import when the CPU has them.
 * FMA contraction is off for the whole build (-ffp-contract=off), so the results are
 * those of the generic kernels, bit for bit. */
#if defined(__x86_64__)
#if defined(__clang__) /* clang ignores GCC's target pragma: an attribute on every function */
#pragma clang attribute push(__attribute__((target("arch=x86-64-v3"))), apply_to = function)
#else
#pragma GCC target("arch=x86-64-v3")
#endif
#define KSET pyc_kernels_avx2
#define KSET_NAME "avx2"
#include "kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
