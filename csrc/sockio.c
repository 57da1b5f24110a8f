/* A TCP payload read and reduced as it arrives (see sockio.h). */
#include "sockio.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>

int pyc_recv_reduce(int fd, char *dst, size_t dst_len, char *scratch, size_t scratch_len,
                    size_t *have, pyc_kernel kernel, size_t itemsize, size_t budget,
                    size_t *nread, size_t *reduced)
{
    size_t off = 0, got = 0, held = *have;
    int status = 0;
    for (;;) {
        /* combine the whole items held, keep the split one's bytes at the front */
        size_t whole = held - held % itemsize;
        if (whole) {
            const void *src[2] = {dst + off, scratch};
            kernel(dst + off, src, 2, whole / itemsize, 0);
            off += whole;
            held -= whole;
            if (held)
                memmove(scratch, scratch + whole, held);
        }
        size_t want = dst_len - off - held; /* ours to say: the payload's rest */
        if (!want || got >= budget)
            break;
        size_t room = scratch_len - held;
        ssize_t n = recv(fd, scratch + held, want < room ? want : room, MSG_DONTWAIT);
        if (n > 0) {
            held += (size_t)n;
            got += (size_t)n;
            continue;
        }
        if (n == 0) {
            status = -1;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            status = errno ? errno : EIO;
        break;
    }
    *have = held;
    *nread = got;
    *reduced = off;
    return status;
}

/* recv_reduce(fd, dst, scratch, have, op, dtype, budget) -> (read, reduced, have, status):
 * dst = dst op payload, in order, for the payload's rest (dst's length, whose first
 * `have` bytes are in scratch already); status 0, -1 (closed by the peer) or an errno. */
PyObject *pyc_mod_recv_reduce(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "recv_reduce(fd, dst, scratch, have, op, dtype, budget)");
        return NULL;
    }
    int fd = (int)PyLong_AsLong(args[0]);
    Py_ssize_t have = PyLong_AsSsize_t(args[3]);
    int op = (int)PyLong_AsLong(args[4]), dtype = (int)PyLong_AsLong(args[5]);
    Py_ssize_t budget = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred())
        return NULL;
    size_t isz = (size_t)pyc_itemsize(dtype);
    pyc_kernel k = (isz && op >= 0 && op < OP_COUNT) ? kset->table[dtype][op] : NULL;
    if (!k || op == OP_AVG) {
        PyErr_Format(PyExc_ValueError, "recv_reduce: no kernel for op %d on dtype code %d",
                     op, dtype);
        return NULL;
    }
    if (fd < 0 || budget < 1) {
        PyErr_SetString(PyExc_ValueError, "recv_reduce: a socket and a positive budget");
        return NULL;
    }
    Py_buffer vdst, vscr;
    if (pyc_get_buffer(args[1], &vdst, 1, "dst") < 0)
        return NULL;
    if (pyc_get_buffer(args[2], &vscr, 1, "scratch") < 0) {
        PyBuffer_Release(&vdst);
        return NULL;
    }
    PyObject *res = NULL;
    /* every length checked here, so the loop never steps outside either buffer */
    if ((size_t)vdst.len % isz || (size_t)vscr.len < isz || have < 0 || have > vdst.len ||
        have > vscr.len) {
        PyErr_Format(PyExc_ValueError,
                     "recv_reduce: dst (%zd bytes) a whole number of %zu-byte items, "
                     "scratch (%zd) at least one, 0 <= have (%zd) <= both",
                     vdst.len, isz, vscr.len, have);
        goto done;
    }
    size_t held = (size_t)have, nread, reduced;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = pyc_recv_reduce(fd, vdst.buf, (size_t)vdst.len, vscr.buf, (size_t)vscr.len, &held,
                             k, isz, (size_t)budget, &nread, &reduced);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("(nnni)", (Py_ssize_t)nread, (Py_ssize_t)reduced, (Py_ssize_t)held,
                        status);
done:
    PyBuffer_Release(&vscr);
    PyBuffer_Release(&vdst);
    return res;
}
