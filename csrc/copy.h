/* Copies of the arena and the transport that sidestep a slow case of memcpy. glibc copies
 * between a few KiB and its non-temporal threshold with `rep movsb` where the CPU
 * advertises it as fast (ERMS, FSRM). On AMD EPYC (measured in a VM, glibc 2.36) that
 * runs at 2.4-3 GB/s instead of 35-50 GB/s when the destination lies 1-31 bytes past the
 * source modulo 64, from 4 KiB to 256 KiB. numpy puts a large array 16 bytes past a page
 * boundary, so every copy from an arena slot (page aligned) into a caller's buffer was
 * one: the compiled all_reduce of 1 MiB took 670 us in 256 KiB chunks, 140 us in one. */
#ifndef PYC_COPY_H
#define PYC_COPY_H

#include "native.h"

#include <stddef.h>

/* memmove(dst, src, bytes); for regions that do not overlap in the slow case above, by
 * 64-byte blocks of unaligned loads and aligned stores. */
void pyc_copy(void *dst, const void *src, size_t bytes);

/* copy(dst, src): src's bytes into dst, of the same size, as memoryview's assignment
 * (the TCP receive path's copies out of its read buffer, transport/tcp/receiving.py). */
PyObject *pyc_mod_copy(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#endif
