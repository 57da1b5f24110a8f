/* The bookkeeping of a compiled path's call (see callbook.h). */
#include "callbook.h"

#include <structmember.h>

static const char *const entry_fields[BOOK_FIELDS] = {
    "id", "seq", "state", "t_issued", "t_started", "t_ended", "error", "culprits",
    /* the signature's own: */
    "group", "group_name", "kind", "count", "dtype", "algorithm", "op", "root", "detail",
};

static PyObject *s_next, *s_ring, *s_capacity, *s_acquire, *s_release;

static int names(void)
{
    struct { PyObject **name; const char *text; } list[] = {
        {&s_next, "_next"}, {&s_ring, "_ring"}, {&s_capacity, "capacity"},
        {&s_acquire, "acquire"}, {&s_release, "release"},
    };
    for (size_t i = 0; i < sizeof list / sizeof *list; i++)
        if (!*list[i].name && !(*list[i].name = PyUnicode_InternFromString(list[i].text)))
            return -1;
    return 0;
}

int pyc_book_init(pyc_book *b, PyObject *group, PyObject *engine, PyObject *recorder,
                  PyObject *entry_type, PyObject *running, PyObject *completed)
{
    if (names() < 0)
        return -1;
    if (!PyObject_TypeCheck(group, &GroupStateType) ||
        !PyObject_TypeCheck(engine, &EngineStateType) || !PyType_Check(entry_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "a GroupState, an EngineState and the flight recorder's entry type");
        return -1;
    }
    b->group = (GroupStateObject *)Py_NewRef(group);
    b->engine = (EngineStateObject *)Py_NewRef(engine);
    b->entry_type = Py_NewRef(entry_type);
    b->running = Py_NewRef(running);
    b->completed = Py_NewRef(completed);
    b->empty_str = PyUnicode_FromString("");
    b->empty_tuple = PyTuple_New(0);
    b->zero = PyFloat_FromDouble(0.0);
    if (!b->empty_str || !b->empty_tuple || !b->zero)
        return -1;
    EngineStateObject *e = b->engine;
    if (!e->lock || !e->queue || !e->deferred || !PyList_Check(e->deferred)) {
        PyErr_SetString(PyExc_TypeError, "the engine state is not initialised");
        return -1;
    }
    b->acquire = PyObject_GetAttr(e->lock, s_acquire);
    b->release = PyObject_GetAttr(e->lock, s_release);
    if (!b->acquire || !b->release)
        return -1;
    b->capacity = 0;
    if (recorder != Py_None) {
        PyObject *cap = PyObject_GetAttr(recorder, s_capacity);
        if (!cap)
            return -1;
        b->capacity = PyLong_AsSsize_t(cap);
        Py_DECREF(cap);
        if (b->capacity < 0) { /* (a path would then read a ring it does not hold) */
            b->capacity = 0;
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "the recorder's capacity must be >= 0");
            return -1;
        }
        if (!(b->ring = PyObject_GetAttr(recorder, s_ring)))
            return -1;
        if (!PyList_CheckExact(b->ring) || PyList_GET_SIZE(b->ring) != b->capacity) {
            PyErr_SetString(PyExc_TypeError,
                            "the recorder's ring must be a list of capacity entries");
            return -1;
        }
        b->recorder = Py_NewRef(recorder);
    }
    /* Where the Entry keeps each field: its __slots__' member descriptors. */
    for (int i = 0; i < BOOK_FIELDS; i++)
        if (pyc_slot_offset(entry_type, entry_fields[i], &b->off[i]) < 0)
            return -1;
    return 0;
}

int pyc_slot_offset(PyObject *type, const char *name, Py_ssize_t *off)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (!d)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok)
        *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok)
        PyErr_Format(PyExc_TypeError, "%s is not a slot of %R", name, type);
    return ok ? 0 : -1;
}

int pyc_book_traverse(pyc_book *b, visitproc visit, void *arg)
{
    Py_VISIT(b->group);
    Py_VISIT(b->engine);
    Py_VISIT(b->acquire);
    Py_VISIT(b->release);
    Py_VISIT(b->recorder);
    Py_VISIT(b->ring);
    Py_VISIT(b->entry_type);
    return 0;
}

void pyc_book_clear(pyc_book *b)
{
    Py_CLEAR(b->group);
    Py_CLEAR(b->engine);
    Py_CLEAR(b->acquire);
    Py_CLEAR(b->release);
    Py_CLEAR(b->recorder);
    Py_CLEAR(b->ring);
    Py_CLEAR(b->entry_type);
    Py_CLEAR(b->running);
    Py_CLEAR(b->completed);
    Py_CLEAR(b->empty_str);
    Py_CLEAR(b->empty_tuple);
    Py_CLEAR(b->zero);
    b->capacity = 0;
}

int pyc_book_entry_ok(const pyc_book *b, PyObject *entry)
{
    return !b->capacity || Py_IS_TYPE(entry, (PyTypeObject *)b->entry_type);
}

void pyc_book_fields(const pyc_book *b, PyObject *entry, PyObject **fields)
{
    for (int j = 0; j < BOOK_STATIC; j++)
        fields[j] = b->capacity ? Py_XNewRef(pyc_slot_get(entry, b->off[BOOK_FIRST_STATIC + j]))
                                : NULL;
}

int pyc_book_lock(pyc_book *b)
{
    PyObject *got = PyObject_CallOneArg(b->acquire, Py_False);
    if (!got) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(got);
    if (got != Py_True)
        return 0;
    EngineStateObject *e = b->engine;
    Py_ssize_t queued = PyObject_Size(e->queue);
    if (queued < 0) {
        pyc_book_unlock(b);
        return -1;
    }
    if (e->running != Py_False || e->stopped != Py_False || queued ||
        PyList_GET_SIZE(e->deferred) || !b->group->seq || !PyLong_CheckExact(b->group->seq)) {
        pyc_book_unlock(b);
        return 0;
    }
    return 1;
}

void pyc_book_unlock(pyc_book *b)
{
    PyObject *type, *value, *tb; /* an error the caller is raising stays set */
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallNoArgs(b->release);
    if (r)
        Py_DECREF(r);
    else
        PyErr_WriteUnraisable(b->release);
    PyErr_Restore(type, value, tb);
}

int pyc_book_open(pyc_book *b, PyObject *const *fields, int64_t t0, pyc_booked *c)
{
    GroupStateObject *group = b->group;
    PyObject *id = NULL, *entry = NULL, *nextid = NULL;
    const long long seq = PyLong_AsLongLong(group->seq);
    if (seq == -1 && PyErr_Occurred())
        return -1;
    if (b->capacity) {
        if (!(id = PyObject_GetAttr(b->recorder, s_next)))
            return -1;
        Py_ssize_t i = PyLong_AsSsize_t(id);
        if (i < 0 || PyList_GET_SIZE(b->ring) != b->capacity) {
            Py_DECREF(id);
            return PyErr_Occurred() ? -1 : 0;
        }
        PyObject *e = PyList_GET_ITEM(b->ring, i % b->capacity);
        if (!Py_IS_TYPE(e, (PyTypeObject *)b->entry_type)) {
            Py_DECREF(id);
            return 0;
        }
        if (!(nextid = PyLong_FromSsize_t(i + 1)) ||
            PyObject_SetAttr(b->recorder, s_next, nextid) < 0) {
            Py_DECREF(id);
            Py_XDECREF(nextid);
            return -1;
        }
        Py_DECREF(nextid);
        entry = Py_NewRef(e);
    }
    PyObject *nextseq = PyLong_FromLongLong(seq + 1);
    PyObject *started = PyFloat_FromDouble((double)t0 * 1e-9);
    if (!nextseq || !started) {
        Py_XDECREF(nextseq);
        Py_XDECREF(started);
        Py_XDECREF(entry);
        Py_XDECREF(id);
        return -1;
    }
    c->seq = Py_NewRef(group->seq);
    Py_SETREF(group->seq, nextseq);
    c->started = started;
    c->entry = entry;
    if (entry) {
        pyc_slot_put(entry, b->off[BOOK_ID], id);
        pyc_slot_put(entry, b->off[BOOK_SEQ], Py_NewRef(c->seq));
        for (int j = 0; j < BOOK_STATIC; j++)
            pyc_slot_put(entry, b->off[BOOK_FIRST_STATIC + j], Py_XNewRef(fields[j]));
        pyc_slot_put(entry, b->off[BOOK_STATE], Py_NewRef(b->running));
        pyc_slot_put(entry, b->off[BOOK_ISSUED], Py_NewRef(started));
        pyc_slot_put(entry, b->off[BOOK_STARTED], Py_NewRef(started));
        pyc_slot_put(entry, b->off[BOOK_ENDED], Py_NewRef(b->zero));
        pyc_slot_put(entry, b->off[BOOK_ERROR], Py_NewRef(b->empty_str));
        pyc_slot_put(entry, b->off[BOOK_CULPRITS], Py_NewRef(b->empty_tuple));
    }
    return 1;
}

void pyc_booked_release(pyc_booked *c)
{
    Py_CLEAR(c->seq);
    Py_CLEAR(c->entry);
    Py_CLEAR(c->started);
}

void pyc_book_done(pyc_book *b, pyc_booked *c)
{
    if (c->entry) {
        PyObject *ended = PyFloat_FromDouble((double)now_ns() * 1e-9);
        pyc_slot_put(c->entry, b->off[BOOK_STATE], Py_NewRef(b->completed));
        pyc_slot_put(c->entry, b->off[BOOK_ENDED], ended ? ended : Py_NewRef(c->started));
        PyErr_Clear();
    }
    pyc_booked_release(c);
    pyc_book_unlock(b);
}

int pyc_book_hand(pyc_book *b, pyc_booked *c)
{
    PyObject *owner = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (owner) {
        Py_XSETREF(b->engine->running, Py_NewRef(Py_True));
        Py_XSETREF(b->engine->owner, owner);
    }
    pyc_book_unlock(b);
    if (!owner) {
        pyc_booked_release(c);
        return -1;
    }
    return 0;
}
