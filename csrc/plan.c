/* Plan: one call signature, prepared (see plan.h). */
#include "plan.h"

#include <structmember.h>

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"collective", "dtype", "op", "root", "avg", "header", NULL};
    PyObject *header;
    long long avg = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiiiLO", kwlist, &self->coll, &self->dtype,
                                     &self->op, &self->root, &avg, &header))
        return -1;
    if (!pyc_kind_known(self->coll)) {
        PyErr_Format(PyExc_ValueError, "unknown collective code %d", self->coll);
        return -1;
    }
    self->itemsize = (size_t)pyc_itemsize(self->dtype);
    if (!self->itemsize) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %d", self->dtype);
        return -1;
    }
    self->avg = avg;
    self->kernel = NULL;
    if (self->coll == C_ALL_REDUCE || self->coll == C_REDUCE || self->coll == C_REDUCE_SCATTER) {
        if (self->op < 0 || self->op >= OP_COUNT || !(self->kernel = kset->table[self->dtype][self->op])) {
            PyErr_Format(PyExc_ValueError, "op %d is not defined on dtype code %d", self->op,
                         self->dtype);
            return -1;
        }
    }
    PyObject *seq = PySequence_Fast(header, "header must be a sequence of 6 ints");
    if (!seq)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != ANN_WORDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "header must be (kind, dtype, count, root, op, algo)");
        return -1;
    }
    for (int i = 0; i < ANN_WORDS; i++) {
        self->ann[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (self->ann[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static PyMemberDef Plan_members[] = {
    {"collective", T_INT, offsetof(PlanObject, coll), READONLY, "the collective's code (KIND_CODE)"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.Plan",
    .tp_doc = "Plan(collective, dtype, op, root, avg, header): one call signature, prepared.",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_members = Plan_members,
};
