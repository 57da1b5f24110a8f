/* Which kernel set runs (see dispatch.h); the kernels themselves are kernels_*.c. */
#include "dispatch.h"

const pyc_kernel_set *kset = &pyc_kernels_generic;

static const pyc_kernel_set *sets[] = {
#if defined(__x86_64__)
    &pyc_kernels_avx512, &pyc_kernels_avx2,
#endif
    &pyc_kernels_generic,
};

static int set_usable(const pyc_kernel_set *s)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (s == &pyc_kernels_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
    if (s == &pyc_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
#endif
    return s == &pyc_kernels_generic;
}

/* kernel_sets() -> names usable on this CPU, best first */
PyObject *pyc_mod_kernel_sets(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < sizeof sets / sizeof *sets; i++) {
        if (!set_usable(sets[i]))
            continue;
        PyObject *name = PyUnicode_FromString(sets[i]->name);
        if (!name || PyList_Append(out, name) < 0)
            Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}

/* use_kernels(name) -> the previous name (tests run every set; Plans keep theirs) */
PyObject *pyc_mod_use_kernels(PyObject *Py_UNUSED(m), PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        if (strcmp(sets[i]->name, name) == 0 && set_usable(sets[i])) {
            const char *old = kset->name;
            kset = sets[i];
            return PyUnicode_FromString(old);
        }
    }
    PyErr_Format(PyExc_ValueError, "no usable kernel set %s", name);
    return NULL;
}

/* reduce(op, dtype, out, srcs, avg=0): out = srcs[0] op srcs[1] op ... (the fused kernel) */
PyObject *pyc_mod_reduce(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "reduce(op, dtype, out, srcs, avg=0)");
        return NULL;
    }
    int op = (int)PyLong_AsLong(args[0]), dtype = (int)PyLong_AsLong(args[1]);
    long long avg = nargs == 5 ? PyLong_AsLongLong(args[4]) : 0;
    if (PyErr_Occurred())
        return NULL;
    size_t isz = (size_t)pyc_itemsize(dtype);
    pyc_kernel k = (isz && op >= 0 && op < OP_COUNT) ? kset->table[dtype][op] : NULL;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "op %d is not defined on dtype code %d", op, dtype);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[3], "srcs must be a sequence of buffers");
    if (!seq)
        return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (m < 1 || m > MAX_RANKS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "reduce: 1 to %d inputs, got %zd", MAX_RANKS, m);
        return NULL;
    }
    Py_buffer vout, vs[MAX_RANKS];
    if (pyc_get_buffer(args[2], &vout, 1, "out") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    const void *srcs[MAX_RANKS];
    Py_ssize_t got = 0;
    PyObject *res = NULL;
    for (; got < m; got++) {
        if (pyc_get_buffer(PySequence_Fast_GET_ITEM(seq, got), &vs[got], 0, "srcs[i]") < 0)
            goto done;
        if (vs[got].len != vout.len) {
            got++;
            PyErr_SetString(PyExc_ValueError, "reduce: every input must be as long as out");
            goto done;
        }
        srcs[got] = vs[got].buf;
    }
    size_t n = (size_t)vout.len / isz;
    if (vout.len >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        k(vout.buf, srcs, (int)m, n, avg);
        Py_END_ALLOW_THREADS
    } else {
        k(vout.buf, srcs, (int)m, n, avg);
    }
    res = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&vs[i]);
    PyBuffer_Release(&vout);
    Py_DECREF(seq);
    return res;
}

void pyc_choose_kernels(void)
{
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        if (set_usable(sets[i])) {
            kset = sets[i];
            break;
        }
    }
}
