/* The bookkeeping every compiled path of repeated calls shares (callpath.c over the
 * arena, swappath.c over TCP): the group's and the engine's checks on their C-owned
 * records (callstate.h), the engine's lock held for the call, the sequence number, the
 * flight recorder's entry (written into the ring's preallocated Entry, field by field at
 * the offsets of its __slots__) and the hand-over of a call that needs Python. The call
 * itself is the path's own. */
#ifndef PYC_CALLBOOK_H
#define PYC_CALLBOOK_H

#include "native.h"
#include "callstate.h"

/* An entry's fields this writes: per call first, then the signature's own (the same in
 * every call of it: BOOK_STATIC of them, kept by the path per signature). */
enum { BOOK_ID, BOOK_SEQ, BOOK_STATE, BOOK_ISSUED, BOOK_STARTED, BOOK_ENDED, BOOK_ERROR,
       BOOK_CULPRITS, BOOK_FIRST_STATIC, BOOK_FIELDS = BOOK_FIRST_STATIC + 9 };
#define BOOK_STATIC (BOOK_FIELDS - BOOK_FIRST_STATIC)

typedef struct {
    GroupStateObject *group;   /* the group's state: usable, its seq */
    EngineStateObject *engine; /* its engine's: idle, and its lock */
    PyObject *acquire, *release, *recorder, *ring, *entry_type;
    PyObject *running, *completed, *empty_str, *empty_tuple, *zero;
    Py_ssize_t capacity; /* the recorder's ring (0: no recorder) */
    Py_ssize_t off[BOOK_FIELDS];
} pyc_book;

/* One call's: its sequence number and flight-recorder entry (NULL: no recorder). */
typedef struct {
    PyObject *seq, *entry, *started;
} pyc_booked;

/* Where instances of `type` keep the slot `name` (an object member of its __slots__): 0,
 * or -1 with an exception naming it. */
int pyc_slot_offset(PyObject *type, const char *name, Py_ssize_t *off);

static inline PyObject *pyc_slot_get(PyObject *obj, Py_ssize_t off)
{
    return *(PyObject **)((char *)obj + off);
}

/* Set a slot; steals `v`. */
static inline void pyc_slot_put(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)obj + off);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
}

/* recorder: the flight recorder or None; entry_type its Entry class; running and
 * completed the states it writes. 0, or -1 with an exception set. */
int pyc_book_init(pyc_book *b, PyObject *group, PyObject *engine, PyObject *recorder,
                  PyObject *entry_type, PyObject *running, PyObject *completed);
int pyc_book_traverse(pyc_book *b, visitproc visit, void *arg);
void pyc_book_clear(pyc_book *b);

/* Whether `entry` can be a signature's model (an Entry, or anything without a recorder). */
int pyc_book_entry_ok(const pyc_book *b, PyObject *entry);
/* A signature's own fields of `entry` (BOOK_STATIC new references, NULL without a recorder). */
void pyc_book_fields(const pyc_book *b, PyObject *entry, PyObject **fields);

/* Whether the group is usable and its engine takes work: the run_collective checks
 * before the lock. */
static inline int pyc_book_usable(const pyc_book *b)
{
    return b->group->failed == Py_None && b->engine->stopped == Py_False;
}

/* Take the engine for a call: 1 (held, idle: nothing running, queued or deferred), 0
 * (declined, not held), -1 (an error, set; not held). */
int pyc_book_lock(pyc_book *b);
void pyc_book_unlock(pyc_book *b);

/* With the engine held: take the sequence number and write the entry, as issued and
 * started at `t0` (monotonic ns). 1 done (c filled), 0 declined, -1 an error (set);
 * on 0 and -1 nothing changed and c holds nothing. */
int pyc_book_open(pyc_book *b, PyObject *const *fields, int64_t t0, pyc_booked *c);
/* A call done: its entry completed, the engine freed. */
void pyc_book_done(pyc_book *b, pyc_booked *c);
/* A call that needs Python: the engine marked as running this thread's job (Engine.run's
 * state) and unlocked. 0, or -1 with an exception set (the engine unlocked, c released). */
int pyc_book_hand(pyc_book *b, pyc_booked *c);
void pyc_booked_release(pyc_booked *c);

#endif
