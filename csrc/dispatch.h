/* The kernel set for this CPU (the best one it runs: avx512, avx2, generic), chosen at
 * import and switchable for tests, and reduce(): a fused reduction from Python. */
#ifndef PYC_DISPATCH_H
#define PYC_DISPATCH_H

#include "native.h"

/* Choose the best usable kernel set (module.c, at import). */
void pyc_choose_kernels(void);

/* reduce(op, dtype, out, srcs, avg=0) */
PyObject *pyc_mod_reduce(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
/* kernel_sets() -> names usable on this CPU, best first */
PyObject *pyc_mod_kernel_sets(PyObject *m, PyObject *unused);
/* use_kernels(name) -> the previous name */
PyObject *pyc_mod_use_kernels(PyObject *m, PyObject *arg);

#endif
