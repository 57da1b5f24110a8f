/* The state a call's path reads and writes, owned here so that Python and C share one
 * record rather than C reading Python attributes by name (as NCCL's paths all read one
 * ncclComm): GroupState is a process group's (core/group.py), EngineState its engine's
 * (core/engine.py). Their fields are those of the Python twins in pycollective/_callstate.py,
 * which it checks at import; the Python path reads and writes the same objects. */
#ifndef PYC_CALLSTATE_H
#define PYC_CALLSTATE_H

#include "native.h"

/* Every field is an object (T_OBJECT_EX members): the Python path's attribute reads and
 * writes of them are then specialised by the interpreter as __slots__' are, as cheap as
 * a plain object's. C takes them as they are and declines a call (the Python path runs)
 * on a value of another type than the twins hold. */
typedef struct {
    PyObject_HEAD
    PyObject *seq;        /* int: the group's next sequence number */
    PyObject *failed;     /* None, or the error that made the group unusable */
    PyObject *polled;     /* bool: the last call ran on a runner that polls the transport */
    PyObject *checked_at; /* float: when this rank last read its transport for notices */
} GroupStateObject;

typedef struct {
    PyObject_HEAD
    PyObject *running;  /* bool: a job runs (Engine.run's, the worker's, one handed over) */
    PyObject *stopped;  /* bool: the engine refuses new work (destroy, close_world) */
    PyObject *owner;    /* the thread id running the job, or None */
    PyObject *queue;    /* the asynchronous jobs issued and not done (a deque) */
    PyObject *deferred; /* the point-to-point operations deferred (a list) */
    PyObject *lock;     /* the engine's lock (an RLock): held to start a job */
} EngineStateObject;

extern PyTypeObject GroupStateType;
extern PyTypeObject EngineStateType;

#endif
