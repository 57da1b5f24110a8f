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
#include "dispatch.h"
#include "plan.h"

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
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pycollective._native",
    .m_doc = "The compiled core of pycollective's shared-memory arena (see shm/native.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    pyc_choose_kernels();
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArenaType) < 0 ||
        PyType_Ready(&FastType) < 0 || pyc_callpath_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddObjectRef(m, "Arena", (PyObject *)&ArenaType) < 0 ||
        PyModule_AddObjectRef(m, "Fast", (PyObject *)&FastType) < 0 ||
        PyModule_AddIntConstant(m, "DONE", ST_DONE) < 0 ||
        PyModule_AddIntConstant(m, "PENDING", ST_PENDING) < 0 ||
        PyModule_AddIntConstant(m, "CHECK", ST_CHECK) < 0 ||
        PyModule_AddIntConstant(m, "VIEWS", ST_VIEWS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_RANKS", MAX_RANKS) < 0 ||
        PyModule_AddStringConstant(m, "KERNELS", kset->name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
