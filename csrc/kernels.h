/* Fused reductions of m inputs: out[i] = s[0][i] op s[1][i] op ... op s[m-1][i], folded in
 * input order (rank order), so every rank that runs the same kernel on the same inputs
 * gets the same bits. float16 and bfloat16 are widened to float32 for the whole fold and
 * rounded once at the end. `avg` > 0 turns a SUM into AVG exactly as
 * pycollective._reduce_ops.finish_average does it (sum rounded to the type, then divided
 * in the type), so a fused AVG and "SUM, then finish_average" give the same bits.
 *
 * Codes are the wire codes of _dtypes.py and the values of _reduce_ops.ReduceOp. */
#ifndef PYC_KERNELS_H
#define PYC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum {
    DT_F16 = 1, DT_F32, DT_F64, DT_I8, DT_I16, DT_I32, DT_I64,
    DT_U8, DT_U16, DT_U32, DT_U64, DT_BOOL, DT_C64, DT_C128, DT_BF16, DT_BYTE,
    DT_COUNT
};
enum { OP_SUM = 0, OP_PRODUCT, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR, OP_AVG, OP_COUNT };

/* out may be one of the inputs (same start); inputs and out may be unaligned. */
typedef void (*pyc_kernel)(void *out, const void *const *src, int m, size_t n, int64_t avg);

typedef struct {
    const char *name;
    pyc_kernel table[DT_COUNT][OP_COUNT]; /* NULL: op undefined on that dtype */
} pyc_kernel_set;

extern const pyc_kernel_set pyc_kernels_generic;
#if defined(__x86_64__)
extern const pyc_kernel_set pyc_kernels_avx2;
extern const pyc_kernel_set pyc_kernels_avx512;
#endif

int pyc_itemsize(int dtype); /* 0 for an unknown code */

#endif
