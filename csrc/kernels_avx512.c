/* The kernels for x86-64-v4 (AVX-512 F/BW/DQ/VL); chosen at import when the CPU has them. */
#if defined(__x86_64__)
#pragma GCC target("arch=x86-64-v4")
#define KSET pyc_kernels_avx512
#define KSET_NAME "avx512"
#include "kernels_impl.h"
#endif
