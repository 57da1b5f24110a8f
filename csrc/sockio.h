/* A TCP payload read and reduced as it arrives: the cross-host reduction's inner loop
 * (transport/tcp/receiving.py), with the GIL released. Reads what is there from a
 * non-blocking socket into a small cache-sized buffer and combines each read's whole
 * items into the destination while they are hot, with the arena's kernels. How much is
 * read is bounded by what our side expects (the destination's length), never by anything
 * a peer sent: the framing, matching, aborts and time-outs stay Python's. */
#ifndef PYC_SOCKIO_H
#define PYC_SOCKIO_H

#include "native.h"

/* The loop itself (no Python objects, so fuzzable and testable alone): combine the
 * payload bytes read from `fd` into `dst` (`dst_len` bytes: the rest of the payload,
 * whose first `*have` bytes are already in `scratch`), reading through `scratch`
 * (`scratch_len` bytes), until the socket has nothing more, the payload is in or
 * `budget` bytes were read. *have is left with the bytes of a split item (< itemsize).
 * Returns 0, -1 if the peer closed the connection, or the errno of a failed read;
 * *nread and *reduced say how far it got either way. */
int pyc_recv_reduce(int fd, char *dst, size_t dst_len, char *scratch, size_t scratch_len,
                    size_t *have, pyc_kernel kernel, size_t itemsize, size_t budget,
                    size_t *nread, size_t *reduced);

/* recv_reduce(fd, dst, scratch, have, op, dtype, budget) -> (read, reduced, have, status) */
PyObject *pyc_mod_recv_reduce(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#endif
