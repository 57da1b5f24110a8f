/* The phase counters and waits (see wait.h). */
#include "wait.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(int64_t *w, uint32_t expected, int64_t timeout_ns)
{
#if defined(__linux__) && defined(SYS_futex)
    struct timespec ts = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, expected, &ts, NULL, 0);
#else
    (void)w; (void)expected;
    struct timespec ts = {0, timeout_ns < 200000 ? (long)timeout_ns : 200000L};
    nanosleep(&ts, NULL);
#endif
}

static void futex_wake(int64_t *w)
{
#if defined(__linux__) && defined(SYS_futex)
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
    (void)w;
#endif
}

/* The runnable tasks of the machine (/proc/loadavg's fourth field, "R/T"), or -1. */
static long runnable_now(void)
{
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = buf;
    for (int field = 0; field < 3; field++) { /* skip the three load averages */
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
    }
    long r = 0;
    const char *digits = p;
    while (*p >= '0' && *p <= '9' && r < 1000000000L)
        r = r * 10 + (*p++ - '0');
    return p > digits && *p == '/' ? r : -1;
}

/* Refresh a->busy if the last reading is older than LOAD_CHECK_NS (_load.py's twin). */
static inline void load_check(ArenaObject *a, int64_t t)
{
    if (a->load_cpus >= 0 && t >= a->load_next) {
        a->load_next = t + LOAD_CHECK_NS;
        a->busy = runnable_now() > a->load_cpus;
    }
}

int64_t pyc_bump(ArenaObject *a)
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

int pyc_wait_all(ArenaObject *a, call_t *c, int64_t end)
{
    const int64_t target = c->target;
    for (; c->wpeer < a->npeers; c->wpeer++, c->wstarted = 0) {
        int64_t *w = word(a, a->peers[c->wpeer], EPOCH);
        if (ld(w) >= target)
            continue;
        if (!c->wstarted) {
            /* On a busy machine the peer may be waiting for this very core: keep it
             * only briefly (a->busy is the last reading; it is refreshed below). */
            const int spins = a->busy ? a->busy_spins : a->pure_spins;
            int i = 0;
            while (i < spins && ld(w) < target) {
                cpu_relax();
                i++;
            }
            if (i < spins)
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
            load_check(a, t);
            if (t < c->wt0 + a->spin_ns + (a->busy ? a->busy_yield_ns : a->yield_ns)) {
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

/* Whether peer q's announcement is consistent with our call: the common cases of
 * runners/arena.py LocalGroup._check_peer (judge_announcement); anything else goes back
 * to Python, which decides and words the error. */
int pyc_ann_ok(ArenaObject *a, call_t *c, int q)
{
    int64_t *b = word(a, q, 0);
    int64_t s1, s2, f[ANN_WORDS];
    for (int tries = 0;; tries++) {
        s1 = ld(&b[SEQ]);
        for (int i = 0; i < ANN_WORDS; i++)
            f[i] = ld(&b[KIND + i]);
        s2 = ld(&b[SEQ]);
        if (s1 == s2)
            break;
        if (tries == SETTLE_SPINS)
            return 0; /* it keeps changing: Python's reader, bounded in time, decides */
    }
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

int pyc_phase_wait(ArenaObject *a, call_t *c, int64_t end)
{
    if (!c->reached) {
        int rc = pyc_wait_all(a, c, end);
        if (rc)
            return rc;
        c->reached = 1;
    }
    while (c->check_next < a->size) {
        int q = c->check_next++;
        if (q != a->rank && !pyc_ann_ok(a, c, q)) {
            c->check_peer = q;
            return ST_CHECK;
        }
    }
    return 0;
}
