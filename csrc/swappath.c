/* The compiled path of repeated small swaps over TCP (see swappath.h).
 *
 * runners/swap.py's SwapFast repeats an all_reduce between two ranks whose schedule is one
 * swap of the whole buffer (recursive doubling at p=2) in Python; this does the same call
 * in C, from the API function to the compiled round (swapio.c) and back, for the case that
 * matters for latency: a frame small enough for the connection's read buffer, reduced by a
 * compiled kernel (SwapFast.compiled_spec says which signatures). SwapFast stays the
 * reference and the way for everything else: a call this path does not know, or finds the
 * transport anything but plain for, goes to SwapFast.all_reduce before anything is touched;
 * a round that is not plain (a partial send, another frame first, a wait past the polling
 * budget, a lost connection) goes to SwapFast.hand_over, which settles the transport's state
 * the regular way and hands the call to the group's `finish`, as SwapFast does.
 *
 * What it reads:
 *  - the group's and engine's C-owned records, the engine's lock, the flight recorder
 *    (callbook.h), as callpath.c does;
 *  - the transport's fields swap_ready reads (transport/tcp/swap.py), by key from its
 *    instance dict (TransportState keeps them as plain attributes): every key is checked
 *    when the path is made, and one missing later raises instead of declining, so a
 *    rename on the Python side cannot turn this path off unnoticed;
 *  - the connection's fields at the offsets of Conn's __slots__ (conn.py), and the
 *    timeline's WaitClock.on likewise.
 * The frame header is the signature's, packed once, with the sequence number written in
 * at its offset (transport/_wire.py SEQ_OFFSET); the Header object the call tracker and
 * `conn.last` keep is built from the signature's fields and the sequence number. */
#include "swappath.h"


#include "callbook.h"
#include "swapio.h"

#define SWAP_SIGS 16 /* signatures kept (runners/swap.py MAX_SIGS); the oldest replaced */
#define SIG_DIMS 8
#define FORMAT_CHARS 8
#define HEAD_MAX 64

/* The transport's fields this reads (transport/tcp/state.py). */
enum { T_CONNS, T_UNEXPECTED, T_POSTED, T_POSTED_ANY, T_ABORTED, T_INTERRUPTED, T_CLOSED,
       T_SWAP, T_SPIN, T_COUNT };
static const char *const transport_fields[T_COUNT] = {
    "_conns", "_unexpected", "_posted", "_posted_any", "_aborted", "_interrupted", "_closed",
    "_swap", "_spin",
};
static PyObject *t_names[T_COUNT];
/* The connection's (transport/tcp/conn.py Conn.__slots__). */
enum { K_LOST, K_OUTQ, K_CUR, K_RPOS, K_REND, K_LAST, K_RBUF, K_COUNT };
static const char *const conn_fields[K_COUNT] = {"lost", "outq", "cur", "rpos", "rend", "last",
                                                 "rbuf"};

typedef struct {
    PyObject *type; /* the buffer's type (NULL: a free slot) */
    PyObject *key;  /* the op as the caller passed it */
    Py_ssize_t len;
    int ndim;
    Py_ssize_t shape[SIG_DIMS];
    char format[FORMAT_CHARS];
    PyObject *sig;    /* SwapFast's _Sig of it: handed back with a call that needs Python */
    PyObject *peer;   /* the peer's rank: its key in the transport's connections */
    PyObject *conn;   /* its Conn */
    PyObject *rbuf;   /* conn.rbuf (a memoryview of a bytearray: its memory stays put) */
    PyObject *into;   /* where the peer's payload lands (the _Sig's, likewise) */
    PyObject *header; /* the frame's Header but for its sequence number */
    unsigned char head[HEAD_MAX]; /* the frame's header, packed */
    size_t head_len;
    int fd;
    pyc_kernel kernel;
    size_t itemsize;
    PyObject *fields[BOOK_STATIC];
} swap_sig;

typedef struct {
    PyObject_HEAD
    pyc_book book;
    PyObject *fallback; /* runners/swap.py's SwapFast */
    PyObject *fallback_all_reduce, *fallback_add, *compiled_spec, *handed_cb;
    PyObject *tdict;       /* the transport's instance dict */
    PyObject *begin;       /* its call tracker's `begin` */
    PyObject *wait_clock;  /* observe/timeline.py WAIT */
    PyTypeObject *header_type;
    Py_ssize_t conn_off[K_COUNT], wait_on_off;
    Py_ssize_t seq_field, group_field, seq_offset;
    double spin_max;
    int64_t calls, handed, folded;
    int count, evict;
    swap_sig sig[SWAP_SIGS];
} SwapPathObject;

static void sig_clear(swap_sig *g)
{
    Py_CLEAR(g->type);
    Py_CLEAR(g->key);
    Py_CLEAR(g->sig);
    Py_CLEAR(g->peer);
    Py_CLEAR(g->conn);
    Py_CLEAR(g->rbuf);
    Py_CLEAR(g->into);
    Py_CLEAR(g->header);
    for (int j = 0; j < BOOK_STATIC; j++)
        Py_CLEAR(g->fields[j]);
}

static int SwapPath_traverse(SwapPathObject *f, visitproc visit, void *arg)
{
    Py_VISIT(f->fallback);
    Py_VISIT(f->fallback_all_reduce);
    Py_VISIT(f->fallback_add);
    Py_VISIT(f->compiled_spec);
    Py_VISIT(f->handed_cb);
    Py_VISIT(f->tdict);
    Py_VISIT(f->begin);
    Py_VISIT(f->wait_clock);
    Py_VISIT(f->header_type);
    for (int i = 0; i < f->count; i++) {
        swap_sig *g = &f->sig[i];
        Py_VISIT(g->type);
        Py_VISIT(g->key);
        Py_VISIT(g->sig);
        Py_VISIT(g->peer);
        Py_VISIT(g->conn);
        Py_VISIT(g->rbuf);
        Py_VISIT(g->into);
        Py_VISIT(g->header);
        for (int j = 0; j < BOOK_STATIC; j++)
            Py_VISIT(g->fields[j]);
    }
    return pyc_book_traverse(&f->book, visit, arg);
}

static int SwapPath_clear(SwapPathObject *f)
{
    Py_CLEAR(f->fallback);
    Py_CLEAR(f->fallback_all_reduce);
    Py_CLEAR(f->fallback_add);
    Py_CLEAR(f->compiled_spec);
    Py_CLEAR(f->handed_cb);
    Py_CLEAR(f->tdict);
    Py_CLEAR(f->begin);
    Py_CLEAR(f->wait_clock);
    Py_CLEAR(f->header_type);
    for (int i = 0; i < f->count; i++)
        sig_clear(&f->sig[i]);
    f->count = 0;
    pyc_book_clear(&f->book);
    return 0;
}

static void SwapPath_dealloc(SwapPathObject *f)
{
    PyObject_GC_UnTrack(f);
    SwapPath_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* The position of `name` in a NamedTuple type's _fields, or -1 with an exception set. */
static Py_ssize_t field_index(PyObject *type, const char *name)
{
    PyObject *fields = PyObject_GetAttrString(type, "_fields");
    if (!fields)
        return -1;
    Py_ssize_t found = -1;
    if (PyTuple_Check(fields))
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(fields, i), name) == 0)
                found = i;
    Py_DECREF(fields);
    if (found < 0)
        PyErr_Format(PyExc_TypeError, "SwapPath: the header type has no field %s", name);
    return found;
}

/* SwapPath(fallback, group_state, engine_state, recorder, entry_type, running, completed,
 *          transport, conn_type, header_type, seq_offset, wait_clock, spin_max) */
static int SwapPath_init(SwapPathObject *f, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fallback", "group_state", "engine_state", "recorder",
                             "entry_type", "running", "completed", "transport", "conn_type",
                             "header_type", "seq_offset", "wait_clock", "spin_max", NULL};
    PyObject *fallback, *group, *engine, *recorder, *entry_type, *running, *completed;
    PyObject *transport, *conn_type, *header_type, *wait_clock;
    Py_ssize_t seq_offset;
    double spin_max;
    if (f->fallback) {
        PyErr_SetString(PyExc_RuntimeError, "SwapPath is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOO!O!nOd", kwlist, &fallback, &group,
                                     &engine, &recorder, &entry_type, &running, &completed,
                                     &transport, &PyType_Type, &conn_type, &PyType_Type,
                                     &header_type, &seq_offset, &wait_clock, &spin_max))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)header_type, &PyTuple_Type) || seq_offset < 0 ||
        seq_offset + 8 > HEAD_MAX || !(spin_max >= 0.0 && spin_max <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "SwapPath: a tuple header type, a sequence "
                                          "number's offset in its packed header and a "
                                          "polling budget of 0 to 1 s");
        return -1;
    }
    f->fallback = Py_NewRef(fallback);
    if (pyc_book_init(&f->book, group, engine, recorder, entry_type, running, completed) < 0)
        return -1;
    for (int i = 0; i < T_COUNT; i++)
        if (!t_names[i] && !(t_names[i] = PyUnicode_InternFromString(transport_fields[i])))
            return -1;
    if (!(f->fallback_all_reduce = PyObject_GetAttrString(fallback, "all_reduce")) ||
        !(f->fallback_add = PyObject_GetAttrString(fallback, "add")) ||
        !(f->compiled_spec = PyObject_GetAttrString(fallback, "compiled_spec")) ||
        !(f->handed_cb = PyObject_GetAttrString(fallback, "hand_over")))
        return -1;
    f->tdict = PyObject_GenericGetDict(transport, NULL);
    if (!f->tdict)
        return -1;
    for (int i = 0; i < T_COUNT; i++)
        if (!PyDict_GetItemWithError(f->tdict, t_names[i])) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "SwapPath: the transport has no %s",
                             transport_fields[i]);
            return -1;
        }
    PyObject *calls = PyObject_GetAttrString(transport, "_calls");
    if (!calls)
        return -1;
    f->begin = PyObject_GetAttrString(calls, "begin");
    Py_DECREF(calls);
    if (!f->begin)
        return -1;
    for (int i = 0; i < K_COUNT; i++)
        if (pyc_slot_offset(conn_type, conn_fields[i], &f->conn_off[i]) < 0)
            return -1;
    if (pyc_slot_offset((PyObject *)Py_TYPE(wait_clock), "on", &f->wait_on_off) < 0)
        return -1;
    f->wait_clock = Py_NewRef(wait_clock);
    f->header_type = (PyTypeObject *)Py_NewRef(header_type);
    if ((f->seq_field = field_index(header_type, "seq")) < 0 ||
        (f->group_field = field_index(header_type, "group")) < 0)
        return -1;
    f->seq_offset = seq_offset;
    f->spin_max = spin_max;
    return 0;
}

/* obj's buffer, writable and C-contiguous, or -1 (no exception: the caller declines). */
static int buffer_of(PyObject *obj, Py_buffer *v)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static int sig_matches(const swap_sig *g, const Py_buffer *v)
{
    const char *fmt = v->format ? v->format : "B";
    if (g->len != v->len || g->ndim != v->ndim || strcmp(g->format, fmt))
        return 0;
    for (int d = 0; d < v->ndim; d++)
        if (g->shape[d] != v->shape[d])
            return 0;
    return 1;
}

/* add(obj, key, plan, prepared, entry) -> bool: SwapFast.add, and the signature kept here
 * too when SwapFast.compiled_spec gives it: (sig, into, peer, conn, fd, header, head, op,
 * dtype): its _Sig, where the payload lands, the peer, its connection and socket, the
 * frame's Header and its packed bytes, the kernel's codes. */
static PyObject *SwapPath_add(SwapPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "add(obj, key, plan, prepared, entry)");
        return NULL;
    }
    PyObject *added = PyObject_Vectorcall(f->fallback_add, args, 5, NULL);
    if (!added || added != Py_True || !pyc_book_entry_ok(&f->book, args[4]))
        return added;
    Py_DECREF(added);
    PyObject *spec = PyObject_Vectorcall(f->compiled_spec, args, 2, NULL);
    if (!spec)
        return NULL;
    PyObject *sig, *into, *peer, *conn, *header, *head;
    int fd, op, dtype;
    swap_sig g = {0};
    Py_buffer v;
    int ok = spec != Py_None &&
             PyArg_ParseTuple(spec, "OOOOiO!Sii", &sig, &into, &peer, &conn, &fd,
                              f->header_type, &header, &head, &op, &dtype);
    if (!ok || buffer_of(args[0], &v) < 0) {
        Py_DECREF(spec);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_TRUE; /* SwapFast has it */
    }
    const char *fmt = v.format ? v.format : "B";
    PyObject *rbuf = pyc_slot_get(conn, f->conn_off[K_RBUF]);
    size_t isz = (size_t)pyc_itemsize(dtype);
    g.kernel = (isz && op >= 0 && op < OP_COUNT && op != OP_AVG) ? kset->table[dtype][op] : NULL;
    g.itemsize = isz;
    g.len = v.len;
    g.ndim = v.ndim;
    g.head_len = (size_t)PyBytes_GET_SIZE(head);
    ok = g.kernel && strlen(fmt) < FORMAT_CHARS && v.ndim <= SIG_DIMS && fd >= 0 &&
         v.len % (Py_ssize_t)isz == 0 && rbuf && PyMemoryView_Check(rbuf) &&
         PyMemoryView_GET_BUFFER(rbuf)->len >= (Py_ssize_t)g.head_len + v.len &&
         g.head_len <= HEAD_MAX && (size_t)f->seq_offset + 8 <= g.head_len &&
         PyTuple_GET_SIZE(header) > f->seq_field && PyTuple_GET_SIZE(header) > f->group_field;
    if (ok) {
        strcpy(g.format, fmt);
        for (int d = 0; d < v.ndim; d++)
            g.shape[d] = v.shape[d];
        memcpy(g.head, PyBytes_AS_STRING(head), g.head_len);
        g.fd = fd;
        /* memoryviews of bytearrays, as the connection's read buffer: their memory stays put */
        ok = PyMemoryView_Check(into) && PyByteArray_Check(PyMemoryView_GET_BUFFER(into)->obj) &&
             PyByteArray_Check(PyMemoryView_GET_BUFFER(rbuf)->obj) &&
             !PyMemoryView_GET_BUFFER(into)->readonly &&
             PyMemoryView_GET_BUFFER(into)->len == v.len &&
             PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(into), 'C');
    }
    PyBuffer_Release(&v);
    if (!ok) {
        Py_DECREF(spec);
        Py_RETURN_TRUE;
    }
    g.type = Py_NewRef((PyObject *)Py_TYPE(args[0]));
    g.key = Py_NewRef(args[1]);
    g.sig = Py_NewRef(sig);
    g.peer = Py_NewRef(peer);
    g.conn = Py_NewRef(conn);
    g.rbuf = Py_NewRef(rbuf);
    g.into = Py_NewRef(into);
    g.header = Py_NewRef(header);
    pyc_book_fields(&f->book, args[4], g.fields);
    Py_DECREF(spec);
    int i = 0;
    while (i < f->count && !(f->sig[i].type == g.type && f->sig[i].key == g.key &&
                             f->sig[i].len == g.len && f->sig[i].ndim == g.ndim &&
                             !memcmp(f->sig[i].shape, g.shape, sizeof g.shape) &&
                             !strcmp(f->sig[i].format, g.format)))
        i++;
    if (i == SWAP_SIGS) { /* full: replace one, round robin */
        i = f->evict;
        f->evict = (f->evict + 1) % SWAP_SIGS;
    }
    if (i == f->count)
        f->count++;
    else
        sig_clear(&f->sig[i]);
    f->sig[i] = g;
    Py_RETURN_TRUE;
}

/* Whether the transport is as plain as `swap` needs (TCPTransport.swap_ready, but for a
 * frame kept early: SwapFast takes that one): 1, 0, or -1 with an exception set. */
static int transport_ready(SwapPathObject *f, const swap_sig *g, double *spin)
{
    PyObject *v[T_COUNT];
    for (int i = 0; i < T_COUNT; i++) {
        v[i] = PyDict_GetItemWithError(f->tdict, t_names[i]);
        if (!v[i]) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError,
                             "SwapPath: the transport lost its %s (transport/tcp/state.py "
                             "defines the fields this path reads)", transport_fields[i]);
            return -1;
        }
    }
    for (int i = T_UNEXPECTED; i <= T_ABORTED; i++)
        if (!PyDict_CheckExact(v[i]) || PyDict_GET_SIZE(v[i]))
            return 0;
    if (!PyDict_CheckExact(v[T_CONNS]) || PyDict_GET_SIZE(v[T_CONNS]) != 1 ||
        v[T_INTERRUPTED] != Py_None || v[T_CLOSED] != Py_False || v[T_SWAP] != Py_None ||
        !PyFloat_CheckExact(v[T_SPIN]))
        return 0;
    PyObject *conn = PyDict_GetItemWithError(v[T_CONNS], g->peer);
    if (conn != g->conn)
        return PyErr_Occurred() ? -1 : 0;
    const Py_ssize_t *off = f->conn_off;
    PyObject *rpos = pyc_slot_get(conn, off[K_RPOS]), *rend = pyc_slot_get(conn, off[K_REND]);
    PyObject *outq = pyc_slot_get(conn, off[K_OUTQ]);
    if (pyc_slot_get(conn, off[K_LOST]) != Py_None || pyc_slot_get(conn, off[K_CUR]) != Py_None ||
        pyc_slot_get(conn, off[K_RBUF]) != g->rbuf || !outq || !rpos || !rend ||
        !PyLong_CheckExact(rpos) || !PyLong_CheckExact(rend) ||
        pyc_slot_get(f->wait_clock, f->wait_on_off) != Py_False)
        return 0;
    Py_ssize_t queued = PyObject_Size(outq);
    if (queued < 0)
        return -1;
    if (queued || PyObject_RichCompareBool(rpos, rend, Py_EQ) != 1)
        return PyErr_Occurred() ? -1 : 0;
    *spin = PyFloat_AS_DOUBLE(v[T_SPIN]);
    return 1;
}

/* The call's Header: the signature's with the sequence number `seq`. */
static PyObject *header_of(SwapPathObject *f, const swap_sig *g, PyObject *seq)
{
    const Py_ssize_t n = PyTuple_GET_SIZE(g->header);
    PyObject *h = f->header_type->tp_alloc(f->header_type, n);
    if (!h)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(h, i, Py_NewRef(i == f->seq_field ? seq : PyTuple_GET_ITEM(g->header, i)));
    return h;
}

/* The exception being raised, taken (never NULL): SwapFast.hand_over gives it to the
 * call's `finish`, which fails the call with it on this rank and tells the peers. */
static PyObject *raised(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value ? value : Py_NewRef(PyExc_MemoryError); /* (a class: `raise` makes one) */
}

/* all_reduce(tensor, op) -> True if done (or raised), False: run the Python path */
static PyObject *SwapPath_all_reduce(SwapPathObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(tensor, op)");
        return NULL;
    }
    PyObject *obj = args[0], *op = args[1];
    PyObject *tp = (PyObject *)Py_TYPE(obj);
    int i = 0;
    while (i < f->count && !(f->sig[i].type == tp && f->sig[i].key == op))
        i++;
    if (i == f->count)
        return PyObject_Vectorcall(f->fallback_all_reduce, args, 2, NULL);
    Py_buffer v;
    if (buffer_of(obj, &v) < 0)
        return PyObject_Vectorcall(f->fallback_all_reduce, args, 2, NULL);
    for (; i < f->count; i++)
        if (f->sig[i].type == tp && f->sig[i].key == op && sig_matches(&f->sig[i], &v))
            break;
    pyc_book *b = &f->book;
    if (i == f->count || (uintptr_t)v.buf % f->sig[i].itemsize || !pyc_book_usable(b)) {
        PyBuffer_Release(&v);
        return PyObject_Vectorcall(f->fallback_all_reduce, args, 2, NULL);
    }
    swap_sig *g = &f->sig[i];
    int locked = pyc_book_lock(b);
    if (locked < 0) {
        PyBuffer_Release(&v);
        return NULL;
    }
    double spin = 0.0;
    int ready = locked ? transport_ready(f, g, &spin) : 0;
    if (ready <= 0) {
        if (locked)
            pyc_book_unlock(b);
        PyBuffer_Release(&v);
        return ready < 0 ? NULL : PyObject_Vectorcall(f->fallback_all_reduce, args, 2, NULL);
    }
    /* What the call needs of its signature, taken now: whatever runs Python from here on
     * (the recorder, the tracker's `begin`, a collection) may let another thread change
     * the table. */
    unsigned char head[HEAD_MAX];
    const size_t head_len = g->head_len, nbytes = (size_t)v.len, isz = g->itemsize;
    memcpy(head, g->head, head_len);
    const int fd = g->fd;
    const pyc_kernel kernel = g->kernel;
    PyObject *sig = Py_NewRef(g->sig), *conn = Py_NewRef(g->conn), *rbuf = Py_NewRef(g->rbuf);
    PyObject *into = Py_NewRef(g->into), *result = NULL;
    PyObject *header = header_of(f, g, b->group->seq); /* the seq open takes */
    pyc_booked c;
    int opened = header ? pyc_book_open(b, g->fields, now_ns(), &c) : -1;
    g = NULL;
    if (opened <= 0) {
        Py_XDECREF(header);
        Py_DECREF(sig);
        Py_DECREF(conn);
        Py_DECREF(rbuf);
        Py_DECREF(into);
        pyc_book_unlock(b);
        PyBuffer_Release(&v);
        return opened < 0 ? NULL : PyObject_Vectorcall(f->fallback_all_reduce, args, 2, NULL);
    }
    /* From here the call is this path's: it ends done, or handed to SwapFast.hand_over. */
    /* the call tracker's view (it judges probes and early frames against it) */
    PyObject *bargs[3] = {PyTuple_GET_ITEM(header, f->group_field), header, b->empty_tuple};
    PyObject *begun = PyObject_Vectorcall(f->begin, bargs, 3, NULL);
    Py_XDECREF(begun);
    if (!PyErr_Occurred()) {
        uint64_t s = (uint64_t)PyLong_AsLongLong(c.seq);
        for (int k = 0; k < 8; k++) /* little-endian, as _wire packs it */
            head[f->seq_offset + k] = (unsigned char)(s >> (8 * k));
        Py_buffer *rb = PyMemoryView_GET_BUFFER(rbuf), *ib = PyMemoryView_GET_BUFFER(into);
        pyc_swap_result r;
        Py_BEGIN_ALLOW_THREADS
        pyc_swap_round(fd, (const char *)head, head_len, v.buf, nbytes, rb->buf,
                       (size_t)rb->len, (int64_t)(spin * 1e9), ib->buf, v.buf, kernel, isz,
                       &r);
        Py_END_ALLOW_THREADS
        if (r.landed && r.sent == head_len + nbytes) {
            const Py_ssize_t *off = f->conn_off;
            pyc_slot_put(conn, off[K_REND], PyLong_FromLong(0));
            pyc_slot_put(conn, off[K_RPOS], PyLong_FromLong(0));
            pyc_slot_put(conn, off[K_LAST], header);
            header = NULL;
            double grown = spin * 2 < f->spin_max ? spin * 2 : f->spin_max;
            if (spin > 0 && grown != spin) { /* the budget grows, as _took's */
                PyObject *x = PyFloat_FromDouble(grown);
                if (!x || PyDict_SetItem(f->tdict, t_names[T_SPIN], x) < 0)
                    PyErr_WriteUnraisable((PyObject *)f);
                Py_XDECREF(x);
            }
            f->calls++;
            f->folded++;
            pyc_book_done(b, &c);
            PyBuffer_Release(&v);
            Py_DECREF(sig);
            Py_DECREF(conn);
            Py_DECREF(rbuf);
            Py_DECREF(into);
            Py_RETURN_TRUE;
        }
        result = Py_BuildValue("(nniiii)", (Py_ssize_t)r.sent, (Py_ssize_t)r.end, r.send_err,
                               r.recv_status, r.spun, r.landed);
    }
    if (!result) /* a probe kept for this call disagrees (begin raised), or no memory */
        result = raised();
    PyBuffer_Release(&v);
    Py_DECREF(conn);
    Py_DECREF(rbuf);
    Py_DECREF(into);
    /* It needs Python: the engine runs this thread's job now, and SwapFast.hand_over settles
     * the transport the regular way and gives the call to the group's `finish`. */
    PyObject *res = NULL;
    if (pyc_book_hand(b, &c) == 0) {
        f->handed++;
        PyObject *hargs[7] = {sig, obj, header, result, c.seq, c.entry ? c.entry : Py_None,
                              c.started};
        res = PyObject_Vectorcall(f->handed_cb, hargs, 7, NULL);
        pyc_booked_release(&c);
        if (res)
            f->calls++;
    }
    Py_DECREF(sig);
    Py_DECREF(header);
    Py_DECREF(result);
    if (!res)
        return NULL;
    Py_DECREF(res);
    Py_RETURN_TRUE;
}

static PyObject *SwapPath_never(SwapPathObject *Py_UNUSED(f), PyObject *const *Py_UNUSED(args),
                                Py_ssize_t Py_UNUSED(nargs))
{
    Py_RETURN_FALSE; /* only all_reduce repeats here (SwapFast's other methods alike) */
}

static PyObject *SwapPath_forget(SwapPathObject *f, PyObject *Py_UNUSED(ignored))
{
    for (int i = 0; i < f->count; i++)
        sig_clear(&f->sig[i]);
    f->count = 0;
    return PyObject_CallMethod(f->fallback, "forget", NULL);
}

/* This path's count plus SwapFast's (which runs what this one declines). */
static PyObject *with_fallback(SwapPathObject *f, const char *name, int64_t own)
{
    PyObject *theirs = PyObject_GetAttrString(f->fallback, name);
    if (!theirs)
        return NULL;
    PyObject *mine = PyLong_FromLongLong(own);
    PyObject *sum = mine ? PyNumber_Add(theirs, mine) : NULL;
    Py_DECREF(theirs);
    Py_XDECREF(mine);
    return sum;
}

static PyObject *SwapPath_get_calls(SwapPathObject *f, void *Py_UNUSED(closure))
{
    return with_fallback(f, "calls", f->calls);
}

static PyObject *SwapPath_get_handed(SwapPathObject *f, void *Py_UNUSED(closure))
{
    return with_fallback(f, "handed", f->handed);
}

static PyObject *SwapPath_get_folded(SwapPathObject *f, void *Py_UNUSED(closure))
{
    return with_fallback(f, "folded", f->folded);
}

static PyObject *SwapPath_get_compiled(SwapPathObject *f, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(f->calls);
}

static PyObject *SwapPath_get_size(SwapPathObject *f, void *Py_UNUSED(closure))
{
    return PyObject_GetAttrString(f->fallback, "size");
}

static PyMethodDef SwapPath_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))SwapPath_all_reduce, METH_FASTCALL,
     "all_reduce(tensor, op) -> True if it ran the call, False: run the Python path"},
    {"broadcast", (PyCFunction)(void (*)(void))SwapPath_never, METH_FASTCALL, "False"},
    {"reduce", (PyCFunction)(void (*)(void))SwapPath_never, METH_FASTCALL, "False"},
    {"all_gather", (PyCFunction)(void (*)(void))SwapPath_never, METH_FASTCALL, "False"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))SwapPath_never, METH_FASTCALL, "False"},
    {"barrier", (PyCFunction)(void (*)(void))SwapPath_never, METH_FASTCALL, "False"},
    {"add", (PyCFunction)(void (*)(void))SwapPath_add, METH_FASTCALL,
     "add(obj, key, plan, prepared, entry) -> bool: register a call signature"},
    {"forget", (PyCFunction)SwapPath_forget, METH_NOARGS, "drop every signature"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SwapPath_getset[] = {
    {"calls", (getter)SwapPath_get_calls, NULL, "calls this path and SwapFast ran", NULL},
    {"handed", (getter)SwapPath_get_handed, NULL, "of which handed to `finish`", NULL},
    {"folded", (getter)SwapPath_get_folded, NULL, "of which the compiled round reduced", NULL},
    {"compiled", (getter)SwapPath_get_compiled, NULL, "calls this path ran in C", NULL},
    {"size", (getter)SwapPath_get_size, NULL, "signatures registered", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SwapPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.SwapPath",
    .tp_doc = "SwapPath(fallback, group_state, engine_state, recorder, entry_type, running, "
              "completed, transport, conn_type, header_type, seq_offset, wait_clock, "
              "spin_max): the compiled path of repeated small swaps over TCP.",
    .tp_basicsize = sizeof(SwapPathObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SwapPath_init,
    .tp_dealloc = (destructor)SwapPath_dealloc,
    .tp_traverse = (traverseproc)SwapPath_traverse,
    .tp_clear = (inquiry)SwapPath_clear,
    .tp_methods = SwapPath_methods,
    .tp_getset = SwapPath_getset,
};
