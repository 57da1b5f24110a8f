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

/* TSan: two threads write one int with nothing ordering them. */
static int shared_counter;

static void *bump_counter(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        shared_counter++;
    return NULL;
}

int canary_race(void)
{
    pthread_t a, b;
    pthread_create(&a, NULL, bump_counter, NULL);
    pthread_create(&b, NULL, bump_counter, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return shared_counter;
}
