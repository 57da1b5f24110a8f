/* Copies that sidestep memcpy's slow skewed case (see copy.h). */
#include "copy.h"

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* Below this glibc copies with vector moves, which have no such case (2 KiB: 92-98 GB/s
 * at either skew, measured). */
#define BLOCKS_FROM 2048

void pyc_copy(void *dst, const void *src, size_t bytes)
{
    const char *dc = dst, *sc = src;
    if (dc < sc + bytes && sc < dc + bytes) { /* overlapping: memmove's order matters */
        memmove(dst, src, bytes);
        return;
    }
#if defined(__x86_64__)
    const uintptr_t skew = ((uintptr_t)dst - (uintptr_t)src) & 63;
    if (bytes > BLOCKS_FROM && skew != 0 && skew < 32) {
        char *d = dst;
        const char *s = src;
        const size_t head = (64 - ((uintptr_t)d & 63)) & 63;
        memcpy(d, s, head);
        d += head, s += head, bytes -= head;
        /* intrinsics, not a loop of memcpy(d, s, 64): the compiler may fold such a loop
         * back into one memcpy call */
        for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)s);
            __m128i x1 = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_store_si128((__m128i *)d, x0);
            _mm_store_si128((__m128i *)(d + 16), x1);
            _mm_store_si128((__m128i *)(d + 32), x2);
            _mm_store_si128((__m128i *)(d + 48), x3);
        }
        memcpy(d, s, bytes);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

PyObject *pyc_mod_copy(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy(dst, src)");
        return NULL;
    }
    Py_buffer dst, src;
    if (pyc_get_buffer(args[0], &dst, 1, "copy's dst") < 0)
        return NULL;
    if (pyc_get_buffer(args[1], &src, 0, "copy's src") < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (dst.len != src.len)
        PyErr_Format(PyExc_ValueError, "copy: dst has %zd bytes, src %zd", dst.len, src.len);
    else
        pyc_copy(dst.buf, src.buf, (size_t)dst.len);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}
