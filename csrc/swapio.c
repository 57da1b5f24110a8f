/* One round of the repeated small swap over TCP (see swapio.h). */
#include "swapio.h"

#include "copy.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void send_frame(int fd, const char *head, size_t head_len, const char *payload,
                       size_t nbytes, pyc_swap_result *r)
{
    struct iovec iov[2] = {{(void *)head, head_len}, {(void *)payload, nbytes}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = nbytes ? 2 : 1};
    for (;;) {
        ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) {
            r->sent = (size_t)n;
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            r->send_err = errno ? errno : EIO;
        return; /* nothing taken: Python queues the frame */
    }
}

void pyc_swap_round(int fd, const char *head, size_t head_len, const char *payload,
                    size_t nbytes, char *rbuf, size_t rbuf_len, int64_t spin_ns, char *into,
                    char *dst, pyc_kernel kernel, size_t itemsize, pyc_swap_result *r)
{
    size_t total = head_len + nbytes, end = 0;
    memset(r, 0, sizeof *r);
    send_frame(fd, head, head_len, payload, nbytes, r);
    if (r->sent != total)
        return;
    int64_t until = 0;
    for (;;) {
        ssize_t n = recv(fd, rbuf + end, rbuf_len - end, MSG_DONTWAIT);
        if (n > 0) {
            end += (size_t)n;
            if (end >= head_len && memcmp(rbuf, head, head_len))
                break; /* another frame first: the regular way reads it */
            if (end >= total)
                break;
            continue;
        }
        if (n == 0) {
            r->recv_status = -1;
            break;
        }
        /* EINTR too: a signal's handler runs in Python, which goes on the regular way */
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            r->recv_status = errno == EINTR ? 0 : (errno ? errno : EIO);
            break;
        }
        if (!spin_ns)
            break;
        int64_t now = mono_ns();
        if (!until) {
            until = now + spin_ns;
        } else if (now >= until) {
            r->spun = 1;
            break;
        }
    }
    r->end = end;
    if (end != total || memcmp(rbuf, head, head_len))
        return;
    pyc_copy(into, rbuf + head_len, nbytes); /* aligned for the kernel, as Python's copy */
    if (dst && kernel && nbytes) {
        const void *src[2] = {dst, into};
        kernel(dst, src, 2, nbytes / itemsize, 0);
    }
    r->landed = 1;
}

PyObject *pyc_mod_swap_round(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "swap_round(fd, head, payload, rbuf, spin, into, dst, op, dtype)");
        return NULL;
    }
    int fd = (int)PyLong_AsLong(args[0]);
    double spin = PyFloat_AsDouble(args[4]);
    int op = (int)PyLong_AsLong(args[7]), dtype = (int)PyLong_AsLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (fd < 0 || !(spin >= 0.0 && spin <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "swap_round: a socket and a spin of 0 to 1 seconds");
        return NULL;
    }
    pyc_kernel k = NULL;
    size_t isz = 1;
    int reduces = args[6] != Py_None;
    if (reduces) {
        isz = (size_t)pyc_itemsize(dtype);
        k = (isz && op >= 0 && op < OP_COUNT && op != OP_AVG) ? kset->table[dtype][op] : NULL;
        if (!k) {
            PyErr_Format(PyExc_ValueError, "swap_round: no kernel for op %d on dtype code %d",
                         op, dtype);
            return NULL;
        }
    }
    Py_buffer vhead, vpay, vrbuf, vinto, vdst = {0};
    if (pyc_get_buffer(args[1], &vhead, 0, "head") < 0)
        return NULL;
    PyObject *res = NULL;
    int got = 1;
    if (pyc_get_buffer(args[2], &vpay, 0, "payload") < 0)
        goto head;
    got++;
    if (pyc_get_buffer(args[3], &vrbuf, 1, "rbuf") < 0)
        goto release;
    got++;
    if (pyc_get_buffer(args[5], &vinto, 1, "into") < 0)
        goto release;
    got++;
    if (reduces) {
        if (pyc_get_buffer(args[6], &vdst, 1, "dst") < 0)
            goto release;
        got++;
    }
    /* every length checked here, so the round never steps outside a buffer */
    size_t nbytes = (size_t)vpay.len;
    if (!vhead.len || (size_t)vinto.len != nbytes ||
        (size_t)vrbuf.len < (size_t)vhead.len + nbytes ||
        (reduces && ((size_t)vdst.len != nbytes || nbytes % isz))) {
        PyErr_Format(PyExc_ValueError,
                     "swap_round: a header, into (%zd bytes) as long as the payload (%zd) "
                     "and dst (%zd) too, a whole number of %zu-byte items, rbuf (%zd) at "
                     "least header and payload",
                     vinto.len, vpay.len, reduces ? vdst.len : vpay.len, isz, vrbuf.len);
        goto release;
    }
    pyc_swap_result r;
    Py_BEGIN_ALLOW_THREADS
    pyc_swap_round(fd, vhead.buf, (size_t)vhead.len, vpay.buf, nbytes, vrbuf.buf,
                   (size_t)vrbuf.len, (int64_t)(spin * 1e9), vinto.buf,
                   reduces ? vdst.buf : NULL, k, isz, &r);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("(nniiii)", (Py_ssize_t)r.sent, (Py_ssize_t)r.end, r.send_err,
                        r.recv_status, r.spun, r.landed);
release:
    if (got >= 5)
        PyBuffer_Release(&vdst);
    if (got >= 4)
        PyBuffer_Release(&vinto);
    if (got >= 3)
        PyBuffer_Release(&vrbuf);
    if (got >= 2)
        PyBuffer_Release(&vpay);
head:
    PyBuffer_Release(&vhead);
    return res;
}
