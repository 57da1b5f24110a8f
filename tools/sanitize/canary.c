/* Deliberate errors, one per sanitizer, that `make sanitize` (tools/sanitize/run.py)
 * triggers before its tests: a run whose canary goes unreported proves its set-up blind
 * (runtime not preloaded, options not passed, reports not collected) and fails. Built
 * with the same flags as the extension, loaded with ctypes, never part of the package. */
#include <pthread.h>
#include <stdlib.h>

/* ASan: one byte past a heap block. */
int canary_heap_overflow(int n)
{
    volatile char *p = malloc((size_t)n);
    p[n] = 1;
    int v = p[0];
    free((void *)p);
    return v;
}

/* UBSan: a shift past the width of int (the caller passes 40); undefined under the
 * extension's flags too (Python's -fwrapv defines signed overflow, not this). */
int canary_shift(int x)
{
    volatile int y = x;
    return 1 << y;
}

/* TSan: two threads write one int with nothing ordering them. Each stays alive until
 * the other has written (a thread that ended before the other started could have its
 * slot reused by the runtime and the race go unseen: it did, once in CI). The hand-shake
 * is by relaxed atomics, which order nothing for TSan, so the writes stay unordered. */
#include <stdatomic.h>

static int shared_counter;
static atomic_int written;

static void *bump_counter(void *arg)
{
    (void)arg;
    shared_counter++;
    atomic_fetch_add_explicit(&written, 1, memory_order_relaxed);
    while (atomic_load_explicit(&written, memory_order_relaxed) < 2)
        ;
    return NULL;
}

int canary_race(void)
{
    pthread_t a, b;
    atomic_store_explicit(&written, 0, memory_order_relaxed);
    pthread_create(&a, NULL, bump_counter, NULL);
    pthread_create(&b, NULL, bump_counter, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return shared_counter;
}
