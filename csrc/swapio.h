/* One round of the repeated small swap over TCP (transport/tcp/swap.py): our frame sent
 * to the only peer, the peer's frame polled for with the GIL released, and, when it is
 * exactly the frame expected, its payload reduced into the caller's buffer. What the
 * peer sent is compared with our own header byte for byte and read into a buffer of our
 * size: no length or field of the peer's is trusted. Anything but the plain round (a
 * partial send, another frame first, more bytes behind the frame, a wait past the
 * budget, an error) is left as it stands for Python's regular machinery. */
#ifndef PYC_SWAPIO_H
#define PYC_SWAPIO_H

#include "native.h"

typedef struct {
    size_t sent;    /* bytes of our frame the socket took */
    size_t end;     /* bytes read into rbuf */
    int send_err;   /* the errno of a failed send, else 0 */
    int recv_status;/* 0, -1 (closed by the peer) or the errno of a failed read */
    int spun;       /* the polling budget ran out */
    int landed;     /* the peer's frame, alone, is ours: its payload is in `into` */
} pyc_swap_result;

/* The round itself (no Python objects: testable and fuzzable alone). Sends `head` and
 * `payload` (one sendmsg, non-blocking); if all went, reads into `rbuf` while it holds
 * less than the frame, stopping at a header other than `head`, at the socket's end or
 * error, or once `spin_ns` passed (0: one read). When exactly one frame with our header
 * came, its payload goes to `into` (`nbytes`, aligned) and, given a kernel, into
 * dst = dst op payload. `rbuf_len` >= head_len + nbytes (the caller checks). */
void pyc_swap_round(int fd, const char *head, size_t head_len, const char *payload,
                    size_t nbytes, char *rbuf, size_t rbuf_len, int64_t spin_ns, char *into,
                    char *dst, pyc_kernel kernel, size_t itemsize, pyc_swap_result *r);

/* swap_round(fd, head, payload, rbuf, spin, into, dst, op, dtype)
 *   -> (sent, end, send_err, recv_status, spun, landed) */
PyObject *pyc_mod_swap_round(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#endif
