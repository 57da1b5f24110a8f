/* The kernels for x86-64-v4 (AVX-512 F/BW/DQ/VL); chosen at import when the CPU has them. */
#if defined(__x86_64__)
#if defined(__clang__) /* clang ignores GCC's target pragma: an attribute on every function */
#pragma clang attribute push(__attribute__((target("arch=x86-64-v4"))), apply_to = function)
#else
#pragma GCC target("arch=x86-64-v4")
#endif
#define KSET pyc_kernels_avx512
#define KSET_NAME "avx512"
#include "kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
