/* pycollective._native: the compiled core of the shared-memory arena (see native.h for
 * its units). This file is the module itself: its types, functions and constants, and
 * the one buffer helper every binding uses.
 *
 * A collective runs as a resumable state machine (arena.h): Arena.run() starts it and
 * returns DONE, or PENDING / CHECK / VIEWS when it needs Python, which then calls
 * resume(). The GIL is released while waiting and around large copies and reductions.
 */
#include "native.h"

#include "arena_type.h"
#include "callpath.h"
#include "callstate.h"
#include "copy.h"
#include "dispatch.h"
#include "peermem.h"
#include "plan.h"
#include "sockio.h"
#include "swapio.h"
#include "swappath.h"

int pyc_get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s buffer", what,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static PyMethodDef module_methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))pyc_mod_reduce, METH_FASTCALL,
     "reduce(op, dtype, out, srcs, avg=0): the fused reduction of srcs, in order, into out"},
    {"kernel_sets", pyc_mod_kernel_sets, METH_NOARGS, "kernel sets usable here, best first"},
    {"use_kernels", pyc_mod_use_kernels, METH_O, "use_kernels(name) -> previous set's name"},
    {"peer_read", (PyCFunction)(void (*)(void))pyc_mod_peer_read, METH_FASTCALL,
     "peer_read(pid, address, nbytes) -> bytes read from another process (at most 4096)"},
    {"recv_reduce", (PyCFunction)(void (*)(void))pyc_mod_recv_reduce, METH_FASTCALL,
     "recv_reduce(fd, dst, scratch, have, op, dtype, budget) -> (read, reduced, have, status)"},
    {"swap_round", (PyCFunction)(void (*)(void))pyc_mod_swap_round, METH_FASTCALL,
     "swap_round(fd, head, payload, rbuf, spin, into, dst, op, dtype) -> "
     "(sent, end, send_err, recv_status, spun, landed)"},
    {"copy", (PyCFunction)(void (*)(void))pyc_mod_copy, METH_FASTCALL,
     "copy(dst, src): src's bytes into dst (same size), as memoryview assignment"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pycollective._native",
    .m_doc = "The compiled core of pycollective's shared-memory arena (see shm/native.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

typedef struct { const char *name; long long value; } pyc_named;

/* Set the module's `attr` to `obj` (a new reference, consumed; NULL: an error set). */
static int add_owned(PyObject *m, const char *attr, PyObject *obj)
{
    if (!obj)
        return -1;
    int rc = PyModule_AddObjectRef(m, attr, obj);
    Py_DECREF(obj);
    return rc;
}

/* name -> value, into a new dict set as the module's `attr`; -1 on error. */
static int add_table(PyObject *m, const char *attr, const pyc_named *table, size_t n)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(table[i].value);
        if (!v || PyDict_SetItemString(d, table[i].name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return add_owned(m, attr, d);
}

/* What C compiled in of Python's definitions, for shm/native.py to check at import. */
static int add_contract(PyObject *m)
{
    static const pyc_named constants[] = {
        {"WORDS", WORDS}, {"EPOCH", EPOCH}, {"SLEEPING", SLEEPING}, {"SEQ", SEQ},
        {"KIND", KIND}, {"ANN_WORDS", ANN_WORDS}, {"BUF_FD", BUF_FD},
        {"BUF_WORDS", BUF_WORDS}, {"ADDR", ADDR}, {"SC_ERR", SC_ERR}, {"H_CLAIM", H_CLAIM}, {"MAX_RANKS", MAX_RANKS}, {"ALIGN_BYTES", ALIGN_BYTES},
        {"SLEEP_NS", SLEEP_NS}, {"SETTLE_SPINS", SETTLE_SPINS},
        {"LOAD_CHECK_NS", LOAD_CHECK_NS},
        {"DONE", ST_DONE}, {"PENDING", ST_PENDING}, {"CHECK", ST_CHECK}, {"VIEWS", ST_VIEWS},
        {"FAILED", ST_FAILED},
    };
    static const pyc_named kinds[] = {
        {"all_reduce", C_ALL_REDUCE}, {"broadcast", C_BROADCAST}, {"reduce", C_REDUCE},
        {"all_gather", C_ALL_GATHER}, {"reduce_scatter", C_REDUCE_SCATTER},
        {"barrier", C_BARRIER},
    };
    static const pyc_named ops[] = {
        {"SUM", OP_SUM}, {"PRODUCT", OP_PRODUCT}, {"MIN", OP_MIN}, {"MAX", OP_MAX},
        {"BAND", OP_BAND}, {"BOR", OP_BOR}, {"BXOR", OP_BXOR}, {"AVG", OP_AVG},
    };
    if (add_table(m, "CONSTANTS", constants, sizeof constants / sizeof *constants) < 0 ||
        add_table(m, "KIND_CODE", kinds, sizeof kinds / sizeof *kinds) < 0 ||
        add_table(m, "OP_CODE", ops, sizeof ops / sizeof *ops) < 0)
        return -1;
    /* dtype code -> itemsize, for every code the kernels know */
    PyObject *d = PyDict_New();
    for (int code = 0; d && code < DT_COUNT; code++) {
        int size = pyc_itemsize(code);
        if (!size)
            continue;
        PyObject *k = PyLong_FromLong(code), *v = PyLong_FromLong(size);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return add_owned(m, "ITEMSIZE", d);
}

PyMODINIT_FUNC PyInit__native(void)
{
    pyc_choose_kernels();
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArenaType) < 0 ||
        PyType_Ready(&CallPathType) < 0 || PyType_Ready(&SwapPathType) < 0 ||
        PyType_Ready(&GroupStateType) < 0 ||
        PyType_Ready(&EngineStateType) < 0 || pyc_callpath_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddObjectRef(m, "Arena", (PyObject *)&ArenaType) < 0 ||
        PyModule_AddObjectRef(m, "CallPath", (PyObject *)&CallPathType) < 0 ||
        PyModule_AddObjectRef(m, "SwapPath", (PyObject *)&SwapPathType) < 0 ||
        PyModule_AddObjectRef(m, "GroupState", (PyObject *)&GroupStateType) < 0 ||
        PyModule_AddObjectRef(m, "EngineState", (PyObject *)&EngineStateType) < 0 ||
        add_contract(m) < 0 ||
        PyModule_AddStringConstant(m, "KERNELS", kset->name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
