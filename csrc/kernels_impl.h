/* The kernel set, compiled once per instruction set: the including file defines KSET
 * (the set's name) and KSET_NAME, and may set a target pragma first. Everything here is
 * plain C that the compiler vectorises; the build turns FMA contraction off, so every set
 * computes the same bits.
 *
 * Each kernel works in blocks of BLK elements: the block's accumulator stays in L1 while
 * the m inputs stream past it, and the output is written only after every input of the
 * block was read (so out may be one of the inputs). */
#include <string.h>

#include "kernels.h"

#define BLK 1024

/* Element types that may sit at any address (a numpy view can start at an odd byte). */
typedef uint8_t u8_u __attribute__((aligned(1)));
typedef uint16_t u16_u __attribute__((aligned(1)));
typedef uint32_t u32_u __attribute__((aligned(1)));
typedef uint64_t u64_u __attribute__((aligned(1)));
typedef int8_t i8_u __attribute__((aligned(1)));
typedef int16_t i16_u __attribute__((aligned(1)));
typedef int32_t i32_u __attribute__((aligned(1)));
typedef int64_t i64_u __attribute__((aligned(1)));
typedef float f32_u __attribute__((aligned(1)));
typedef double f64_u __attribute__((aligned(1)));

static inline uint32_t as_u32(float f) { union { float f; uint32_t u; } v = {.f = f}; return v.u; }
static inline float as_f32(uint32_t u) { union { uint32_t u; float f; } v = {.u = u}; return v.f; }

/* float16 <-> float32 exactly as numpy converts (its software routines): round to
 * nearest even, NaN payloads kept (truncated, never quietened), no dependence on the
 * FPU's denormal modes. Branch-free so that it vectorises. */
static inline float f16_load(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t normal = ((e + 112u) << 23) | (mant << 13);
    uint32_t infnan = 0x7f800000u | (mant << 13);
    uint32_t sub = as_u32((float)(int32_t)mant * 0x1p-24f); /* exact; 0 for mant == 0 */
    uint32_t bits = e == 31u ? infnan : (e == 0u ? sub : normal);
    return as_f32(bits | sign);
}

static inline uint16_t f16_store(float f)
{
    uint32_t x = as_u32(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint32_t e = x >> 23;
    uint32_t payload = (x & 0x7fffffu) >> 13;
    uint32_t nan = 0x7c00u | (payload ? payload : 1u);
    uint32_t norm = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t s = e < 113u ? 126u - e : 14u;
    s = s > 31u ? 31u : s;
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    q += (rem > half) | ((rem == half) & q & 1u);
    uint32_t r = x > 0x7f800000u ? nan : (x >= 0x477ff000u ? 0x7c00u : (e >= 113u ? norm : q));
    return (uint16_t)(r | sign);
}

/* bfloat16 <-> float32 as _reduce_ops does it: widen by a shift, round to nearest even,
 * NaNs quietened with their sign and top payload bits kept. */
static inline float bf16_load(uint16_t h) { return as_f32((uint32_t)h << 16); }

static inline uint16_t bf16_store(float f)
{
    uint32_t u = as_u32(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

#define ID(x) (x)
#define F_SUM(a, b) ((a) + (b))
#define F_PROD(a, b) ((a) * (b))
/* np.minimum / np.maximum: a NaN on either side wins (the first if both), ties give b. */
#define F_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define F_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define I_MIN(a, b) ((a) < (b) ? (a) : (b))
#define I_MAX(a, b) ((a) > (b) ? (a) : (b))
#define B_AND(a, b) ((a) & (b))
#define B_OR(a, b) ((a) | (b))
#define B_XOR(a, b) ((a) ^ (b))
#define BOOL_LD(x) ((uint8_t)((x) != 0))

/* Where FIN only stores the accumulator as it is (no rounding to a narrower type, no
 * division), two inputs are combined straight into out: one pass instead of two (the
 * block's second pass through acc cost a third of a 1 MiB float32 sum). Each FIN names
 * what FOLD does first: PAIR's functions and their call, or nothing. */
#define PAIR_FIN_F32 PAIR
#define PAIR_FIN_ID PAIR
#define PAIR_NONE(FN, UT, A, LD, OPX)
#define PAIR_FIN_F16 PAIR_NONE
#define PAIR_FIN_BF16 PAIR_NONE
#define PAIR_FIN_AVG_F32 PAIR_NONE
#define PAIR_FIN_AVG_F64 PAIR_NONE
#define PAIR_FIN_AVG_F16 PAIR_NONE
#define PAIR_FIN_AVG_BF16 PAIR_NONE
#define PAIR_FIN_AVG_INT PAIR_NONE
#define TRY_PAIR(FN, UT, out, src, m, n)                                                   \
    if ((m) == 2 && FN##_pair(out, (const UT *)(src)[0], (const UT *)(src)[1], n))         \
        return;
#define TRY_PAIR_FIN_F32 TRY_PAIR
#define TRY_PAIR_FIN_ID TRY_PAIR
#define TRY_NONE(FN, UT, out, src, m, n)
#define TRY_PAIR_FIN_F16 TRY_NONE
#define TRY_PAIR_FIN_BF16 TRY_NONE
#define TRY_PAIR_FIN_AVG_F32 TRY_NONE
#define TRY_PAIR_FIN_AVG_F64 TRY_NONE
#define TRY_PAIR_FIN_AVG_F16 TRY_NONE
#define TRY_PAIR_FIN_AVG_BF16 TRY_NONE
#define TRY_PAIR_FIN_AVG_INT TRY_NONE

/* out[i] = OPX(a[i], b[i]) where out is a, or is b, or overlaps neither: each case with
 * restrict pointers, so that the compiler vectorises it without run-time alias checks
 * (which give up on the in-place case). Element i is read before it is written. */
#define PAIR(FN, UT, A, LD, OPX)                                                           \
    static void FN##_inplace(UT *restrict o, const UT *restrict b, size_t n)               \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            o[i] = (A)OPX(LD(o[i]), LD(b[i]));                                             \
    }                                                                                      \
    static void FN##_inplace_r(UT *restrict o, const UT *restrict a, size_t n)             \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            o[i] = (A)OPX(LD(a[i]), LD(o[i]));                                             \
    }                                                                                      \
    static void FN##_apart(UT *restrict o, const UT *restrict a, const UT *restrict b,     \
                           size_t n)                                                       \
    {                                                                                      \
        for (size_t i = 0; i < n; i++)                                                     \
            o[i] = (A)OPX(LD(a[i]), LD(b[i]));                                             \
    }                                                                                      \
    static int FN##_pair(UT *o, const UT *a, const UT *b, size_t n)                        \
    {                                                                                      \
        const char *oc = (const char *)o, *end = oc + n * sizeof(UT);                      \
        const char *ac = (const char *)a, *bc = (const char *)b;                           \
        int a_apart = ac + n * sizeof(UT) <= oc || end <= ac;                              \
        int b_apart = bc + n * sizeof(UT) <= oc || end <= bc;                              \
        if (oc == ac && b_apart)                                                           \
            FN##_inplace(o, b, n);                                                         \
        else if (oc == bc && a_apart)                                                      \
            FN##_inplace_r(o, a, n);                                                       \
        else if (a_apart && b_apart)                                                       \
            FN##_apart(o, a, b, n);                                                        \
        else                                                                               \
            return 0; /* a partial overlap (no caller's): the blocks' way, as before */    \
        return 1;                                                                          \
    }

/* A fold of m inputs into acc[], block by block, then FIN(out + i0, acc, b, avg). */
#define FOLD(FN, UT, A, LD, OPX, FIN)                                                      \
    PAIR_##FIN(FN, UT, A, LD, OPX)                                                         \
    static void FN(void *out_, const void *const *src, int m, size_t n, int64_t avg)       \
    {                                                                                      \
        UT *out = (UT *)out_;                                                              \
        A acc[BLK];                                                                        \
        (void)avg;                                                                         \
        TRY_PAIR_##FIN(FN, UT, out, src, m, n)                                             \
        for (size_t i0 = 0; i0 < n; i0 += BLK) {                                           \
            size_t b = n - i0 < BLK ? n - i0 : BLK;                                        \
            const UT *s0 = (const UT *)src[0] + i0;                                        \
            if (m >= 2) {                                                                  \
                const UT *s1 = (const UT *)src[1] + i0;                                    \
                for (size_t i = 0; i < b; i++)                                             \
                    acc[i] = OPX(LD(s0[i]), LD(s1[i]));                                    \
            } else {                                                                       \
                for (size_t i = 0; i < b; i++)                                             \
                    acc[i] = LD(s0[i]);                                                    \
            }                                                                              \
            for (int k = 2; k < m; k++) {                                                  \
                const UT *s = (const UT *)src[k] + i0;                                     \
                for (size_t i = 0; i < b; i++)                                             \
                    acc[i] = OPX(acc[i], LD(s[i]));                                        \
            }                                                                              \
            FIN(out + i0, acc, b, avg);                                                    \
        }                                                                                  \
    }

#define STORE_WITH(ST, o_, a_, b_) for (size_t i = 0; i < (b_); i++) (o_)[i] = ST((a_)[i]);
#define FIN_F32(o_, a_, b_, avg) do { STORE_WITH(ID, o_, a_, b_) } while (0)
#define FIN_F16(o_, a_, b_, avg) do { STORE_WITH(f16_store, o_, a_, b_) } while (0)
#define FIN_BF16(o_, a_, b_, avg) do { STORE_WITH(bf16_store, o_, a_, b_) } while (0)
#define FIN_ID(o_, a_, b_, avg) do { STORE_WITH(ID, o_, a_, b_) } while (0)

/* AVG: the sum rounded to the type, then divided in the type (finish_average's steps). */
#define FIN_AVG_F32(o_, a_, b_, avg) do {                                                  \
        if ((avg) > 1) { float d_ = (float)(avg);                                          \
            for (size_t i = 0; i < (b_); i++) (o_)[i] = (a_)[i] / d_; }                          \
        else { STORE_WITH(ID, o_, a_, b_) } } while (0)
#define FIN_AVG_F64(o_, a_, b_, avg) do {                                                  \
        if ((avg) > 1) { double d_ = (double)(avg);                                        \
            for (size_t i = 0; i < (b_); i++) (o_)[i] = (a_)[i] / d_; }                          \
        else { STORE_WITH(ID, o_, a_, b_) } } while (0)
#define FIN_AVG_F16(o_, a_, b_, avg) do {                                                  \
        if ((avg) > 1) { float d_ = (float)(avg);                                          \
            for (size_t i = 0; i < (b_); i++) (o_)[i] = f16_store(f16_load(f16_store((a_)[i])) / d_); } \
        else { STORE_WITH(f16_store, o_, a_, b_) } } while (0)
#define FIN_AVG_BF16(o_, a_, b_, avg) do {                                                 \
        if ((avg) > 1) { float d_ = (float)(avg);                                          \
            for (size_t i = 0; i < (b_); i++) (o_)[i] = bf16_store(bf16_load(bf16_store((a_)[i])) / d_); } \
        else { STORE_WITH(bf16_store, o_, a_, b_) } } while (0)
/* Integers: C's division truncates toward zero, as finish_average does; in the common
 * type of the element and the divisor (int64, or uint64 for uint64 elements), whose
 * quotient fits the element's type. */
#define AVG_T(a_, avg) __typeof__((a_)[0] + (avg))
#define FIN_AVG_INT(o_, a_, b_, avg) do {                                                  \
        if ((avg) > 1) { for (size_t i = 0; i < (b_); i++)                                 \
            (o_)[i] = (__typeof__((a_)[0]))((AVG_T(a_, avg))(a_)[i] / (AVG_T(a_, avg))(avg)); } \
        else { STORE_WITH(ID, o_, a_, b_) } } while (0)

/* ---- floating point ---- */
#define FLOATS(P, UT, A, LD, FIN, FIN_AVG)                                                 \
    FOLD(P##_sum, UT, A, LD, F_SUM, FIN)                                                   \
    FOLD(P##_prod, UT, A, LD, F_PROD, FIN)                                                 \
    FOLD(P##_min, UT, A, LD, F_MIN, FIN)                                                   \
    FOLD(P##_max, UT, A, LD, F_MAX, FIN)                                                   \
    FOLD(P##_avg, UT, A, LD, F_SUM, FIN_AVG)

#if defined(__F16C__)
/* float16 with the CPU's converters (8 lanes at a time). They round like numpy's software
 * routines but quieten signalling NaNs, so lanes whose result is NaN are folded again in
 * software: every NaN lane's input or result is a NaN, so the others are exact. */
#include <immintrin.h>

static inline void f16_widen_block(float *dst, const u16_u *src, size_t b)
{
    size_t i = 0;
    for (; i + 8 <= b; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < b; i++)
        dst[i] = f16_load(src[i]);
}

static inline void f16_narrow_block(uint16_t *dst, const float *src, size_t b)
{
    size_t i = 0;
    for (; i + 8 <= b; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < b; i++)
        dst[i] = f16_store(src[i]);
}

static inline uint16_t f16_finish(float acc, int64_t avg)
{
    return avg > 1 ? f16_store(f16_load(f16_store(acc)) / (float)avg) : f16_store(acc);
}

#define FOLD_F16HW(FN, OPX, AVG)                                                           \
    static void FN(void *out_, const void *const *src, int m, size_t n, int64_t avg)       \
    {                                                                                      \
        u16_u *out = (u16_u *)out_;                                                        \
        float acc[BLK], tmp[BLK];                                                          \
        uint16_t res[BLK];                                                                 \
        if (!(AVG))                                                                        \
            avg = 0;                                                                       \
        for (size_t i0 = 0; i0 < n; i0 += BLK) {                                           \
            size_t b = n - i0 < BLK ? n - i0 : BLK;                                        \
            f16_widen_block(acc, (const u16_u *)src[0] + i0, b);                           \
            for (int k = 1; k < m; k++) {                                                  \
                f16_widen_block(tmp, (const u16_u *)src[k] + i0, b);                       \
                for (size_t i = 0; i < b; i++)                                             \
                    acc[i] = OPX(acc[i], tmp[i]);                                          \
            }                                                                              \
            int nan = 0;                                                                   \
            for (size_t i = 0; i < b; i++)                                                 \
                nan |= acc[i] != acc[i];                                                   \
            if (avg > 1) {                                                                 \
                f16_narrow_block(res, acc, b);                                             \
                f16_widen_block(acc, res, b);                                              \
                for (size_t i = 0; i < b; i++)                                             \
                    acc[i] = acc[i] / (float)avg;                                          \
            }                                                                              \
            f16_narrow_block(res, acc, b);                                                 \
            if (nan) {                                                                     \
                for (size_t i = 0; i < b; i++) {                                           \
                    if ((res[i] & 0x7fffu) <= 0x7c00u)                                     \
                        continue;                                                          \
                    float x = f16_load(((const u16_u *)src[0])[i0 + i]);                   \
                    for (int k = 1; k < m; k++)                                            \
                        x = OPX(x, f16_load(((const u16_u *)src[k])[i0 + i]));             \
                    res[i] = f16_finish(x, avg);                                           \
                }                                                                          \
            }                                                                              \
            memcpy(out + i0, res, b * sizeof *res);                                        \
        }                                                                                  \
    }

FOLD_F16HW(f16_sum, F_SUM, 0)
FOLD_F16HW(f16_prod, F_PROD, 0)
FOLD_F16HW(f16_min, F_MIN, 0)
FOLD_F16HW(f16_max, F_MAX, 0)
FOLD_F16HW(f16_avg, F_SUM, 1)
#else
FLOATS(f16, u16_u, float, f16_load, FIN_F16, FIN_AVG_F16)
#endif
FLOATS(bf16, u16_u, float, bf16_load, FIN_BF16, FIN_AVG_BF16)
FLOATS(f32, f32_u, float, ID, FIN_F32, FIN_AVG_F32)
FLOATS(f64, f64_u, double, ID, FIN_F32, FIN_AVG_F64)

/* ---- integers: wrap-around sums and products in unsigned arithmetic (as numpy) ---- */
#define INTS(P, UT, T, U, W)                                                               \
    static inline T P##_add(T a, T b) { return (T)(U)((U)a + (U)b); }                      \
    static inline T P##_mul(T a, T b) { return (T)(U)((W)(U)a * (W)(U)b); }                \
    FOLD(P##_sum, UT, T, ID, P##_add, FIN_ID)                                              \
    FOLD(P##_prod, UT, T, ID, P##_mul, FIN_ID)                                             \
    FOLD(P##_min, UT, T, ID, I_MIN, FIN_ID)                                                \
    FOLD(P##_max, UT, T, ID, I_MAX, FIN_ID)                                                \
    FOLD(P##_band, UT, T, ID, B_AND, FIN_ID)                                               \
    FOLD(P##_bor, UT, T, ID, B_OR, FIN_ID)                                                 \
    FOLD(P##_bxor, UT, T, ID, B_XOR, FIN_ID)                                               \
    FOLD(P##_avg, UT, T, ID, P##_add, FIN_AVG_INT)

INTS(i8, i8_u, int8_t, uint8_t, uint32_t)
INTS(i16, i16_u, int16_t, uint16_t, uint32_t)
INTS(i32, i32_u, int32_t, uint32_t, uint32_t)
INTS(i64, i64_u, int64_t, uint64_t, uint64_t)
INTS(u8, u8_u, uint8_t, uint8_t, uint32_t)
INTS(u16, u16_u, uint16_t, uint16_t, uint32_t)
INTS(u32, u32_u, uint32_t, uint32_t, uint32_t)
INTS(u64, u64_u, uint64_t, uint64_t, uint64_t)

/* ---- bool: numpy's logical ops, results 0 or 1 ---- */
FOLD(bool_or, u8_u, uint8_t, BOOL_LD, B_OR, FIN_ID)
FOLD(bool_and, u8_u, uint8_t, BOOL_LD, B_AND, FIN_ID)
FOLD(bool_xor, u8_u, uint8_t, BOOL_LD, B_XOR, FIN_ID)

/* ---- complex: sums componentwise; products by the textbook formula (no FMA); AVG
 * divides by (avg + 0j) with Smith's method, the steps numpy's complex divide takes ---- */
#define COMPLEX(P, R, RU)                                                                  \
    static void P##_sum(void *out, const void *const *src, int m, size_t n, int64_t avg)   \
    {                                                                                      \
        R##_sum(out, src, m, 2 * n, 0);                                                    \
        (void)avg;                                                                         \
    }                                                                                      \
    static void P##_avg(void *out, const void *const *src, int m, size_t n, int64_t avg)   \
    {                                                                                      \
        R##_sum(out, src, m, 2 * n, 0);                                                    \
        if (avg > 1) {                                                                     \
            RU *o = (RU *)out;                                                             \
            const R##_t br = (R##_t)avg, bi = 0;                                           \
            const R##_t rat = bi / br, scl = (R##_t)1 / (br + bi * rat);                   \
            for (size_t i = 0; i < n; i++) {                                               \
                R##_t ar = o[2 * i], ai = o[2 * i + 1];                                    \
                o[2 * i] = (ar + ai * rat) * scl;                                          \
                o[2 * i + 1] = (ai - ar * rat) * scl;                                      \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    static void P##_prod(void *out_, const void *const *src, int m, size_t n, int64_t avg) \
    {                                                                                      \
        RU *out = (RU *)out_;                                                              \
        R##_t re[BLK], im[BLK];                                                            \
        (void)avg;                                                                         \
        for (size_t i0 = 0; i0 < n; i0 += BLK) {                                           \
            size_t b = n - i0 < BLK ? n - i0 : BLK;                                        \
            const RU *s0 = (const RU *)src[0] + 2 * i0;                                    \
            for (size_t i = 0; i < b; i++) {                                               \
                re[i] = s0[2 * i];                                                         \
                im[i] = s0[2 * i + 1];                                                     \
            }                                                                              \
            for (int k = 1; k < m; k++) {                                                  \
                const RU *s = (const RU *)src[k] + 2 * i0;                                 \
                for (size_t i = 0; i < b; i++) {                                           \
                    R##_t br = s[2 * i], bi = s[2 * i + 1], ar = re[i], ai = im[i];        \
                    re[i] = ar * br - ai * bi;                                             \
                    im[i] = ar * bi + ai * br;                                             \
                }                                                                          \
            }                                                                              \
            for (size_t i = 0; i < b; i++) {                                               \
                out[2 * (i0 + i)] = re[i];                                                 \
                out[2 * (i0 + i) + 1] = im[i];                                             \
            }                                                                              \
        }                                                                                  \
    }

typedef float f32_t;
typedef double f64_t;
COMPLEX(c64, f32, f32_u)
COMPLEX(c128, f64, f64_u)

#define FLOAT_ROW(P) {[OP_SUM] = P##_sum, [OP_PRODUCT] = P##_prod, [OP_MIN] = P##_min,      \
                      [OP_MAX] = P##_max, [OP_AVG] = P##_avg}
#define INT_ROW(P) {[OP_SUM] = P##_sum, [OP_PRODUCT] = P##_prod, [OP_MIN] = P##_min,        \
                    [OP_MAX] = P##_max, [OP_BAND] = P##_band, [OP_BOR] = P##_bor,           \
                    [OP_BXOR] = P##_bxor, [OP_AVG] = P##_avg}
#define BOOL_ROW {[OP_SUM] = bool_or, [OP_PRODUCT] = bool_and, [OP_MIN] = bool_and,         \
                  [OP_MAX] = bool_or, [OP_BAND] = bool_and, [OP_BOR] = bool_or,             \
                  [OP_BXOR] = bool_xor}
#define COMPLEX_ROW(P) {[OP_SUM] = P##_sum, [OP_PRODUCT] = P##_prod, [OP_AVG] = P##_avg}

const pyc_kernel_set KSET = {
    KSET_NAME,
    {
        [DT_F16] = FLOAT_ROW(f16),
        [DT_BF16] = FLOAT_ROW(bf16),
        [DT_F32] = FLOAT_ROW(f32),
        [DT_F64] = FLOAT_ROW(f64),
        [DT_I8] = INT_ROW(i8),
        [DT_I16] = INT_ROW(i16),
        [DT_I32] = INT_ROW(i32),
        [DT_I64] = INT_ROW(i64),
        [DT_U8] = INT_ROW(u8),
        [DT_U16] = INT_ROW(u16),
        [DT_U32] = INT_ROW(u32),
        [DT_U64] = INT_ROW(u64),
        [DT_BYTE] = INT_ROW(u8),
        [DT_BOOL] = BOOL_ROW,
        [DT_C64] = COMPLEX_ROW(c64),
        [DT_C128] = COMPLEX_ROW(c128),
    },
};
