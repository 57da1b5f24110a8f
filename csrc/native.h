/* pycollective._native: what every unit of the compiled core shares (as CPython's
 * Modules/_sqlite/module.h): the arena's layout, the codes Python and C exchange, the
 * Plan, Arena and call records, and the small inline helpers of the hot path.
 *
 * The extension works on the arena shm/arena.py lays out (same control words, same
 * meaning), so a rank running these functions and a rank running the Python arena take
 * part in the same calls alike. Python is the definition of every constant here: the
 * module exports them (module.c) and shm/native.py checks them against its own at import.
 *
 * Units (one concern a file, a header each):
 *   plan.c        Plan: one call signature, compiled
 *   wait.c        the phase counters: bump, wait for peers (spin, yield, futex), the
 *                 announcement check
 *   arena.c       the collectives as resumable state machines, started and stepped
 *   arena_type.c  the Arena type: the state machines' Python face
 *   callstate.c   GroupState, EngineState: the state calls' paths share with Python
 *   callbook.c    what every compiled path of repeated calls does around the call: the
 *                 group's and engine's checks, the sequence number, the flight recorder
 *   callpath.c    CallPath: the per-call path of repeated calls (ProcessGroup.fast)
 *   swappath.c    SwapPath: the same over TCP, a small all_reduce of two ranks in one swap
 *   dispatch.c    the kernel set for this CPU, and reduce()
 *   sockio.c      a TCP payload read and reduced as it arrives (the cross-host path)
 *   swapio.c      one round of the repeated small swap over TCP: send, poll, reduce
 *   copy.c        copies that sidestep memcpy's slow case (a destination skewed 1-31 bytes)
 *   module.c      the module: its types, functions and constants
 *   kernels*.c    the fused reductions, once per instruction set
 */
#ifndef PYC_NATIVE_H
#define PYC_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

/* Every value Python also knows is defined in Python; module.c exports these and
 * shm/native.py (the kinds: runners/native.py) refuses an extension that differs. */

/* Control block words (int64): shm/arena.py. */
enum {
    WORDS = 16, EPOCH = 0, SLEEPING = 1, SEQ = 3, KIND = 4, ANN_WORDS = 6, /* KIND..ALGO */
    BUF_FD = 10, BUF_WORDS = 4, /* BUF_FD..BUF_LEN */
    ADDR = 14,  /* the call's buffer in the announcer's address space (single copy), or 0 */
    SC_ERR = 15 /* what stopped this rank's single copy (arena.c single_error_word); 0: nothing */
};
/* Header words (int64, at the segment's start): shm/arena.py. H_CLAIM: the next
 * unclaimed piece of the single-copy call in progress. */
enum { H_CLAIM = 5 };
/* What Arena.run and resume return: shm/native.py. */
enum { ST_DONE = 0, ST_PENDING = 1, ST_CHECK = 2, ST_VIEWS = 3, ST_FAILED = 4 };
/* The collectives C runs, by their codes on the wire (transport/_wire.py KIND_CODE: the
 * one numbering of collectives; codes never change meaning). */
enum { C_ALL_REDUCE = 1, C_BROADCAST = 2, C_REDUCE = 3, C_ALL_GATHER = 4, C_REDUCE_SCATTER = 5,
       C_BARRIER = 9 };
#define MAX_RANKS 256               /* shm/arena.py */
#define ALIGN_BYTES 64              /* shares start on cache-line boundaries: collectives.py */
#define SLEEP_NS 10000000LL         /* longest single futex sleep: arena.py SLEEP_SECONDS */
#define SETTLE_SPINS 4096           /* reads of a changing announcement: arena.py */
#define LOAD_CHECK_NS 5000000LL     /* how old a load reading may get: _load.py CHECK_SECONDS */
#define NOGIL_BYTES (64 << 10)      /* copies and reductions above this run without the GIL */

/* Whether C runs the collective of this wire code. */
static inline int pyc_kind_known(int kind)
{
    return kind == C_ALL_REDUCE || kind == C_BROADCAST || kind == C_REDUCE ||
           kind == C_ALL_GATHER || kind == C_REDUCE_SCATTER || kind == C_BARRIER;
}

/* The kernel set Plans and reduce() take theirs from (dispatch.c). */
extern const pyc_kernel_set *kset;

/* What a call needs besides its buffers and sequence number, built once per signature. */
typedef struct {
    PyObject_HEAD
    int coll, dtype, op, root; /* root: group rank, -1 for none */
    int64_t avg;               /* > 1: fuse AVG's division by it */
    int64_t ann[ANN_WORDS];    /* kind, dtype, count, root, op, algo as announced */
    size_t itemsize;
    pyc_kernel kernel;         /* NULL for collectives that do not reduce */
} PlanObject;

/* The call in progress: where its state machine is, and what it works on. */
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
    int single;          /* all_reduce by single copy (arena.c run_single) */
    int err, err_peer;   /* ST_FAILED: the errno, and the rank it came from */
} call_t;

/* This rank's view of a group's arena. */
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
    /* While the machine is busy (more runnable tasks than load_cpus; -1: never), waits
     * take busy_spins and busy_yield_ns instead: wait.c, _load.py. */
    int busy_spins, load_cpus, busy;
    int64_t busy_yield_ns, load_next;
    int next_buf;
    int64_t wait_ns; /* time spent waiting for peers (the timeline's WAIT) */
    PyThreadState *ts; /* non-NULL while this call runs without the GIL */
    PyObject *keep[3]; /* the call's input, output and views, alive until it ends */
    int64_t pw_target, pw_t0; /* a wait() from Python in progress */
    /* Single copy (set_single_copy): calls of at least single_bytes (all_reduce: of at
     * least single_reduce_bytes too) read or write the peers' buffers directly, piece_bytes
     * at a time through tmp; pids are the peers' processes as verified at set-up (never
     * re-read from their words). */
    int64_t single_bytes, single_reduce_bytes, piece_bytes;
    int64_t pids[MAX_RANKS];
    char *tmp;
    int pw_started;
    call_t c;
} ArenaObject;

/* ------------------------------------------------------------------ inline helpers */

static inline int64_t ld(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static inline int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline int64_t *word(ArenaObject *a, int q, int w)
{
    return a->ctrl + (size_t)q * WORDS + w;
}

/* Release the GIL for the rest of the step (restored by step_rc and Arena.wait). */
static inline void nogil(ArenaObject *a)
{
    if (!a->ts)
        a->ts = PyEval_SaveThread();
}

/* A C-contiguous buffer of `obj`, or ValueError naming `what`. */
int pyc_get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what);

#endif
