/* The state a call's path reads and writes, owned here so that Python and C share one
 * record rather than C reading Python attributes by name (as NCCL's paths all read one
 * ncclComm): GroupState is a process group's (core/group.py), EngineState its engine's
 * (core/engine.py). Their fields are those of the Python twins in pycollective/_callstate.py,
 * which it checks at import; the Python path reads and writes the same objects. */
#ifndef PYC_CALLSTATE_H
#define PYC_CALLSTATE_H

#include "native.h"

typedef struct {
    PyObject_HEAD
    long long seq;     /* the group's next sequence number */
    PyObject *failed;  /* the error that made the group unusable; NULL or None: usable */
    char polled;       /* the last call ran on a runner that polls the transport itself */
    double checked_at; /* when this rank last read its transport for abort notices */
} GroupStateObject;

typedef struct {
    PyObject_HEAD
    char running;       /* a job runs (Engine.run's, the worker's, or one handed over) */
    char stopped;       /* the engine refuses new work (destroy, close_world) */
    PyObject *owner;    /* the thread id running the job, or None */
    PyObject *queue;    /* the asynchronous jobs issued and not done (a deque) */
    PyObject *deferred; /* the point-to-point operations deferred (a list) */
    PyObject *lock;     /* the engine's lock (an RLock): held to start a job */
} EngineStateObject;

extern PyTypeObject GroupStateType;
extern PyTypeObject EngineStateType;

#endif
