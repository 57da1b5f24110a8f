/* pycollective._native: the compiled core of the shared-memory arena.
 *
 * It works on the arena shm/arena.py lays out (same control words, same meaning), so a
 * rank running these functions and a rank running the Python arena take part in the same
 * calls alike: a phase is "store my EPOCH counter (release), wake peers whose SLEEPING
 * flag is set; wait until every peer's counter is as high", waits go pause-spin ->
 * sched_yield -> futex on the low 32 bits of the peer's counter, and the collectives take
 * the same buffers, phases and share boundaries as shm/collectives.py.
 *
 * A collective runs as a resumable state machine: Arena.run() starts it and returns
 *   DONE     finished;
 *   PENDING  a wait outlived the caller's budget (about a millisecond): the caller checks
 *            deadline, dead peers and abort notices in Python, then calls resume();
 *   CHECK    after the call's first wait, peer `peer`'s announcement differs from ours:
 *            the caller judges it (MismatchError or not), then resume();
 *   VIEWS    every rank may hold its buffer in shared memory: the caller hands over the
 *            peers' buffers (set_views) or None, then resume().
 * The GIL is released while waiting and around large copies and reductions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "kernels.h"
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* Control block words (int64), as in shm/arena.py. */
enum {
    WORDS = 16, EPOCH = 0, SLEEPING = 1, PID = 2, SEQ = 3, KIND = 4, ANN_WORDS = 6,
    BUF_FD = 10, BUF_WORDS = 4
};
enum { ST_DONE = 0, ST_PENDING = 1, ST_CHECK = 2, ST_VIEWS = 3 };
enum { C_ALL_REDUCE = 0, C_REDUCE, C_BROADCAST, C_ALL_GATHER, C_REDUCE_SCATTER, C_BARRIER,
       C_COUNT };
#define MAX_RANKS 256
#define ALIGN_BYTES 64              /* shares start on cache-line boundaries */
#define SLEEP_NS 10000000LL         /* longest single futex sleep */
#define NOGIL_BYTES (64 << 10)      /* copies and reductions above this run without the GIL */

static const pyc_kernel_set *kset = &pyc_kernels_generic;

/* ------------------------------------------------------------------ small helpers */

static inline int64_t ld(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static inline int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(int64_t *word, uint32_t expected, int64_t timeout_ns)
{
#if defined(__linux__) && defined(SYS_futex)
    struct timespec ts = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
#else
    (void)word; (void)expected;
    struct timespec ts = {0, timeout_ns < 200000 ? (long)timeout_ns : 200000L};
    nanosleep(&ts, NULL);
#endif
}

static void futex_wake(int64_t *word)
{
#if defined(__linux__) && defined(SYS_futex)
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

/* ------------------------------------------------------------------ Plan */

/* What a call needs besides its buffers and sequence number, built once per signature. */
typedef struct {
    PyObject_HEAD
    int coll, dtype, op, root; /* root: group rank, -1 for none */
    int64_t avg;               /* > 1: fuse AVG's division by it */
    int64_t ann[ANN_WORDS];    /* kind, dtype, count, root, op, algo as announced */
    size_t itemsize;
    pyc_kernel kernel;         /* NULL for collectives that do not reduce */
} PlanObject;

static PyTypeObject PlanType;

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"collective", "dtype", "op", "root", "avg", "header", NULL};
    PyObject *header;
    long long avg = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiiiLO", kwlist, &self->coll, &self->dtype,
                                     &self->op, &self->root, &avg, &header))
        return -1;
    if (self->coll < 0 || self->coll >= C_COUNT) {
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

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.Plan",
    .tp_doc = "Plan(collective, dtype, op, root, avg, header): one call signature, prepared.",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
};

/* ------------------------------------------------------------------ Arena */

typedef struct {
    int pc;          /* where the state machine resumes; 0: at the start */
    int direct;      /* all_reduce/reduce: reducing straight from the peers' buffers */
    PlanObject plan; /* copied fields only (its PyObject header unused) */
    int64_t seq;
    char *in, *out;
    int64_t n;       /* elements: the data, or one rank's block (all_gather, reduce_scatter) */
    /* the wait in progress */
    int64_t target;
    int reached, wpeer, wstarted;
    int64_t wt0;
    int check_next;  /* next peer whose announcement to check after the first wait */
    int check_peer;
    /* loop state */
    int64_t per, k, s, base, b;
    int waited, writes, shared, have_views;
    char *views[MAX_RANKS];
} call_t;

typedef struct {
    PyObject_HEAD
    Py_buffer mem;   /* the mapped segment: held, so it cannot be unmapped under us */
    int64_t *ctrl;
    char *data;
    int size, rank, npeers, nbuf;
    int peers[MAX_RANKS];
    int64_t slot_bytes, small_bytes, chunk_bytes;
    int64_t nt_bytes; /* calls at least this large copy into the caller's buffer non-temporally */
    int pure_spins, oversubscribed;
    int64_t spin_ns, yield_ns; /* spin (pause), then yield, for so long before sleeping */
    int next_buf;
    int64_t wait_ns; /* time spent waiting for peers (the timeline's WAIT) */
    PyThreadState *ts; /* non-NULL while this call runs without the GIL */
    PyObject *keep[3]; /* the call's input, output and views, alive until it ends */
    int64_t pw_target, pw_t0; /* a wait() from Python in progress */
    int pw_started;
    call_t c;
} ArenaObject;

static PyTypeObject ArenaType;

static inline int64_t *word(ArenaObject *a, int q, int w) { return a->ctrl + (size_t)q * WORDS + w; }

static inline char *slot(ArenaObject *a, int64_t buf, int q)
{
    return a->data + ((size_t)(buf % a->nbuf) * a->size + q) * (size_t)a->slot_bytes;
}

static inline char *region(ArenaObject *a, int64_t buf)
{
    return a->data + (size_t)(buf % a->nbuf) * a->size * (size_t)a->slot_bytes;
}

static inline int64_t take(ArenaObject *a, int64_t n)
{
    int64_t b = a->next_buf;
    a->next_buf = (int)((b + n) % a->nbuf);
    return b;
}

static inline void nogil(ArenaObject *a)
{
    if (!a->ts)
        a->ts = PyEval_SaveThread();
}

static int64_t bump(ArenaObject *a)
{
    int64_t *e = word(a, a->rank, EPOCH);
    int64_t v = *e + 1; /* only this rank writes its counter */
    st(e, v);
    /* The store must be visible before we read the peers' SLEEPING flags (a sleeper sets
     * its flag, then reads our counter): a full fence on both sides loses no wake-up. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int i = 0; i < a->npeers; i++) {
        if (ld(word(a, a->peers[i], SLEEPING))) {
            futex_wake(e);
            break;
        }
    }
    return v;
}

/* Wait until every peer's counter reaches c->target; ST_PENDING if `end` comes first. */
static int wait_all(ArenaObject *a, call_t *c, int64_t end)
{
    const int64_t target = c->target;
    for (; c->wpeer < a->npeers; c->wpeer++, c->wstarted = 0) {
        int64_t *w = word(a, a->peers[c->wpeer], EPOCH);
        if (ld(w) >= target)
            continue;
        if (!c->wstarted) {
            int i = 0;
            while (i < a->pure_spins && ld(w) < target) {
                cpu_relax();
                i++;
            }
            if (i < a->pure_spins)
                continue;
            c->wstarted = 1;
            c->wt0 = now_ns();
        }
        nogil(a);
        int64_t seg = now_ns();
        int64_t *sleeping = word(a, a->rank, SLEEPING);
        for (;;) {
            if (ld(w) >= target)
                break;
            int64_t t = now_ns();
            if (t >= end) {
                a->wait_ns += t - seg;
                return ST_PENDING;
            }
            if (t < c->wt0 + a->spin_ns) {
                /* Keep the core: a rank with a core of its own that yields hands it to
                 * whatever else runs there, for a time slice (ms) per phase. */
                for (int k = 0; k < 64; k++)
                    cpu_relax();
                continue;
            }
            if (t < c->wt0 + a->spin_ns + a->yield_ns) {
                sched_yield();
                continue;
            }
            st(sleeping, 1);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            int64_t v = ld(w);
            if (v < target) {
                int64_t left = end - t;
                futex_wait(w, (uint32_t)v, left < SLEEP_NS ? left : SLEEP_NS);
            }
            st(sleeping, 0);
        }
        a->wait_ns += now_ns() - seg;
    }
    return 0;
}

/* Whether peer q's announcement is consistent with our call (shm/local.py _check_peer's
 * rules; anything else goes back to Python, which decides and words the error). */
static int ann_ok(ArenaObject *a, call_t *c, int q)
{
    int64_t *b = word(a, q, 0);
    int64_t s1, s2, f[ANN_WORDS];
    do {
        s1 = ld(&b[SEQ]);
        for (int i = 0; i < ANN_WORDS; i++)
            f[i] = ld(&b[KIND + i]);
        s2 = ld(&b[SEQ]);
    } while (s1 != s2);
    int arrived = ld(&b[EPOCH]) >= c->target; /* read after the announcement */
    if (s1 == 0)
        return 1;
    int64_t theirs = s1 - 1;
    if (theirs == c->seq && memcmp(f, c->plan.ann, sizeof f) == 0)
        return 1;
    if (arrived && theirs != c->seq)
        return 1; /* it checked ours and moved on */
    if (!arrived && theirs < c->seq)
        return 1; /* not there yet */
    return 0;
}

static int phase_wait(ArenaObject *a, call_t *c, int64_t end)
{
    if (!c->reached) {
        int rc = wait_all(a, c, end);
        if (rc)
            return rc;
        c->reached = 1;
    }
    while (c->check_next < a->size) {
        int q = c->check_next++;
        if (q != a->rank && !ann_ok(a, c, q)) {
            c->check_peer = q;
            return ST_CHECK;
        }
    }
    return 0;
}

/* Resumable waits and yields inside a state machine's switch (c->pc). */
#define WAIT_FOR(T)                                                                        \
    do {                                                                                   \
        c->target = (T);                                                                   \
        c->reached = 0;                                                                    \
        c->wpeer = 0;                                                                      \
        c->wstarted = 0;                                                                   \
        c->pc = __LINE__;                                                                  \
    case __LINE__:;                                                                        \
        int rc_ = phase_wait(a, c, end);                                                   \
        if (rc_)                                                                           \
            return rc_;                                                                    \
    } while (0)

#define YIELD(STATUS)                                                                      \
    do {                                                                                   \
        c->pc = __LINE__;                                                                  \
        return (STATUS);                                                                   \
    case __LINE__:;                                                                        \
    } while (0)

static inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* Boundary q (0..p) of p contiguous shares of m elements, on cache-line boundaries. */
static inline int64_t cut(int64_t m, int p, int q, size_t itemsize)
{
    if (q >= p)
        return m;
    int64_t align = ALIGN_BYTES / (int64_t)itemsize;
    if (align < 1)
        align = 1;
    return min64(m, (m * q / p) / align * align);
}

static inline void copy(ArenaObject *a, void *dst, const void *src, size_t bytes)
{
    if (bytes >= NOGIL_BYTES)
        nogil(a);
    if (dst != src)
        memmove(dst, src, bytes);
}

/* A copy into the caller's buffer of a call too large to stay in cache: non-temporal
 * stores skip reading the destination's lines in first (measured about twice memcpy's
 * speed from DRAM to DRAM here; slower when the data would have stayed in cache, hence
 * the threshold). Slots are written normally: a peer reads them next, from cache. */
static void copy_out(ArenaObject *a, call_t *c, void *dst, const void *src, size_t bytes)
{
#if defined(__x86_64__)
    if ((size_t)c->n * c->plan.itemsize >= (size_t)a->nt_bytes && bytes >= 4096 && dst != src) {
        nogil(a);
        char *d = dst;
        const char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head, s += head, bytes -= head;
        size_t i = 0;
        for (; i + 64 <= bytes; i += 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), x0);
            _mm_stream_si128((__m128i *)(d + i + 16), x1);
            _mm_stream_si128((__m128i *)(d + i + 32), x2);
            _mm_stream_si128((__m128i *)(d + i + 48), x3);
        }
        _mm_sfence();
        memcpy(d + i, s + i, bytes - i);
        return;
    }
#endif
    copy(a, dst, src, bytes);
}

static inline void reduce_into(ArenaObject *a, call_t *c, void *out, const void *const *srcs,
                               int64_t n)
{
    if ((size_t)n * c->plan.itemsize >= NOGIL_BYTES)
        nogil(a);
    c->plan.kernel(out, srcs, a->size, (size_t)n, c->plan.avg);
}

/* ---- all_reduce and reduce: the software pipeline of shm/collectives.py _reduce ---- */

static void rd_copy_in(ArenaObject *a, call_t *c, int64_t s, int64_t buf)
{
    const size_t isz = c->plan.itemsize;
    char *chunk = c->out + (size_t)(s * c->per) * isz;
    int64_t m = min64(c->per, c->n - s * c->per);
    int64_t lo = cut(m, a->size, a->rank, isz), hi = cut(m, a->size, a->rank + 1, isz);
    char *mine = slot(a, buf, a->rank);
    copy(a, mine, chunk, (size_t)lo * isz); /* the others' shares; mine is reduced from `chunk` */
    copy(a, mine + hi * isz, chunk + hi * isz, (size_t)(m - hi) * isz);
}

static void rd_reduce_share(ArenaObject *a, call_t *c, int64_t s, int64_t buf)
{
    const size_t isz = c->plan.itemsize;
    const int p = a->size, r = a->rank;
    char *chunk = c->out + (size_t)(s * c->per) * isz;
    int64_t m = min64(c->per, c->n - s * c->per);
    int64_t lo = cut(m, p, r, isz), hi = cut(m, p, r + 1, isz);
    if (hi <= lo)
        return;
    const void *srcs[MAX_RANKS];
    for (int q = 0; q < p; q++)
        srcs[q] = q == r ? chunk + lo * isz : slot(a, buf, q) + lo * isz;
    char *mine = slot(a, buf, r) + lo * isz;
    reduce_into(a, c, mine, srcs, hi - lo);
    if (c->writes)
        copy_out(a, c, chunk + lo * isz, mine, (size_t)(hi - lo) * isz);
}

static void rd_copy_out(ArenaObject *a, call_t *c, int64_t s, int64_t buf)
{
    const size_t isz = c->plan.itemsize;
    char *chunk = c->out + (size_t)(s * c->per) * isz;
    int64_t m = min64(c->per, c->n - s * c->per);
    for (int q = 0; q < a->size; q++) {
        if (q == a->rank)
            continue;
        int64_t lo = cut(m, a->size, q, isz), hi = cut(m, a->size, q + 1, isz);
        if (hi > lo)
            copy_out(a, c, chunk + lo * isz, slot(a, buf, q) + lo * isz, (size_t)(hi - lo) * isz);
    }
}

/* Straight from every rank's shared buffer (shm/collectives.py _direct). */
static int run_direct(ArenaObject *a, call_t *c, int64_t end)
{
    const size_t isz = c->plan.itemsize;
    const int p = a->size, r = a->rank;
    switch (c->pc) {
    case 0:
        nogil(a);
        for (c->s = 0; c->s <= c->k; c->s++) {
            if (c->s < c->k) {
                int64_t lo0 = c->s * c->per, m = min64(c->per, c->n - lo0);
                int64_t lo = lo0 + cut(m, p, r, isz), hi = lo0 + cut(m, p, r + 1, isz);
                if (hi > lo) {
                    const void *srcs[MAX_RANKS];
                    for (int q = 0; q < p; q++)
                        srcs[q] = c->views[q] + lo * isz;
                    char *dst = c->views[c->plan.root < 0 ? r : c->plan.root];
                    reduce_into(a, c, dst + lo * isz, srcs, hi - lo);
                }
            }
            if (c->s >= 1) {
                WAIT_FOR(c->target);
                if (c->plan.root < 0) { /* the others' reduced shares of the previous chunk */
                    int64_t lo0 = (c->s - 1) * c->per, m = min64(c->per, c->n - lo0);
                    for (int q = 0; q < p; q++) {
                        int64_t lo = lo0 + cut(m, p, q, isz), hi = lo0 + cut(m, p, q + 1, isz);
                        if (q != r && hi > lo)
                            copy_out(a, c, c->views[r] + lo * isz, c->views[q] + lo * isz,
                                     (size_t)(hi - lo) * isz);
                    }
                }
            }
            c->target = bump(a);
        }
        /* nobody returns (and lets its buffer change) while a peer still reads it */
        WAIT_FOR(c->target);
    }
    return ST_DONE;
}

static int run_reduce(ArenaObject *a, call_t *c, int64_t end)
{
    const int p = a->size, r = a->rank;
    const size_t isz = c->plan.itemsize;
    if (c->direct)
        return run_direct(a, c, end);
    switch (c->pc) {
    case 0:
        if (p == 1)
            break;
        if ((int64_t)((size_t)c->n * isz) <= min64(a->small_bytes, a->slot_bytes)) {
            c->b = take(a, 1);
            memcpy(slot(a, c->b, r), c->out, (size_t)c->n * isz);
            WAIT_FOR(bump(a));
            if (c->plan.root < 0 || c->plan.root == r) {
                const void *srcs[MAX_RANKS];
                for (int q = 0; q < p; q++)
                    srcs[q] = slot(a, c->b, q);
                reduce_into(a, c, c->out, srcs, c->n);
            }
            break;
        }
        nogil(a);
        c->per = min64(a->slot_bytes, a->chunk_bytes) / (int64_t)isz;
        if (c->per < 1)
            c->per = 1;
        c->k = (c->n + c->per - 1) / c->per;
        c->writes = c->plan.root < 0 || c->plan.root == r;
        c->base = take(a, 1);
        rd_copy_in(a, c, 0, c->base);
        c->target = bump(a);
        c->waited = 0;
        if (c->shared) {
            /* every rank has announced its buffer: all see the same answer */
            WAIT_FOR(c->target);
            c->waited = 1;
            YIELD(ST_VIEWS);
            if (c->have_views) {
                c->direct = 1;
                c->pc = 0;
                return run_direct(a, c, end);
            }
        }
        if (c->k > 1)
            take(a, c->k - 1); /* buffers base+1 .. base+k-1, consecutive with base */
        for (c->s = 1; c->s < c->k + 2; c->s++) {
            if (c->s < c->k)
                rd_copy_in(a, c, c->s, c->base + c->s);
            if (!c->waited)
                WAIT_FOR(c->target);
            c->waited = 0;
            if (c->s <= c->k)
                rd_reduce_share(a, c, c->s - 1, c->base + c->s - 1);
            if (c->s >= 2 && c->writes)
                rd_copy_out(a, c, c->s - 2, c->base + c->s - 2);
            if (c->s <= c->k)
                c->target = bump(a);
        }
    }
    return ST_DONE;
}

/* ---- broadcast, all_gather, reduce_scatter: one phase per chunk (_pipeline) ---- */

static void pl_put(ArenaObject *a, call_t *c, int64_t s, int64_t buf)
{
    const size_t isz = c->plan.itemsize;
    const int p = a->size, r = a->rank;
    int64_t lo = s * c->per, m = min64(c->per, c->n - lo);
    switch (c->plan.coll) {
    case C_BROADCAST:
        if (r == c->plan.root)
            copy(a, region(a, buf), c->out + lo * isz, (size_t)m * isz);
        break;
    case C_ALL_GATHER:
        copy(a, slot(a, buf, r), c->in + lo * isz, (size_t)m * isz);
        /* my own block of the output, chunk by chunk while the input is in cache (and
         * while the peers catch up), instead of all of it before the first phase */
        copy_out(a, c, c->out + (size_t)(r * c->n + lo) * isz, c->in + lo * isz, (size_t)m * isz);
        break;
    case C_REDUCE_SCATTER: {
        char *mine = slot(a, buf, r);
        for (int q = 0; q < p; q++)
            if (q != r)
                copy(a, mine + (size_t)(q * m) * isz, c->in + (size_t)(q * c->n + lo) * isz,
                     (size_t)m * isz);
        break;
    }
    }
}

static void pl_get(ArenaObject *a, call_t *c, int64_t s, int64_t buf)
{
    const size_t isz = c->plan.itemsize;
    const int p = a->size, r = a->rank;
    int64_t lo = s * c->per, m = min64(c->per, c->n - lo);
    switch (c->plan.coll) {
    case C_BROADCAST:
        if (r != c->plan.root)
            copy_out(a, c, c->out + lo * isz, region(a, buf), (size_t)m * isz);
        break;
    case C_ALL_GATHER:
        for (int q = 0; q < p; q++)
            if (q != r)
                copy_out(a, c, c->out + (size_t)(q * c->n + lo) * isz, slot(a, buf, q),
                         (size_t)m * isz);
        break;
    case C_REDUCE_SCATTER: {
        const void *srcs[MAX_RANKS];
        for (int q = 0; q < p; q++)
            srcs[q] = q == r ? c->in + (size_t)(r * c->n + lo) * isz
                             : slot(a, buf, q) + (size_t)(r * m) * isz;
        reduce_into(a, c, c->out + lo * isz, srcs, m);
        break;
    }
    }
}

static int run_pipeline(ArenaObject *a, call_t *c, int64_t end)
{
    const int p = a->size, r = a->rank;
    const size_t isz = c->plan.itemsize;
    switch (c->pc) {
    case 0:
        switch (c->plan.coll) {
        case C_BROADCAST:
            c->per = p * a->slot_bytes / (int64_t)isz;
            break;
        case C_ALL_GATHER:
            c->per = a->slot_bytes / (int64_t)isz;
            break;
        case C_REDUCE_SCATTER:
            c->per = a->slot_bytes / (int64_t)isz / p;
            if (c->per < 1)
                c->per = 1;
            if (p == 1) {
                copy(a, c->out, c->in, (size_t)c->n * isz);
                return ST_DONE;
            }
            break;
        }
        c->k = c->n > 0 ? (c->n + c->per - 1) / c->per : 1; /* an empty call: one phase */
        c->base = take(a, c->k);
        for (c->s = 0; c->s <= c->k; c->s++) {
            if (c->s < c->k)
                pl_put(a, c, c->s, c->base + c->s);
            if (c->s >= 1) {
                WAIT_FOR(c->target);
                pl_get(a, c, c->s - 1, c->base + c->s - 1);
            }
            if (c->s < c->k)
                c->target = bump(a);
        }
    }
    return ST_DONE;
}

static int run_barrier(ArenaObject *a, call_t *c, int64_t end)
{
    switch (c->pc) {
    case 0:
        WAIT_FOR(bump(a));
    }
    return ST_DONE;
}

/* Runs the current call until it ends or needs the caller; restores the GIL. */
static int step_rc(ArenaObject *a, int64_t budget_ns)
{
    call_t *c = &a->c;
    int64_t end = now_ns() + (budget_ns > 0 ? budget_ns : 0);
    int rc;
    a->ts = NULL;
    switch (c->plan.coll) {
    case C_ALL_REDUCE:
    case C_REDUCE:
        rc = run_reduce(a, c, end);
        break;
    case C_BARRIER:
        rc = run_barrier(a, c, end);
        break;
    default:
        rc = run_pipeline(a, c, end);
    }
    if (a->ts) {
        PyEval_RestoreThread(a->ts);
        a->ts = NULL;
    }
    if (rc == ST_DONE) {
        c->pc = -1; /* nothing to resume */
        for (int i = 0; i < 3; i++)
            Py_CLEAR(a->keep[i]);
    }
    return rc;
}

static PyObject *step(ArenaObject *a, int64_t budget_ns)
{
    return PyLong_FromLong(step_rc(a, budget_ns));
}

/* Announce a call (a seqlock: SEQ is 0 while the words change) and set it up to run;
 * `inobj` and `outobj` (either may be NULL) are kept alive until it ends. */
static void start_call(ArenaObject *a, const PlanObject *plan, char *in, char *out, int64_t n,
                       int64_t seq, const int64_t *shared, PyObject *inobj, PyObject *outobj)
{
    call_t *c = &a->c;
    int64_t *blk = word(a, a->rank, 0);
    st(&blk[SEQ], 0);
    for (int i = 0; i < BUF_WORDS; i++)
        st(&blk[BUF_FD + i], shared[i]);
    for (int i = 0; i < ANN_WORDS; i++)
        st(&blk[KIND + i], plan->ann[i]);
    st(&blk[SEQ], seq + 1);

    for (int i = 0; i < 3; i++)
        Py_CLEAR(a->keep[i]);
    if (inobj) {
        Py_INCREF(inobj);
        a->keep[0] = inobj;
    }
    if (outobj) {
        Py_INCREF(outobj);
        a->keep[1] = outobj;
    }
    c->pc = 0;
    c->direct = 0;
    memcpy(&c->plan, plan, sizeof *plan);
    c->seq = seq;
    c->in = in;
    c->out = out;
    c->n = n;
    c->check_next = 0;
    c->shared = shared[0] != 0 && (plan->coll == C_ALL_REDUCE || plan->coll == C_REDUCE);
    c->have_views = 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous%s buffer", what,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
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
        if (get_buffer(args[2], &vout, writes, coll >= C_ALL_GATHER ? "output" : "data") < 0)
            return NULL;
        out = vout.buf;
        Py_ssize_t outlen = vout.len;
        PyBuffer_Release(&vout);
        if (coll == C_ALL_GATHER || coll == C_REDUCE_SCATTER) {
            if (get_buffer(args[1], &vin, 0, "input") < 0)
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
    start_call(a, plan, in, out, n, seq, shared, in ? args[1] : NULL, out ? args[2] : NULL);
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
        if (get_buffer(PySequence_Fast_GET_ITEM(seq, q), &v, 1, "views[q]") < 0) {
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
    return PyLong_FromLongLong(bump(a));
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
    int rc = wait_all(a, &w, now_ns() + budget);
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
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError,
                        "set_spin(pure_spins, yield_ns, oversubscribed, spin_ns=0)");
        return NULL;
    }
    long spins = PyLong_AsLong(args[0]);
    int64_t yield_ns = PyLong_AsLongLong(args[1]);
    int over = PyObject_IsTrue(args[2]);
    int64_t spin_ns = nargs == 4 ? PyLong_AsLongLong(args[3]) : 0;
    if (PyErr_Occurred())
        return NULL;
    a->pure_spins = (int)(spins < 0 ? 0 : spins);
    a->yield_ns = yield_ns < 0 ? 0 : yield_ns;
    a->spin_ns = spin_ns < 0 ? 0 : spin_ns;
    a->oversubscribed = over;
    Py_RETURN_NONE;
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
    a->pure_spins = 256;
    a->yield_ns = 1000000;
    a->next_buf = 0;
    a->c.pc = -1;
    return 0;
}

static void Arena_dealloc(ArenaObject *a)
{
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
     "set_spin(pure_spins, yield_ns, oversubscribed, spin_ns=0)"},
    {"release", (PyCFunction)Arena_release, METH_NOARGS, "let go of the segment's memory"},
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
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ArenaType = {
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

/* ------------------------------------------------------------------ Fast: repeated calls
 *
 * A group's compiled per-call path (core/group.py `fast`, runners/native.py). The first
 * call of a signature runs the whole Python path (every check, the runner's plan); if it
 * succeeds, the group registers the signature here (`add`): the buffer's type, format and
 * length, the op or root object as the caller passed it (held, compared by identity), the
 * compiled Plan and the flight-recorder fields of the call. A later call with the same
 * signature then goes from the API function straight to `call`, which does what
 * ProcessGroup.run_collective does, in C: the group is usable and the transport was
 * checked less than a millisecond ago (else it returns False and the caller runs the
 * Python path, which checks it), the engine is idle (its lock is held for the call, so no
 * other thread can start one), the sequence number, the flight-recorder entry (written
 * into the ring's preallocated Entry, field by field at the offsets of its __slots__),
 * the announcement and the compiled collective. A call that is done returns True. One that
 * needs Python (a wait past the budget, a peer's differing announcement) is handed to
 * `finish(prepared, seq, entry, status, started)`: the engine is marked running by this
 * thread and unlocked first, and `finish` resumes the call with the Python runner's polls
 * and checks and raises exactly as the Python path would. Anything the fast path does
 * not know returns False before it touches anything. */

static const char *const entry_fields[] = {
    "id", "seq", "state", "t_issued", "t_started", "t_ended", "error", "culprits",
    /* the signature's own, the same in every call of it: */
    "group", "group_name", "kind", "count", "dtype", "algorithm", "op", "root", "detail",
};
enum { E_ID, E_SEQ, E_STATE, E_ISSUED, E_STARTED, E_ENDED, E_ERROR, E_CULPRITS, E_STATIC,
       E_COUNT = (int)(sizeof entry_fields / sizeof *entry_fields) };
#define E_NSTATIC (E_COUNT - E_STATIC)
#define FAST_SIGS 16
#define FORMAT_CHARS 8

typedef struct {
    PyObject *type;     /* the buffer's type (NULL: a free slot) */
    PyObject *key;      /* op (all_reduce), src (broadcast) as passed; Py_None for barrier */
    PyObject *plan;     /* PlanObject */
    PyObject *prepared; /* handed back to `finish` */
    PyObject *fields[E_NSTATIC];
    Py_ssize_t len;
    int writes;
    char format[FORMAT_CHARS];
} fast_sig;

typedef struct {
    PyObject_HEAD
    ArenaObject *arena;
    PyObject *group, *world, *engine, *acquire, *release, *recorder, *ring, *finish;
    PyObject *entry_type, *running, *completed, *empty_str, *empty_tuple, *zero;
    Py_ssize_t capacity;
    Py_ssize_t off[E_COUNT];
    int64_t recheck_ns, budget_ns;
    int64_t calls;  /* calls this path ran (tests, benchmarks) */
    int64_t handed; /* of which handed to `finish` */
    int nsig, evict;
    fast_sig sig[C_COUNT][FAST_SIGS];
    int count[C_COUNT];
} FastObject;

static PyTypeObject FastType;
static PyObject *s_seq, *s_failed, *s_polled, *s_checked_at, *s_closed, *s_queue, *s_running,
    *s_stopped, *s_p2p, *s_owner, *s_next, *s_lock, *s_ring, *s_capacity, *s_world,
    *s_acquire, *s_release;

static void sig_clear(fast_sig *g)
{
    Py_CLEAR(g->type);
    Py_CLEAR(g->key);
    Py_CLEAR(g->plan);
    Py_CLEAR(g->prepared);
    for (int i = 0; i < E_NSTATIC; i++)
        Py_CLEAR(g->fields[i]);
}

static int Fast_traverse(FastObject *f, visitproc visit, void *arg)
{
    Py_VISIT(f->arena);
    Py_VISIT(f->group);
    Py_VISIT(f->world);
    Py_VISIT(f->engine);
    Py_VISIT(f->acquire);
    Py_VISIT(f->release);
    Py_VISIT(f->recorder);
    Py_VISIT(f->ring);
    Py_VISIT(f->finish);
    Py_VISIT(f->entry_type);
    for (int k = 0; k < C_COUNT; k++)
        for (int i = 0; i < f->count[k]; i++) {
            fast_sig *g = &f->sig[k][i];
            Py_VISIT(g->type);
            Py_VISIT(g->key);
            Py_VISIT(g->plan);
            Py_VISIT(g->prepared);
            for (int j = 0; j < E_NSTATIC; j++)
                Py_VISIT(g->fields[j]);
        }
    return 0;
}

static int Fast_clear(FastObject *f)
{
    Py_CLEAR(f->arena);
    Py_CLEAR(f->group);
    Py_CLEAR(f->world);
    Py_CLEAR(f->engine);
    Py_CLEAR(f->acquire);
    Py_CLEAR(f->release);
    Py_CLEAR(f->recorder);
    Py_CLEAR(f->ring);
    Py_CLEAR(f->finish);
    Py_CLEAR(f->entry_type);
    Py_CLEAR(f->running);
    Py_CLEAR(f->completed);
    Py_CLEAR(f->empty_str);
    Py_CLEAR(f->empty_tuple);
    Py_CLEAR(f->zero);
    for (int k = 0; k < C_COUNT; k++) {
        for (int i = 0; i < f->count[k]; i++)
            sig_clear(&f->sig[k][i]);
        f->count[k] = 0;
    }
    f->capacity = 0;
    return 0;
}

static void Fast_dealloc(FastObject *f)
{
    PyObject_GC_UnTrack(f);
    Fast_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* Fast(arena, group, engine, recorder, entry_type, finish, running, completed,
 *      recheck_ns, budget_ns) */
static int Fast_init(FastObject *f, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"arena", "group", "engine", "recorder", "entry_type", "finish",
                             "running", "completed", "recheck_ns", "budget_ns", NULL};
    PyObject *arena, *group, *engine, *recorder, *entry_type, *finish, *running, *completed;
    long long recheck_ns, budget_ns;
    if (f->arena) {
        PyErr_SetString(PyExc_RuntimeError, "Fast is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OUULL", kwlist, &ArenaType, &arena,
                                     &group, &engine, &recorder, &PyType_Type, &entry_type,
                                     &finish, &running, &completed, &recheck_ns, &budget_ns))
        return -1;
    f->recheck_ns = recheck_ns;
    f->budget_ns = budget_ns;
    f->arena = (ArenaObject *)Py_NewRef(arena);
    f->group = Py_NewRef(group);
    f->engine = Py_NewRef(engine);
    f->finish = Py_NewRef(finish);
    f->entry_type = Py_NewRef(entry_type);
    f->running = Py_NewRef(running);
    f->completed = Py_NewRef(completed);
    f->empty_str = PyUnicode_FromString("");
    f->empty_tuple = PyTuple_New(0);
    f->zero = PyFloat_FromDouble(0.0);
    if (!f->empty_str || !f->empty_tuple || !f->zero)
        return -1;
    if (!(f->world = PyObject_GetAttr(group, s_world)))
        return -1;
    PyObject *lock = PyObject_GetAttr(engine, s_lock);
    if (!lock)
        return -1;
    f->acquire = PyObject_GetAttr(lock, s_acquire);
    f->release = PyObject_GetAttr(lock, s_release);
    Py_DECREF(lock);
    if (!f->acquire || !f->release)
        return -1;
    f->capacity = 0;
    if (recorder != Py_None) {
        PyObject *cap = PyObject_GetAttr(recorder, s_capacity);
        if (!cap)
            return -1;
        f->capacity = PyLong_AsSsize_t(cap);
        Py_DECREF(cap);
        if (f->capacity < 0)
            return PyErr_Occurred() ? -1 : 0;
        if (!(f->ring = PyObject_GetAttr(recorder, s_ring)))
            return -1;
        if (!PyList_CheckExact(f->ring) || PyList_GET_SIZE(f->ring) != f->capacity) {
            PyErr_SetString(PyExc_TypeError, "Fast: the recorder's ring must be a list of capacity entries");
            return -1;
        }
        f->recorder = Py_NewRef(recorder);
    }
    /* Where the Entry keeps each field: its __slots__' member descriptors. */
    for (int i = 0; i < E_COUNT; i++) {
        PyObject *d = PyObject_GetAttrString(entry_type, entry_fields[i]);
        if (!d)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok)
            f->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "Fast: %s is not a slot of the entry type",
                         entry_fields[i]);
            return -1;
        }
    }
    return 0;
}

static inline PyObject *slot_get(PyObject *obj, Py_ssize_t off)
{
    return *(PyObject **)((char *)obj + off);
}

/* Set a slot of an entry; steals `v`. */
static inline void slot_put(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject **p = (PyObject **)((char *)obj + off);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
}

static int buffer_of(PyObject *obj, Py_buffer *v)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* add(obj, key, plan, prepared, entry) -> bool: register a signature (obj: the buffer of the
 * call, None for a barrier; entry: its flight-recorder entry, for the fields every call of
 * it shares). */
static PyObject *Fast_add(FastObject *f, PyObject *const *args, Py_ssize_t nargs)
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
    int coll = plan->coll;
    if (coll != C_ALL_REDUCE && coll != C_BROADCAST && coll != C_BARRIER)
        Py_RETURN_FALSE;
    if (f->capacity && !Py_IS_TYPE(entry, (PyTypeObject *)f->entry_type))
        Py_RETURN_FALSE;
    fast_sig g = {0};
    if (coll != C_BARRIER) {
        Py_buffer v;
        if (buffer_of(obj, &v) < 0)
            Py_RETURN_FALSE;
        const char *fmt = v.format ? v.format : "B";
        int ok = strlen(fmt) < FORMAT_CHARS && v.len == plan->ann[2] * (int64_t)plan->itemsize;
        if (ok) {
            strcpy(g.format, fmt);
            g.len = v.len;
        }
        PyBuffer_Release(&v);
        if (!ok)
            Py_RETURN_FALSE;
        g.writes = !(coll == C_BROADCAST && plan->root == f->arena->rank);
    }
    fast_sig *list = f->sig[coll];
    int i = 0;
    while (i < f->count[coll] && !(list[i].type == (PyObject *)Py_TYPE(obj) && list[i].key == key &&
                                   list[i].len == g.len && !strcmp(list[i].format, g.format)))
        i++;
    if (i == FAST_SIGS) { /* full: replace one, round robin */
        i = f->evict;
        f->evict = (f->evict + 1) % FAST_SIGS;
    }
    if (i == f->count[coll])
        f->count[coll]++;
    else
        sig_clear(&list[i]);
    g.type = Py_NewRef((PyObject *)Py_TYPE(obj));
    g.key = Py_NewRef(key);
    g.plan = Py_NewRef((PyObject *)plan);
    g.prepared = Py_NewRef(args[3]);
    for (int j = 0; j < E_NSTATIC; j++)
        g.fields[j] = f->capacity ? Py_XNewRef(slot_get(entry, f->off[E_STATIC + j])) : NULL;
    list[i] = g;
    Py_RETURN_TRUE;
}

/* The attribute `name` of `obj` is `want` (identity); -1 on error (cleared: 0). */
static inline int attr_is(PyObject *obj, PyObject *name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) {
        PyErr_Clear();
        return 0;
    }
    int is = v == want;
    Py_DECREF(v);
    return is;
}

static inline int attr_false(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) {
        PyErr_Clear();
        return 0;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0) {
        PyErr_Clear();
        return 0;
    }
    return !t;
}

static inline void unlock(FastObject *f)
{
    PyObject *r = PyObject_CallNoArgs(f->release);
    if (r)
        Py_DECREF(r);
    else
        PyErr_WriteUnraisable(f->release);
}

static PyObject *fast_call(FastObject *f, int coll, PyObject *obj, PyObject *key)
{
    ArenaObject *a = f->arena;
    if (!a || !a->ctrl || a->c.pc >= 0)
        Py_RETURN_FALSE; /* released, or a call left half done: the Python path knows */
    fast_sig *g = NULL;
    fast_sig *list = f->sig[coll];
    const int nsig = f->count[coll];
    char *buf = NULL;
    PyObject *tp = (PyObject *)Py_TYPE(obj);
    if (coll == C_BARRIER) {
        if (nsig)
            g = &list[0];
    } else {
        int i = 0;
        while (i < nsig && !(list[i].key == key && list[i].type == tp))
            i++;
        if (i == nsig)
            Py_RETURN_FALSE;
        Py_buffer v;
        if (buffer_of(obj, &v) < 0)
            Py_RETURN_FALSE;
        const char *fmt = v.format ? v.format : "B";
        for (; i < nsig; i++) {
            fast_sig *s = &list[i];
            if (s->key == key && s->type == tp && s->len == v.len && !strcmp(s->format, fmt) &&
                !(s->writes && v.readonly)) {
                g = s;
                break;
            }
        }
        buf = v.buf; /* obj is kept alive (keep[1]) while the call runs */
        PyBuffer_Release(&v);
    }
    if (!g)
        Py_RETURN_FALSE;

    /* The group's state, as run_collective checks it. */
    PyObject *group = f->group;
    if (!attr_is(group, s_failed, Py_None) || !attr_is(f->world, s_closed, Py_False) ||
        !attr_is(group, s_polled, Py_True))
        Py_RETURN_FALSE;
    int64_t t0 = now_ns();
    {
        PyObject *v = PyObject_GetAttr(group, s_checked_at);
        if (!v) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        double checked = PyFloat_AsDouble(v);
        Py_DECREF(v);
        if (checked == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        if (!(t0 * 1e-9 - checked < f->recheck_ns * 1e-9))
            Py_RETURN_FALSE; /* time to read the transport for abort notices: Python does */
    }

    /* The engine: idle, and held until the call is done or handed over. */
    PyObject *got = PyObject_CallOneArg(f->acquire, Py_False);
    if (!got) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_DECREF(got);
    if (got != Py_True)
        Py_RETURN_FALSE;
    PyObject *entry = NULL, *seqobj = NULL, *nextseq = NULL, *id = NULL, *nextid = NULL;
    if (!attr_is(f->engine, s_running, Py_False) || !attr_is(f->engine, s_stopped, Py_False) ||
        !attr_false(f->engine, s_queue) || !attr_false(f->engine, s_p2p))
        goto decline;

    /* The sequence number, and the flight recorder's next entry. */
    PyObject *v = PyObject_GetAttr(group, s_seq);
    if (!v)
        goto error;
    long long seq = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (seq == -1 && PyErr_Occurred())
        goto error;
    if (!(seqobj = PyLong_FromLongLong(seq)) || !(nextseq = PyLong_FromLongLong(seq + 1)))
        goto error;
    if (f->capacity) {
        if (!(id = PyObject_GetAttr(f->recorder, s_next)))
            goto error;
        Py_ssize_t i = PyLong_AsSsize_t(id);
        if (i < 0) {
            if (PyErr_Occurred())
                goto error;
            goto decline;
        }
        if (PyList_GET_SIZE(f->ring) != f->capacity)
            goto decline;
        PyObject *e = PyList_GET_ITEM(f->ring, i % f->capacity);
        if (!Py_IS_TYPE(e, (PyTypeObject *)f->entry_type))
            goto decline;
        if (!(nextid = PyLong_FromSsize_t(i + 1)) ||
            PyObject_SetAttr(f->recorder, s_next, nextid) < 0)
            goto error;
        entry = Py_NewRef(e);
    }
    if (PyObject_SetAttr(group, s_seq, nextseq) < 0)
        goto error;
    Py_CLEAR(nextseq);
    Py_CLEAR(nextid);
    PyObject *started = PyFloat_FromDouble(t0 * 1e-9);
    if (!started)
        goto error;
    if (entry) {
        slot_put(entry, f->off[E_ID], id);
        id = NULL;
        slot_put(entry, f->off[E_SEQ], Py_NewRef(seqobj));
        for (int j = 0; j < E_NSTATIC; j++)
            slot_put(entry, f->off[E_STATIC + j], Py_XNewRef(g->fields[j]));
        slot_put(entry, f->off[E_STATE], Py_NewRef(f->running));
        slot_put(entry, f->off[E_ISSUED], Py_NewRef(started));
        slot_put(entry, f->off[E_STARTED], Py_NewRef(started));
        slot_put(entry, f->off[E_ENDED], Py_NewRef(f->zero));
        slot_put(entry, f->off[E_ERROR], Py_NewRef(f->empty_str));
        slot_put(entry, f->off[E_CULPRITS], Py_NewRef(f->empty_tuple));
    }

    /* The call itself. */
    PlanObject *plan = (PlanObject *)g->plan;
    static const int64_t unshared[BUF_WORDS] = {0, 0, 0, 0};
    int64_t n = buf ? (int64_t)(g->len / (Py_ssize_t)plan->itemsize) : 0;
    start_call(a, plan, NULL, buf, n, seq, unshared, NULL, buf ? obj : NULL);
    /* Another thread may change the table while this one waits without the GIL. */
    PyObject *prepared = Py_NewRef(g->prepared);
    g = NULL;
    int rc = step_rc(a, f->budget_ns);
    if (rc == ST_DONE) {
        if (entry) {
            PyObject *ended = PyFloat_FromDouble(now_ns() * 1e-9);
            slot_put(entry, f->off[E_STATE], Py_NewRef(f->completed));
            slot_put(entry, f->off[E_ENDED], ended ? ended : Py_NewRef(started));
            PyErr_Clear();
            Py_DECREF(entry);
        }
        Py_DECREF(started);
        Py_DECREF(seqobj);
        Py_DECREF(prepared);
        f->calls++;
        unlock(f);
        Py_RETURN_TRUE;
    }
    /* It needs Python: the engine runs this thread's job now (Engine.run's state), then
     * `finish` resumes the call, raises as the Python path does, and frees the engine. */
    {
        PyObject *owner = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
        int bad = !owner || PyObject_SetAttr(f->engine, s_running, Py_True) < 0 ||
                  PyObject_SetAttr(f->engine, s_owner, owner) < 0;
        Py_XDECREF(owner);
        unlock(f);
        if (bad) {
            Py_XDECREF(entry);
            Py_DECREF(started);
            Py_DECREF(seqobj);
            Py_DECREF(prepared);
            return NULL;
        }
        f->handed++;
        PyObject *st = PyLong_FromLong(rc);
        PyObject *fargs[5] = {prepared, seqobj, entry ? entry : Py_None, st, started};
        PyObject *res = st ? PyObject_Vectorcall(f->finish, fargs, 5, NULL) : NULL;
        Py_DECREF(prepared);
        Py_XDECREF(st);
        Py_XDECREF(entry);
        Py_DECREF(started);
        Py_DECREF(seqobj);
        if (!res)
            return NULL;
        Py_DECREF(res);
        f->calls++;
        Py_RETURN_TRUE;
    }

decline:
    Py_XDECREF(entry);
    Py_XDECREF(seqobj);
    Py_XDECREF(nextseq);
    Py_XDECREF(id);
    Py_XDECREF(nextid);
    unlock(f);
    Py_RETURN_FALSE;
error:
    Py_XDECREF(entry);
    Py_XDECREF(seqobj);
    Py_XDECREF(nextseq);
    Py_XDECREF(id);
    Py_XDECREF(nextid);
    unlock(f);
    return NULL;
}

/* all_reduce(tensor, op) -> True if done (or raised), False: run the Python path */
static PyObject *Fast_all_reduce(FastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(tensor, op)");
        return NULL;
    }
    return fast_call(f, C_ALL_REDUCE, args[0], args[1]);
}

/* broadcast(tensor, src) */
static PyObject *Fast_broadcast(FastObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "broadcast(tensor, src)");
        return NULL;
    }
    return fast_call(f, C_BROADCAST, args[0], args[1]);
}

static PyObject *Fast_barrier(FastObject *f, PyObject *Py_UNUSED(ignored))
{
    return fast_call(f, C_BARRIER, Py_None, Py_None);
}

static PyObject *Fast_forget(FastObject *f, PyObject *Py_UNUSED(ignored))
{
    for (int k = 0; k < C_COUNT; k++) {
        for (int i = 0; i < f->count[k]; i++)
            sig_clear(&f->sig[k][i]);
        f->count[k] = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *Fast_get_calls(FastObject *f, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(f->calls);
}

static PyObject *Fast_get_handed(FastObject *f, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(f->handed);
}

static PyObject *Fast_get_size(FastObject *f, void *Py_UNUSED(closure))
{
    int n = 0;
    for (int k = 0; k < C_COUNT; k++)
        n += f->count[k];
    return PyLong_FromLong(n);
}

static PyMethodDef Fast_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))Fast_all_reduce, METH_FASTCALL,
     "all_reduce(tensor, op) -> True if it ran the call, False: run the Python path"},
    {"broadcast", (PyCFunction)(void (*)(void))Fast_broadcast, METH_FASTCALL,
     "broadcast(tensor, src) -> True if it ran the call, False: run the Python path"},
    {"barrier", (PyCFunction)Fast_barrier, METH_NOARGS,
     "barrier() -> True if it ran the call, False: run the Python path"},
    {"add", (PyCFunction)(void (*)(void))Fast_add, METH_FASTCALL,
     "add(obj, key, plan, prepared, entry) -> bool: register a call signature"},
    {"forget", (PyCFunction)Fast_forget, METH_NOARGS, "drop every signature"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Fast_getset[] = {
    {"calls", (getter)Fast_get_calls, NULL, "calls this path completed", NULL},
    {"handed", (getter)Fast_get_handed, NULL, "calls it handed to `finish`", NULL},
    {"size", (getter)Fast_get_size, NULL, "signatures registered", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycollective._native.Fast",
    .tp_doc = "Fast(arena, group, engine, recorder, entry_type, finish, running, completed, "
              "recheck_ns, budget_ns): a group's compiled path for repeated calls.",
    .tp_basicsize = sizeof(FastObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fast_init,
    .tp_dealloc = (destructor)Fast_dealloc,
    .tp_traverse = (traverseproc)Fast_traverse,
    .tp_clear = (inquiry)Fast_clear,
    .tp_methods = Fast_methods,
    .tp_getset = Fast_getset,
};

/* ------------------------------------------------------------------ module functions */

/* reduce(op, dtype, out, srcs, avg=0): out = srcs[0] op srcs[1] op ... (the fused kernel) */
static PyObject *mod_reduce(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "reduce(op, dtype, out, srcs, avg=0)");
        return NULL;
    }
    int op = (int)PyLong_AsLong(args[0]), dtype = (int)PyLong_AsLong(args[1]);
    long long avg = nargs == 5 ? PyLong_AsLongLong(args[4]) : 0;
    if (PyErr_Occurred())
        return NULL;
    size_t isz = (size_t)pyc_itemsize(dtype);
    pyc_kernel k = (isz && op >= 0 && op < OP_COUNT) ? kset->table[dtype][op] : NULL;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "op %d is not defined on dtype code %d", op, dtype);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[3], "srcs must be a sequence of buffers");
    if (!seq)
        return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (m < 1 || m > MAX_RANKS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "reduce: 1 to %d inputs, got %zd", MAX_RANKS, m);
        return NULL;
    }
    Py_buffer vout, vs[MAX_RANKS];
    if (get_buffer(args[2], &vout, 1, "out") < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    const void *srcs[MAX_RANKS];
    Py_ssize_t got = 0;
    PyObject *res = NULL;
    for (; got < m; got++) {
        if (get_buffer(PySequence_Fast_GET_ITEM(seq, got), &vs[got], 0, "srcs[i]") < 0)
            goto done;
        if (vs[got].len != vout.len) {
            got++;
            PyErr_SetString(PyExc_ValueError, "reduce: every input must be as long as out");
            goto done;
        }
        srcs[got] = vs[got].buf;
    }
    size_t n = (size_t)vout.len / isz;
    if (vout.len >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        k(vout.buf, srcs, (int)m, n, avg);
        Py_END_ALLOW_THREADS
    } else {
        k(vout.buf, srcs, (int)m, n, avg);
    }
    res = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&vs[i]);
    PyBuffer_Release(&vout);
    Py_DECREF(seq);
    return res;
}

static const pyc_kernel_set *sets[] = {
#if defined(__x86_64__)
    &pyc_kernels_avx512, &pyc_kernels_avx2,
#endif
    &pyc_kernels_generic,
};

static int set_usable(const pyc_kernel_set *s)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (s == &pyc_kernels_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
    if (s == &pyc_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
#endif
    return s == &pyc_kernels_generic;
}

/* kernel_sets() -> names usable on this CPU, best first */
static PyObject *mod_kernel_sets(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < sizeof sets / sizeof *sets; i++) {
        if (!set_usable(sets[i]))
            continue;
        PyObject *name = PyUnicode_FromString(sets[i]->name);
        if (!name || PyList_Append(out, name) < 0)
            Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}

/* use_kernels(name) -> the previous name (tests run every set; Plans keep theirs) */
static PyObject *mod_use_kernels(PyObject *Py_UNUSED(m), PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        if (strcmp(sets[i]->name, name) == 0 && set_usable(sets[i])) {
            const char *old = kset->name;
            kset = sets[i];
            return PyUnicode_FromString(old);
        }
    }
    PyErr_Format(PyExc_ValueError, "no usable kernel set %s", name);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))mod_reduce, METH_FASTCALL,
     "reduce(op, dtype, out, srcs, avg=0): the fused reduction of srcs, in order, into out"},
    {"kernel_sets", mod_kernel_sets, METH_NOARGS, "kernel sets usable here, best first"},
    {"use_kernels", mod_use_kernels, METH_O, "use_kernels(name) -> previous set's name"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pycollective._native",
    "The compiled core of pycollective's shared-memory arena (see shm/native.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        if (set_usable(sets[i])) {
            kset = sets[i];
            break;
        }
    }
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArenaType) < 0 ||
        PyType_Ready(&FastType) < 0)
        return NULL;
    struct { PyObject **name; const char *text; } names[] = {
        {&s_seq, "_seq"}, {&s_failed, "_failed"}, {&s_polled, "_polled"},
        {&s_checked_at, "_checked_at"}, {&s_closed, "closed"}, {&s_queue, "_queue"},
        {&s_running, "_running"}, {&s_stopped, "_stopped"}, {&s_p2p, "_p2p"},
        {&s_owner, "_owner"}, {&s_next, "_next"}, {&s_lock, "_lock"}, {&s_ring, "_ring"},
        {&s_capacity, "capacity"}, {&s_world, "world"}, {&s_acquire, "acquire"},
        {&s_release, "release"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!*names[i].name && !(*names[i].name = PyUnicode_InternFromString(names[i].text)))
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
