/* The per-call path of repeated calls (see callpath.h). */
#include "callpath.h"

#include <structmember.h>

#include "arena.h"
#include "arena_type.h"
#include "callbook.h"
#include "callstate.h"
#include "plan.h"

/* A group's compiled per-call path (core/group.py `fast`, runners/native.py). The first
 * call of a signature runs the whole Python path (every check, the runner's plan); if it
 * succeeds, the group registers the signature here (`add`): the buffers' types, formats and
 * lengths (one buffer, or all_gather's and reduce_scatter's output and input), the op and
 * root objects as the caller passed them (held, compared by identity), the compiled Plan
 * and the flight-recorder fields of the call. It repeats all_reduce, broadcast, reduce,
 * all_gather (into a tensor), reduce_scatter (of a tensor) and barrier. A later call with
 * the same signature then goes from the API function straight to `callpath_run`, which
 * does what ProcessGroup.run_collective does, in C, on the group's and the engine's
 * C-owned state (callstate.h: no attribute is looked up by name, so no rename on the
 * Python side can turn this path off unnoticed): the group is usable and the transport was
 * checked less than a millisecond ago (else it returns False and the caller runs the Python path,
 * which checks it), the engine is idle (its lock is held for the call, so no other
 * thread can start one), the sequence number, the flight-recorder entry (written
 * into the ring's preallocated Entry, field by field at the offsets of its __slots__),
 * the announcement and the compiled collective. A call that is done returns True. One that
 * needs Python (a wait past the budget, a peer's differing announcement) is handed to
 * `finish(prepared, seq, entry, status, started)`: the engine is marked running by this
 * thread and unlocked first, and `finish` resumes the call with the Python runner's polls
 * and checks and raises exactly as the Python path would. Anything this path does
 * not know returns False before it touches anything. */

#define PATH_SIGS 16
/* The collectives this path repeats, and their rows of the signature table. */
enum { ROW_ALL_REDUCE, ROW_BROADCAST, ROW_BARRIER, ROW_REDUCE, ROW_ALL_GATHER, ROW_REDUCE_SCATTER,
       PATH_ROWS };

static inline int sig_row(int coll)
{
    return coll == C_ALL_REDUCE      ? ROW_ALL_REDUCE
         : coll == C_BROADCAST       ? ROW_BROADCAST
         : coll == C_BARRIER         ? ROW_BARRIER
         : coll == C_REDUCE          ? ROW_REDUCE
         : coll == C_ALL_GATHER      ? ROW_ALL_GATHER
         : coll == C_REDUCE_SCATTER  ? ROW_REDUCE_SCATTER
                                     : -1;
}

/* all_gather and reduce_scatter take an output and an input; the others one buffer (the
 * data), reduce two keys (its root, then its op), the others one at most. */
static inline int two_buffers(int coll)
{
    return coll == C_ALL_GATHER || coll == C_REDUCE_SCATTER;
}
#define FORMAT_CHARS 8

/* One buffer of a signature: [0] the data (or output), [1] the input of a call with two. */
typedef struct {
    PyObject *type; /* NULL: no such buffer */
    Py_ssize_t len;
    char format[FORMAT_CHARS];
} sig_buf;

typedef struct {
    sig_buf buf[2];
    PyObject *key[2];   /* op (all_reduce, reduce_scatter), src (broadcast), dst and op
                           (reduce), as passed; NULL where unused */
    PyObject *plan;     /* PlanObject (NULL: a free slot) */
    PyObject *prepared; /* handed back to `finish` */
    PyObject *fields[BOOK_STATIC];
    int writes;         /* whether the data/output buffer is written */
    int large;          /* above the arena's small calls: its buffer may be shared memory */
} call_sig;

typedef struct {
    PyObject_HEAD
    ArenaObject *arena;
    pyc_book book; /* the group's and engine's state, the recorder (callbook.h) */
    PyObject *finish;
    int64_t recheck_ns, budget_ns;
    int64_t calls;  /* calls this path ran (tests, benchmarks) */
    int64_t handed; /* of which handed to `finish` */
    int nsig, evict;
    call_sig sig[PATH_ROWS][PATH_SIGS];
    int count[PATH_ROWS];
} CallPathObject;

static PyObject *s_base;
static PyObject *mmap_type; /* mmap.mmap */

static void sig_clear(call_sig *g)
{
    for (int b = 0; b < 2; b++) {
        Py_CLEAR(g->buf[b].type);
        Py_CLEAR(g->key[b]);
    }
    Py_CLEAR(g->plan);
    Py_CLEAR(g->prepared);
    for (int i = 0; i < BOOK_STATIC; i++)
        Py_CLEAR(g->fields[i]);
}

static int CallPath_traverse(CallPathObject *f, visitproc visit, void *arg)
{
    Py_VISIT(f->arena);
    Py_VISIT(f->finish);
    if (pyc_book_traverse(&f->book, visit, arg))
        return -1;
    for (int k = 0; k < PATH_ROWS; k++)
        for (int i = 0; i < f->count[k]; i++) {
            call_sig *g = &f->sig[k][i];
            for (int b = 0; b < 2; b++) {
                Py_VISIT(g->buf[b].type);
                Py_VISIT(g->key[b]);
            }
            Py_VISIT(g->plan);
            Py_VISIT(g->prepared);
            for (int j = 0; j < BOOK_STATIC; j++)
                Py_VISIT(g->fields[j]);
        }
    return 0;
}

static int CallPath_clear(CallPathObject *f)
{
    Py_CLEAR(f->arena);
    Py_CLEAR(f->finish);
    pyc_book_clear(&f->book);
    for (int k = 0; k < PATH_ROWS; k++) {
        for (int i = 0; i < f->count[k]; i++)
            sig_clear(&f->sig[k][i]);
        f->count[k] = 0;
    }
    return 0;
}

static void CallPath_dealloc(CallPathObject *f)
{
    PyObject_GC_UnTrack(f);
    CallPath_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* CallPath(arena, group_state, engine_state, recorder, entry_type, finish, running,
 *          completed, recheck_ns, budget_ns) */
static int CallPath_init(CallPathObject *f, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"arena", "group_state", "engine_state", "recorder", "entry_type",
                             "finish", "running", "completed", "recheck_ns", "budget_ns", NULL};
    PyObject *arena, *group, *engine, *recorder, *entry_type, *finish, *running, *completed;
    long long recheck_ns, budget_ns;
    if (f->arena) {
        PyErr_SetString(PyExc_RuntimeError, "CallPath is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOOOUULL", kwlist, &ArenaType, &arena,
                                     &group, &engine, &recorder, &entry_type, &finish,
                                     &running, &completed, &recheck_ns, &budget_ns))
        return -1;
    f->recheck_ns = recheck_ns;
    f->budget_ns = budget_ns;
    f->arena = (ArenaObject *)Py_NewRef(arena);
    f->finish = Py_NewRef(finish);
    return pyc_book_init(&f->book, group, engine, recorder, entry_type, running, completed);
}

static int buffer_of(PyObject *obj, Py_buffer *v)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* A signature's buffer: `obj`'s type, format and length, if it holds `want` bytes. */
static int sig_buf_of(PyObject *obj, Py_ssize_t want, sig_buf *b)
{
    Py_buffer v;
    if (buffer_of(obj, &v) < 0)
        return -1;
    const char *fmt = v.format ? v.format : "B";
    int ok = strlen(fmt) < FORMAT_CHARS && v.len == want;
    if (ok) {
        strcpy(b->format, fmt);
        b->len = v.len;
        b->type = (PyObject *)Py_TYPE(obj); /* a borrowed reference until the slot takes it */
    }
    PyBuffer_Release(&v);
    return ok ? 0 : -1;
}

/* The two items of a pair (a tuple of two), or -1. */
static int pair(PyObject *t, PyObject **a, PyObject **b)
{
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2)
        return -1;
    *a = PyTuple_GET_ITEM(t, 0);
    *b = PyTuple_GET_ITEM(t, 1);
    return 0;
}

static inline int sig_same(const call_sig *s, const call_sig *g)
{
    for (int b = 0; b < 2; b++)
        if (s->key[b] != g->key[b] || s->buf[b].type != g->buf[b].type ||
            s->buf[b].len != g->buf[b].len || strcmp(s->buf[b].format, g->buf[b].format))
            return 0;
    return 1;
}

/* add(obj, key, plan, prepared, entry) -> bool: register a signature. obj: the buffer of the
 * call (None for a barrier; all_gather and reduce_scatter: the pair (output, input)); key:
 * the op or root as the caller passed it (reduce: the pair (dst, op); all_gather: None);
 * entry: its flight-recorder entry, for the fields every call of it shares. */
static PyObject *CallPath_add(CallPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "add(obj, key, plan, prepared, entry)");
        return NULL;
    }
    PyObject *obj = args[0], *key = args[1], *entry = args[4];
    if (!PyObject_TypeCheck(args[2], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "add: plan must be a Plan");
        return NULL;
    }
    PlanObject *plan = (PlanObject *)args[2];
    if (!f->arena)
        Py_RETURN_FALSE;
    int coll = plan->coll, row = sig_row(coll);
    if (row < 0)
        Py_RETURN_FALSE;
    if (!pyc_book_entry_ok(&f->book, entry))
        Py_RETURN_FALSE;
    call_sig g = {0};
    PyObject *objs[2] = {obj, NULL}, *keys[2] = {key, NULL};
    if (two_buffers(coll) && pair(obj, &objs[0], &objs[1]) < 0)
        Py_RETURN_FALSE;
    if (coll == C_REDUCE && pair(key, &keys[0], &keys[1]) < 0)
        Py_RETURN_FALSE;
    if (coll != C_BARRIER) {
        /* the bytes each buffer holds: the call's count, and world size x count for the
         * gathered side */
        const Py_ssize_t block = (Py_ssize_t)(plan->ann[2] * (int64_t)plan->itemsize);
        const Py_ssize_t whole = block * f->arena->size;
        const Py_ssize_t want[2] = {coll == C_ALL_GATHER ? whole : block,
                                    coll == C_REDUCE_SCATTER ? whole : block};
        for (int b = 0; b < 2; b++)
            if (objs[b] && sig_buf_of(objs[b], want[b], &g.buf[b]) < 0)
                Py_RETURN_FALSE;
        /* what only reads: reduce's non-roots, broadcast's root */
        const int r = f->arena->rank;
        g.writes = !((coll == C_REDUCE && plan->root != r) ||
                     (coll == C_BROADCAST && plan->root == r));
        g.large = block > f->arena->small_bytes;
    }
    g.key[0] = keys[0];
    g.key[1] = keys[1];
    call_sig *list = f->sig[row];
    int i = 0;
    while (i < f->count[row] && !sig_same(&list[i], &g))
        i++;
    if (i == PATH_SIGS) { /* full: replace one, round robin */
        i = f->evict;
        f->evict = (f->evict + 1) % PATH_SIGS;
    }
    if (i == f->count[row])
        f->count[row]++;
    else
        sig_clear(&list[i]);
    for (int b = 0; b < 2; b++) {
        Py_XINCREF(g.buf[b].type);
        Py_XINCREF(g.key[b]);
    }
    g.plan = Py_NewRef((PyObject *)plan);
    g.prepared = Py_NewRef(args[3]);
    pyc_book_fields(&f->book, entry, g.fields);
    list[i] = g;
    Py_RETURN_TRUE;
}

/* Whether `obj` may lie in memory mapped from a file, as pycollective.empty's arrays do
 * (shm/shared.py: an ndarray over a memoryview of an mmap): a call on such a buffer above
 * the small calls goes by the Python path, which tells the peers it is shared (they then
 * reduce straight from it) instead of the single copy this path announces. It follows
 * `base` (ndarrays) and memoryviews' exporters, a few levels at most: a deeper chain
 * counts as mapped (the Python path decides). -1 with an exception set (the caller
 * declines the call then too). */
static int maybe_mapped(PyObject *obj)
{
    PyObject *o = Py_NewRef(obj);
    for (int depth = 0; depth < 8; depth++) {
        if (PyObject_TypeCheck(o, (PyTypeObject *)mmap_type)) {
            Py_DECREF(o);
            return 1;
        }
        PyObject *next;
        if (PyMemoryView_Check(o)) {
            next = Py_XNewRef(PyMemoryView_GET_BUFFER(o)->obj);
        } else if (!(next = PyObject_GetAttr(o, s_base))) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                Py_DECREF(o);
                return -1;
            }
            PyErr_Clear();
        }
        Py_DECREF(o);
        if (!next || next == Py_None) {
            Py_XDECREF(next);
            return 0;
        }
        o = next;
    }
    Py_DECREF(o);
    return 1;
}

/* Run a call of `coll` on `obj` (the data, or the output), `in` (the input of a call with
 * two buffers, else NULL) and the keys k0, k1 (NULL where unused: add's). */
static PyObject *callpath_run(CallPathObject *f, int coll, PyObject *obj, PyObject *in,
                              PyObject *k0, PyObject *k1)
{
    ArenaObject *a = f->arena;
    if (!a || !a->ctrl || a->c.pc >= 0)
        Py_RETURN_FALSE; /* released, or a call left half done: the Python path knows */
    call_sig *g = NULL;
    call_sig *list = f->sig[sig_row(coll)];
    const int nsig = f->count[sig_row(coll)];
    char *buf = NULL, *inbuf = NULL;
    PyObject *tp = (PyObject *)Py_TYPE(obj), *tin = in ? (PyObject *)Py_TYPE(in) : NULL;
    if (coll == C_BARRIER) {
        if (nsig)
            g = &list[0];
    } else {
        int i = 0;
        while (i < nsig && !(list[i].key[0] == k0 && list[i].key[1] == k1 &&
                             list[i].buf[0].type == tp && list[i].buf[1].type == tin))
            i++;
        if (i == nsig)
            Py_RETURN_FALSE;
        Py_buffer v, vi;
        if (buffer_of(obj, &v) < 0)
            Py_RETURN_FALSE;
        if (in && buffer_of(in, &vi) < 0) {
            PyBuffer_Release(&v);
            Py_RETURN_FALSE;
        }
        const char *fmt = v.format ? v.format : "B";
        const char *fmt_in = in ? (vi.format ? vi.format : "B") : "";
        const Py_ssize_t len_in = in ? vi.len : 0;
        for (; i < nsig; i++) {
            call_sig *s = &list[i];
            if (s->key[0] == k0 && s->key[1] == k1 && s->buf[0].type == tp &&
                s->buf[0].len == v.len && !strcmp(s->buf[0].format, fmt) &&
                !(s->writes && v.readonly) && s->buf[1].type == tin &&
                s->buf[1].len == len_in && !strcmp(s->buf[1].format, fmt_in)) {
                g = s;
                break;
            }
        }
        /* obj and in are kept alive (keep[1], keep[0]) while the call runs */
        buf = v.buf;
        PyBuffer_Release(&v);
        if (in) {
            inbuf = vi.buf;
            PyBuffer_Release(&vi);
        }
    }
    if (!g)
        Py_RETURN_FALSE;
    if (g->large) {
        int mapped = maybe_mapped(obj);
        if (mapped < 0)
            PyErr_Clear(); /* a `base` that raises: the Python path sees to it */
        if (mapped)
            Py_RETURN_FALSE;
    }

    /* The group's state, as run_collective checks it (a destroyed world's engine is
     * stopped: close_world), and whether the transport was read lately. */
    pyc_book *b = &f->book;
    GroupStateObject *group = b->group;
    if (!pyc_book_usable(b) || group->polled != Py_True || !group->checked_at ||
        !PyFloat_CheckExact(group->checked_at))
        Py_RETURN_FALSE;
    int64_t t0 = now_ns();
    double checked = PyFloat_AS_DOUBLE(group->checked_at);
    if (!((double)t0 * 1e-9 - checked < (double)f->recheck_ns * 1e-9))
        Py_RETURN_FALSE; /* time to read the transport for abort notices: Python does */

    /* The engine (idle, and held until the call is done or handed over), the sequence
     * number and the flight recorder's entry. */
    int locked = pyc_book_lock(b);
    if (locked <= 0)
        return locked < 0 ? NULL : Py_NewRef(Py_False);
    pyc_booked c;
    int opened = pyc_book_open(b, g->fields, t0, &c);
    if (opened <= 0) {
        pyc_book_unlock(b);
        return opened < 0 ? NULL : Py_NewRef(Py_False);
    }

    /* The call itself. */
    PlanObject *plan = (PlanObject *)g->plan;
    static const int64_t unshared[BUF_WORDS] = {0, 0, 0, 0};
    int64_t n = buf ? plan->ann[2] : 0; /* the count add checked the lengths against */
    const long long seq = PyLong_AsLongLong(c.seq);
    pyc_start_call(a, plan, inbuf, buf, n, seq, unshared, in, buf ? obj : NULL);
    /* Another thread may change the table while this one waits without the GIL. */
    PyObject *prepared = Py_NewRef(g->prepared);
    g = NULL;
    int rc = pyc_step(a, f->budget_ns);
    if (rc == ST_DONE) {
        Py_DECREF(prepared);
        f->calls++;
        pyc_book_done(b, &c);
        Py_RETURN_TRUE;
    }
    /* It needs Python: the engine runs this thread's job now (Engine.run's state), then
     * `finish` resumes the call, raises as the Python path does, and frees the engine. */
    if (pyc_book_hand(b, &c) < 0) {
        Py_DECREF(prepared);
        return NULL;
    }
    f->handed++;
    PyObject *st = PyLong_FromLong(rc);
    PyObject *fargs[5] = {prepared, c.seq, c.entry ? c.entry : Py_None, st, c.started};
    PyObject *res = st ? PyObject_Vectorcall(f->finish, fargs, 5, NULL) : NULL;
    Py_DECREF(prepared);
    Py_XDECREF(st);
    pyc_booked_release(&c);
    if (!res)
        return NULL;
    Py_DECREF(res);
    f->calls++;
    Py_RETURN_TRUE;
}

/* all_reduce(tensor, op) -> True if done (or raised), False: run the Python path */
static PyObject *CallPath_all_reduce(CallPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(tensor, op)");
        return NULL;
    }
    return callpath_run(f, C_ALL_REDUCE, args[0], NULL, args[1], NULL);
}

/* broadcast(tensor, src) */
static PyObject *CallPath_broadcast(CallPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "broadcast(tensor, src)");
        return NULL;
    }
    return callpath_run(f, C_BROADCAST, args[0], NULL, args[1], NULL);
}

/* reduce(tensor, dst, op) */
static PyObject *CallPath_reduce(CallPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reduce(tensor, dst, op)");
        return NULL;
    }
    return callpath_run(f, C_REDUCE, args[0], NULL, args[1], args[2]);
}

/* all_gather(output, input): all_gather_into_tensor's */
static PyObject *CallPath_all_gather(CallPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_gather(output, input)");
        return NULL;
    }
    return callpath_run(f, C_ALL_GATHER, args[0], args[1], Py_None, NULL);
}

/* reduce_scatter(output, input, op): reduce_scatter_tensor's */
static PyObject *CallPath_reduce_scatter(CallPathObject *f, PyObject *const *args,
                                         Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reduce_scatter(output, input, op)");
        return NULL;
    }
    return callpath_run(f, C_REDUCE_SCATTER, args[0], args[1], args[2], NULL);
}

static PyObject *CallPath_barrier(CallPathObject *f, PyObject *Py_UNUSED(ignored))
{
    return callpath_run(f, C_BARRIER, Py_None, NULL, Py_None, NULL);
}

static PyObject *CallPath_forget(CallPathObject *f, PyObject *Py_UNUSED(ignored))
{
    for (int k = 0; k < PATH_ROWS; k++) {
        for (int i = 0; i < f->count[k]; i++)
            sig_clear(&f->sig[k][i]);
        f->count[k] = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *CallPath_get_calls(CallPathObject *f, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(f->calls);
}

static PyObject *CallPath_get_handed(CallPathObject *f, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(f->handed);
}

static PyObject *CallPath_get_size(CallPathObject *f, void *Py_UNUSED(closure))
{
    int n = 0;
    for (int k = 0; k < PATH_ROWS; k++)
        n += f->count[k];
    return PyLong_FromLong(n);
}

static PyMethodDef CallPath_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))CallPath_all_reduce, METH_FASTCALL,
     "all_reduce(tensor, op) -> True if it ran the call, False: run the Python path"},
    {"broadcast", (PyCFunction)(void (*)(void))CallPath_broadcast, METH_FASTCALL,
     "broadcast(tensor, src) -> True if it ran the call, False: run the Python path"},
    {"reduce", (PyCFunction)(void (*)(void))CallPath_reduce, METH_FASTCALL,
     "reduce(tensor, dst, op) -> True if it ran the call, False: run the Python path"},
    {"all_gather", (PyCFunction)(void (*)(void))CallPath_all_gather, METH_FASTCALL,
     "all_gather(output, input) -> True if it ran the call, False: run the Python path"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))CallPath_reduce_scatter, METH_FASTCALL,
     "reduce_scatter(output, input, op) -> True if it ran the call, False: run the Python path"},
    {"barrier", (PyCFunction)CallPath_barrier, METH_NOARGS,
     "barrier() -> True if it ran the call, False: run the Python path"},
    {"add", (PyCFunction)(void (*)(void))CallPath_add, METH_FASTCALL,
     "add(obj, key, plan, prepared, entry) -> bool: register a call signature"},
    {"forget", (PyCFunction)CallPath_forget, METH_NOARGS, "drop every signature"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef CallPath_getset[] = {
    {"calls", (getter)CallPath_get_calls, NULL, "calls this path completed", NULL},
    {"handed", (getter)CallPath_get_handed, NULL, "calls it handed to `finish`", NULL},
    {"size", (getter)CallPath_get_size, NULL, "signatures registered", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject CallPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.CallPath",
    .tp_doc = "CallPath(arena, group_state, engine_state, recorder, entry_type, finish, running, "
              "completed, recheck_ns, budget_ns): a group's compiled path of repeated calls.",
    .tp_basicsize = sizeof(CallPathObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)CallPath_init,
    .tp_dealloc = (destructor)CallPath_dealloc,
    .tp_traverse = (traverseproc)CallPath_traverse,
    .tp_clear = (inquiry)CallPath_clear,
    .tp_methods = CallPath_methods,
    .tp_getset = CallPath_getset,
};

int pyc_callpath_names(void)
{
    if (!s_base && !(s_base = PyUnicode_InternFromString("base")))
        return -1;
    if (!mmap_type) {
        PyObject *m = PyImport_ImportModule("mmap");
        if (!m)
            return -1;
        mmap_type = PyObject_GetAttrString(m, "mmap");
        Py_DECREF(m);
        if (!mmap_type)
            return -1;
        if (!PyType_Check(mmap_type)) {
            Py_CLEAR(mmap_type);
            PyErr_SetString(PyExc_TypeError, "mmap.mmap is not a type");
            return -1;
        }
    }
    return 0;
}
