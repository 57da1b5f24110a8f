/* GroupState and EngineState (see callstate.h). */
#include "callstate.h"

#include <math.h>
#include <structmember.h>

/* ------------------------------------------------------------------ GroupState */

static int GroupState_init(GroupStateObject *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":GroupState", kwlist))
        return -1;
    PyObject *seq = PyLong_FromLong(0), *never = PyFloat_FromDouble(-INFINITY);
    if (!seq || !never) {
        Py_XDECREF(seq);
        Py_XDECREF(never);
        return -1;
    }
    Py_XSETREF(s->seq, seq);
    Py_XSETREF(s->failed, Py_NewRef(Py_None));
    Py_XSETREF(s->polled, Py_NewRef(Py_False));
    Py_XSETREF(s->checked_at, never);
    return 0;
}

static int GroupState_traverse(GroupStateObject *s, visitproc visit, void *arg)
{
    Py_VISIT(s->seq);
    Py_VISIT(s->failed);
    Py_VISIT(s->polled);
    Py_VISIT(s->checked_at);
    return 0;
}

static int GroupState_clear(GroupStateObject *s)
{
    Py_CLEAR(s->seq);
    Py_CLEAR(s->failed);
    Py_CLEAR(s->polled);
    Py_CLEAR(s->checked_at);
    return 0;
}

static void GroupState_dealloc(GroupStateObject *s)
{
    PyObject_GC_UnTrack(s);
    GroupState_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMemberDef GroupState_members[] = {
    {"seq", T_OBJECT_EX, offsetof(GroupStateObject, seq), 0, "the next sequence number"},
    {"failed", T_OBJECT_EX, offsetof(GroupStateObject, failed), 0,
     "the error that made the group unusable, or None"},
    {"polled", T_OBJECT_EX, offsetof(GroupStateObject, polled), 0,
     "whether the last call ran on a runner that polls the transport itself"},
    {"checked_at", T_OBJECT_EX, offsetof(GroupStateObject, checked_at), 0,
     "when the transport was last read for abort notices (time.monotonic)"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject GroupStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.GroupState",
    .tp_doc = "GroupState(): a process group's state, as its calls' paths read it.",
    .tp_basicsize = sizeof(GroupStateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)GroupState_init,
    .tp_dealloc = (destructor)GroupState_dealloc,
    .tp_traverse = (traverseproc)GroupState_traverse,
    .tp_clear = (inquiry)GroupState_clear,
    .tp_members = GroupState_members,
};

/* ------------------------------------------------------------------ EngineState */

static int EngineState_init(EngineStateObject *s, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"lock", "queue", "deferred", NULL};
    PyObject *lock, *queue, *deferred;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!:EngineState", kwlist, &lock, &queue,
                                     &PyList_Type, &deferred))
        return -1;
    if (!PySequence_Check(queue)) {
        PyErr_SetString(PyExc_TypeError, "EngineState: queue must be a deque");
        return -1;
    }
    Py_XSETREF(s->running, Py_NewRef(Py_False));
    Py_XSETREF(s->stopped, Py_NewRef(Py_False));
    Py_XSETREF(s->owner, Py_NewRef(Py_None));
    Py_XSETREF(s->queue, Py_NewRef(queue));
    Py_XSETREF(s->deferred, Py_NewRef(deferred));
    Py_XSETREF(s->lock, Py_NewRef(lock));
    return 0;
}

static int EngineState_traverse(EngineStateObject *s, visitproc visit, void *arg)
{
    Py_VISIT(s->running);
    Py_VISIT(s->stopped);
    Py_VISIT(s->owner);
    Py_VISIT(s->queue);
    Py_VISIT(s->deferred);
    Py_VISIT(s->lock);
    return 0;
}

static int EngineState_clear(EngineStateObject *s)
{
    Py_CLEAR(s->running);
    Py_CLEAR(s->stopped);
    Py_CLEAR(s->owner);
    Py_CLEAR(s->queue);
    Py_CLEAR(s->deferred);
    Py_CLEAR(s->lock);
    return 0;
}

static void EngineState_dealloc(EngineStateObject *s)
{
    PyObject_GC_UnTrack(s);
    EngineState_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMemberDef EngineState_members[] = {
    {"running", T_OBJECT_EX, offsetof(EngineStateObject, running), 0, "whether a job runs"},
    {"stopped", T_OBJECT_EX, offsetof(EngineStateObject, stopped), 0,
     "whether the engine refuses new work"},
    {"owner", T_OBJECT_EX, offsetof(EngineStateObject, owner), 0,
     "the thread id running the job, or None"},
    {"queue", T_OBJECT_EX, offsetof(EngineStateObject, queue), READONLY,
     "the asynchronous jobs issued and not done"},
    {"deferred", T_OBJECT_EX, offsetof(EngineStateObject, deferred), READONLY,
     "the point-to-point operations deferred"},
    {"lock", T_OBJECT_EX, offsetof(EngineStateObject, lock), READONLY, "the engine's lock"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject EngineStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.EngineState",
    .tp_doc = "EngineState(lock, queue, deferred): an engine's state, as calls' paths read it.",
    .tp_basicsize = sizeof(EngineStateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)EngineState_init,
    .tp_dealloc = (destructor)EngineState_dealloc,
    .tp_traverse = (traverseproc)EngineState_traverse,
    .tp_clear = (inquiry)EngineState_clear,
    .tp_members = EngineState_members,
};
