/* The Arena type (see arena_type.h): run(plan, ...) announces a call and runs it; it
 * returns DONE or what the call needs from Python (arena.h), and resume() goes on. */
#include "arena_type.h"

#include "arena.h"
#include "plan.h"
#include "wait.h"

static PyObject *step(ArenaObject *a, int64_t budget_ns)
{
    return PyLong_FromLong(pyc_step(a, budget_ns));
}

/* Arena.run(plan, inp, out, seq, budget_ns, shared=None) -> status */
static PyObject *Arena_run(ArenaObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "run(plan, inp, out, seq, budget_ns, shared=None)");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "run: plan must be a Plan");
        return NULL;
    }
    PlanObject *plan = (PlanObject *)args[0];
    int64_t seq = PyLong_AsLongLong(args[3]);
    int64_t budget = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    int64_t shared[BUF_WORDS] = {0, 0, 0, 0};
    if (nargs == 6 && args[5] != Py_None) {
        PyObject *t = args[5];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != BUF_WORDS) {
            PyErr_SetString(PyExc_TypeError, "run: shared must be a 4-tuple or None");
            return NULL;
        }
        for (int i = 0; i < BUF_WORDS; i++)
            shared[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (PyErr_Occurred())
            return NULL;
    }
    const int r = a->rank, coll = plan->coll;
    const size_t isz = plan->itemsize;
    char *in = NULL, *out = NULL;
    int64_t n = 0;
    Py_buffer vin, vout;
    if (coll != C_BARRIER) {
        /* Which buffers this rank writes: reduce's non-roots and broadcast's root only read. */
        int writes = !((coll == C_REDUCE && plan->root != r) ||
                       (coll == C_BROADCAST && plan->root == r));
        int gathers = coll == C_ALL_GATHER || coll == C_REDUCE_SCATTER;
        if (pyc_get_buffer(args[2], &vout, writes, gathers ? "output" : "data") < 0)
            return NULL;
        out = vout.buf;
        Py_ssize_t outlen = vout.len;
        PyBuffer_Release(&vout);
        if (gathers) {
            if (pyc_get_buffer(args[1], &vin, 0, "input") < 0)
                return NULL;
            in = vin.buf;
            Py_ssize_t inlen = vin.len;
            PyBuffer_Release(&vin);
            Py_ssize_t block = coll == C_ALL_GATHER ? inlen : outlen;
            Py_ssize_t whole = coll == C_ALL_GATHER ? outlen : inlen;
            if (whole != block * a->size) {
                PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %d x %zd",
                             coll == C_ALL_GATHER ? "output" : "input", whole, a->size, block);
                return NULL;
            }
            n = (int64_t)(block / (Py_ssize_t)isz);
        } else {
            n = (int64_t)(outlen / (Py_ssize_t)isz);
        }
    }
    pyc_start_call(a, plan, in, out, n, seq, shared, in ? args[1] : NULL, out ? args[2] : NULL);
    return step(a, budget);
}

static PyObject *Arena_resume(ArenaObject *a, PyObject *arg)
{
    int64_t budget = PyLong_AsLongLong(arg);
    if (budget == -1 && PyErr_Occurred())
        return NULL;
    if (a->c.pc < 0) {
        PyErr_SetString(PyExc_RuntimeError, "resume: no call in progress");
        return NULL;
    }
    return step(a, budget);
}

/* set_views(None | sequence of every rank's buffer of this call, in rank order) */
static PyObject *Arena_set_views(ArenaObject *a, PyObject *arg)
{
    call_t *c = &a->c;
    if (arg == Py_None) {
        c->have_views = 0;
        Py_RETURN_NONE;
    }
    PyObject *seq = PySequence_Fast(arg, "views must be a sequence of buffers");
    if (!seq)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != a->size) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "views: expected %d buffers", a->size);
        return NULL;
    }
    for (int q = 0; q < a->size; q++) {
        Py_buffer v;
        if (pyc_get_buffer(PySequence_Fast_GET_ITEM(seq, q), &v, 1, "views[q]") < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if ((size_t)v.len < (size_t)c->n * c->plan.itemsize) {
            PyBuffer_Release(&v);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "views: a buffer is shorter than the call's data");
            return NULL;
        }
        c->views[q] = v.buf;
        PyBuffer_Release(&v);
    }
    Py_XSETREF(a->keep[2], seq);
    c->have_views = 1;
    Py_RETURN_NONE;
}

static PyObject *Arena_bump(ArenaObject *a, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(pyc_bump(a));
}

/* wait(target, budget_ns) -> True once every peer reached target, False if the budget
 * ran out first (a phase driven from Python; no call checks). */
static PyObject *Arena_wait(ArenaObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(target, budget_ns)");
        return NULL;
    }
    int64_t target = PyLong_AsLongLong(args[0]);
    int64_t budget = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    call_t w;
    memset(&w, 0, sizeof w);
    w.target = target;
    if (a->pw_target == target && a->pw_started) {
        w.wstarted = 1; /* a wait resumed: keep its spin/yield/sleep schedule */
        w.wt0 = a->pw_t0;
    }
    a->ts = NULL;
    int rc = pyc_wait_all(a, &w, now_ns() + budget);
    if (a->ts) {
        PyEval_RestoreThread(a->ts);
        a->ts = NULL;
    }
    a->pw_target = target;
    a->pw_started = rc ? w.wstarted : 0;
    a->pw_t0 = w.wt0;
    return PyBool_FromLong(rc == 0);
}

static PyObject *Arena_set_spin(ArenaObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError,
                        "set_spin(pure_spins, yield_ns, oversubscribed, spin_ns=0, "
                        "busy_spins=pure_spins, busy_yield_ns=yield_ns, load_cpus=-1)");
        return NULL;
    }
    long spins = PyLong_AsLong(args[0]);
    int64_t yield_ns = PyLong_AsLongLong(args[1]);
    int over = PyObject_IsTrue(args[2]);
    int64_t spin_ns = nargs > 3 ? PyLong_AsLongLong(args[3]) : 0;
    long busy_spins = nargs > 4 ? PyLong_AsLong(args[4]) : spins;
    int64_t busy_yield_ns = nargs > 5 ? PyLong_AsLongLong(args[5]) : yield_ns;
    long load_cpus = nargs > 6 ? PyLong_AsLong(args[6]) : -1;
    if (PyErr_Occurred())
        return NULL;
    a->pure_spins = (int)(spins < 0 ? 0 : spins > INT_MAX ? INT_MAX : spins);
    a->yield_ns = yield_ns < 0 ? 0 : yield_ns;
    a->spin_ns = spin_ns < 0 ? 0 : spin_ns;
    a->oversubscribed = over;
    a->busy_spins = (int)(busy_spins < 0 ? 0 : busy_spins > INT_MAX ? INT_MAX : busy_spins);
    a->busy_yield_ns = busy_yield_ns < 0 ? 0 : busy_yield_ns;
    a->load_cpus = (int)(load_cpus < 0 ? -1 : load_cpus > INT_MAX ? INT_MAX : load_cpus);
    a->busy = 0;
    a->load_next = 0;
    Py_RETURN_NONE;
}

/* set_single_copy(min_bytes, piece_bytes, pids, reduce_min_bytes=min_bytes): calls of at
 * least min_bytes (0: none) by single copy with the processes `pids` (every rank's, in rank
 * order; this rank's ignored), piece_bytes at a time; all_reduce from reduce_min_bytes
 * only. Every rank of the group must be told alike. */
static PyObject *Arena_set_single_copy(ArenaObject *a, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "set_single_copy(min_bytes, piece_bytes, pids, reduce_min_bytes=min_bytes)");
        return NULL;
    }
    int64_t min_bytes = PyLong_AsLongLong(args[0]), piece = PyLong_AsLongLong(args[1]);
    int64_t reduce_min = nargs == 4 ? PyLong_AsLongLong(args[3]) : min_bytes;
    if (PyErr_Occurred())
        return NULL;
    if ((char *)a->ctrl - (char *)a->mem.buf < (H_CLAIM + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "set_single_copy: the arena has no header");
        return NULL;
    }
    if (min_bytes < 0 || reduce_min < 0 || piece < ALIGN_BYTES || piece > (1LL << 30) ||
        piece % ALIGN_BYTES) {
        PyErr_Format(PyExc_ValueError,
                     "set_single_copy: min_bytes >= 0, reduce_min_bytes >= 0 and piece_bytes a "
                     "multiple of %d up to 1 GiB, got %lld, %lld and %lld", ALIGN_BYTES,
                     (long long)min_bytes, (long long)reduce_min, (long long)piece);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "pids must be a sequence of ints");
    if (!seq)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != a->size) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "set_single_copy: expected %d pids", a->size);
        return NULL;
    }
    int64_t pids[MAX_RANKS];
    for (int q = 0; q < a->size; q++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, q));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if ((v <= 0 || v > INT_MAX) && q != a->rank && min_bytes > 0) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "set_single_copy: no process %lld", v);
            return NULL;
        }
        pids[q] = v;
    }
    Py_DECREF(seq);
    char *tmp = NULL;
    if (min_bytes > 0) {
        tmp = PyMem_RawMalloc((size_t)(a->size - 1 > 0 ? a->size - 1 : 1) * (size_t)piece);
        if (!tmp)
            return PyErr_NoMemory();
    }
    PyMem_RawFree(a->tmp);
    a->tmp = tmp;
    a->single_bytes = min_bytes;
    a->single_reduce_bytes = reduce_min;
    a->piece_bytes = piece;
    memcpy(a->pids, pids, sizeof(int64_t) * (size_t)a->size);
    Py_RETURN_NONE;
}

static PyObject *Arena_get_failure(ArenaObject *a, void *Py_UNUSED(closure))
{
    return Py_BuildValue("(ii)", a->c.err, a->c.err_peer);
}

static int Arena_init(ArenaObject *a, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"memory",     "ctrl_offset", "data_offset", "size",
                             "rank",       "slot_bytes",  "nbuf",        "small_bytes",
                             "chunk_bytes", "nt_bytes",   NULL};
    PyObject *mem;
    Py_ssize_t ctrl_off, data_off;
    long long slot_bytes, small_bytes, chunk_bytes, nt_bytes = INT64_MAX;
    int size, rank, nbuf;
    if (a->mem.obj) {
        PyErr_SetString(PyExc_RuntimeError, "Arena is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnniiLiLL|L", kwlist, &mem, &ctrl_off,
                                     &data_off, &size, &rank, &slot_bytes, &nbuf, &small_bytes,
                                     &chunk_bytes, &nt_bytes))
        return -1;
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size || nbuf < 1 || slot_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "Arena: bad size, rank, nbuf or slot_bytes");
        return -1;
    }
    if (PyObject_GetBuffer(mem, &a->mem, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t need = data_off + (Py_ssize_t)nbuf * size * slot_bytes;
    if (ctrl_off < 0 || ctrl_off % 8 || data_off < ctrl_off + (Py_ssize_t)size * WORDS * 8 ||
        a->mem.len < need) {
        PyBuffer_Release(&a->mem);
        a->mem.obj = NULL;
        PyErr_Format(PyExc_ValueError, "Arena: memory of %zd bytes, layout needs %zd", a->mem.len,
                     need);
        return -1;
    }
    a->ctrl = (int64_t *)((char *)a->mem.buf + ctrl_off);
    a->data = (char *)a->mem.buf + data_off;
    a->size = size;
    a->rank = rank;
    a->nbuf = nbuf;
    a->slot_bytes = slot_bytes;
    a->small_bytes = small_bytes;
    a->chunk_bytes = chunk_bytes;
    a->nt_bytes = nt_bytes;
    a->npeers = 0;
    for (int q = 0; q < size; q++)
        if (q != rank)
            a->peers[a->npeers++] = q;
    a->pure_spins = a->busy_spins = 256;
    a->yield_ns = a->busy_yield_ns = 1000000;
    a->load_cpus = -1;
    a->busy = 0;
    a->load_next = 0;
    a->next_buf = 0;
    a->c.pc = -1;
    return 0;
}

static void Arena_dealloc(ArenaObject *a)
{
    PyMem_RawFree(a->tmp);
    a->tmp = NULL;
    for (int i = 0; i < 3; i++)
        Py_CLEAR(a->keep[i]);
    if (a->mem.obj)
        PyBuffer_Release(&a->mem);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static PyObject *Arena_release(ArenaObject *a, PyObject *Py_UNUSED(ignored))
{
    for (int i = 0; i < 3; i++)
        Py_CLEAR(a->keep[i]);
    if (a->mem.obj) {
        PyBuffer_Release(&a->mem);
        a->mem.obj = NULL;
    }
    a->ctrl = NULL;
    a->size = 0;
    Py_RETURN_NONE;
}

static PyObject *Arena_get_epoch(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(ld(word(a, a->rank, EPOCH)));
}

static PyObject *Arena_get_next_buf(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(a->next_buf);
}

static int Arena_set_next_buf(ArenaObject *a, PyObject *v, void *Py_UNUSED(closure))
{
    long b = v ? PyLong_AsLong(v) : -1;
    if (b == -1 && PyErr_Occurred())
        return -1;
    if (b < 0 || b >= a->nbuf) {
        PyErr_SetString(PyExc_ValueError, "next_buf out of range");
        return -1;
    }
    a->next_buf = (int)b;
    return 0;
}

static PyObject *Arena_get_target(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(a->c.target);
}

static PyObject *Arena_get_peer(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(a->c.check_peer);
}

static PyObject *Arena_get_wait_ns(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(a->wait_ns);
}

static int Arena_set_wait_ns(ArenaObject *a, PyObject *v, void *Py_UNUSED(closure))
{
    long long x = v ? PyLong_AsLongLong(v) : 0;
    if (x == -1 && PyErr_Occurred())
        return -1;
    a->wait_ns = x;
    return 0;
}

static PyObject *Arena_get_busy(ArenaObject *a, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(a->busy);
}

static PyObject *Arena_lagging(ArenaObject *a, PyObject *arg)
{
    int64_t target = PyLong_AsLongLong(arg);
    if (target == -1 && PyErr_Occurred())
        return NULL;
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < a->npeers; i++) {
        if (ld(word(a, a->peers[i], EPOCH)) < target) {
            PyObject *q = PyLong_FromLong(a->peers[i]);
            if (!q || PyList_Append(out, q) < 0) {
                Py_XDECREF(q);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(q);
        }
    }
    return out;
}

static PyMethodDef Arena_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Arena_run, METH_FASTCALL,
     "run(plan, inp, out, seq, budget_ns, shared=None) -> status: announce the call and run it"},
    {"resume", (PyCFunction)Arena_resume, METH_O, "resume(budget_ns) -> status"},
    {"set_views", (PyCFunction)Arena_set_views, METH_O,
     "set_views(buffers or None): every rank's buffer of this call, after VIEWS"},
    {"bump", (PyCFunction)Arena_bump, METH_NOARGS, "enter the next phase; returns its number"},
    {"wait", (PyCFunction)(void (*)(void))Arena_wait, METH_FASTCALL,
     "wait(target, budget_ns) -> True when every peer reached target"},
    {"lagging", (PyCFunction)Arena_lagging, METH_O, "peers whose counter is below target"},
    {"set_spin", (PyCFunction)(void (*)(void))Arena_set_spin, METH_FASTCALL,
     "set_spin(pure_spins, yield_ns, oversubscribed, spin_ns=0, busy_spins=pure_spins, "
     "busy_yield_ns=yield_ns, load_cpus=-1): how waits keep the core, on a quiet machine "
     "and on a busy one (more runnable tasks than load_cpus; -1: never busy)"},
    {"release", (PyCFunction)Arena_release, METH_NOARGS, "let go of the segment's memory"},
    {"set_single_copy", (PyCFunction)(void (*)(void))Arena_set_single_copy, METH_FASTCALL,
     "set_single_copy(min_bytes, piece_bytes, pids, reduce_min_bytes=min_bytes): calls of at "
     "least min_bytes (0: none), all_reduce from reduce_min_bytes, read and write the peers' "
     "buffers directly (every rank told alike)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Arena_getset[] = {
    {"epoch", (getter)Arena_get_epoch, NULL, "this rank's phase counter", NULL},
    {"next_buf", (getter)Arena_get_next_buf, (setter)Arena_set_next_buf,
     "the buffer the next chunk takes", NULL},
    {"target", (getter)Arena_get_target, NULL, "the phase the call waits for", NULL},
    {"peer", (getter)Arena_get_peer, NULL, "the peer to check after CHECK", NULL},
    {"wait_ns", (getter)Arena_get_wait_ns, (setter)Arena_set_wait_ns,
     "nanoseconds spent waiting for peers", NULL},
    {"failure", (getter)Arena_get_failure, NULL,
     "(errno, rank) that stopped the last single-copy call (after FAILED)", NULL},
    {"busy", (getter)Arena_get_busy, NULL,
     "whether the machine was busy at the last reading of its load (set_spin's load_cpus)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject ArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.Arena",
    .tp_doc = "Arena(memory, ctrl_offset, data_offset, size, rank, slot_bytes, nbuf, "
              "small_bytes, chunk_bytes, nt_bytes=inf): this rank's view of a group's arena.",
    .tp_basicsize = sizeof(ArenaObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Arena_init,
    .tp_dealloc = (destructor)Arena_dealloc,
    .tp_methods = Arena_methods,
    .tp_getset = Arena_getset,
};
