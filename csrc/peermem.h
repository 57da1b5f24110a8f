/* A peer's memory read and written directly: Linux's cross-memory attach
 * (process_vm_readv / process_vm_writev), for the arena's single-copy all_reduce. The
 * kernel checks that we may (ptrace's access rules: same user, or CAP_SYS_PTRACE; Yama)
 * and that every remote byte is mapped in the peer; a length is always ours, never a
 * peer's. */
#ifndef PYC_PEERMEM_H
#define PYC_PEERMEM_H

#include "native.h"

#include <sys/types.h>

/* Copy `bytes` from `remote` in process `pid` to `local`; 0, or the errno that stopped
 * it (EFAULT for a short copy, ENOSYS where the system has no such call). */
int pyc_peer_read(pid_t pid, void *local, uint64_t remote, size_t bytes);

/* Copy `bytes` from `local` to `remote` in process `pid`; 0 or an errno, as above. */
int pyc_peer_write(pid_t pid, const void *local, uint64_t remote, size_t bytes);

/* peer_read(pid, address, nbytes) -> bytes: nbytes (at most 4096) read from `address`
 * in process `pid`; OSError with the errno if that cannot be done (set-up's probe). */
PyObject *pyc_mod_peer_read(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

#endif
