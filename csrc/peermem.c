/* A peer's memory read and written directly (see peermem.h). Python.h (native.h) asks
 * for the GNU declarations process_vm_readv and process_vm_writev need. */
#include "peermem.h"

#include <errno.h>
#if defined(__linux__)
#include <sys/uio.h>
#endif

/* One direction of process_vm_{readv,writev}, to the end or the first error: the kernel
 * may copy less than asked (a remote page that is not mapped ends the copy there). */
static int transfer(pid_t pid, char *local, uint64_t remote, size_t bytes, int write)
{
#if defined(__linux__)
    while (bytes) {
        struct iovec l = {local, bytes}, r = {(void *)(uintptr_t)remote, bytes};
        ssize_t done = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                             : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return errno ? errno : EIO;
        }
        if (done == 0)
            return EFAULT;
        local += done, remote += (uint64_t)done, bytes -= (size_t)done;
    }
    return 0;
#else
    (void)pid, (void)local, (void)remote, (void)bytes, (void)write;
    return ENOSYS;
#endif
}

int pyc_peer_read(pid_t pid, void *local, uint64_t remote, size_t bytes)
{
    return transfer(pid, local, remote, bytes, 0);
}

int pyc_peer_write(pid_t pid, const void *local, uint64_t remote, size_t bytes)
{
    return transfer(pid, (char *)(uintptr_t)local, remote, bytes, 1);
}

#define PROBE_MAX 4096

PyObject *pyc_mod_peer_read(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "peer_read(pid, address, nbytes)");
        return NULL;
    }
    long long pid = PyLong_AsLongLong(args[0]);
    unsigned long long addr = PyLong_AsUnsignedLongLong(args[1]);
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (pid <= 0 || pid > INT_MAX || n < 0 || n > PROBE_MAX) {
        PyErr_Format(PyExc_ValueError, "peer_read: a pid in 1..%d and 0..%d bytes, got %lld, %zd",
                     INT_MAX, PROBE_MAX, pid, n);
        return NULL;
    }
    char buf[PROBE_MAX];
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = pyc_peer_read((pid_t)pid, buf, (uint64_t)addr, (size_t)n);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBytes_FromStringAndSize(buf, n);
}
