/* The arena's collectives as resumable state machines (see arena.h). */
#include "arena.h"

#include "copy.h"
#include "peermem.h"
#include "wait.h"
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static inline char *slot(ArenaObject *a, int64_t buf, int q)
{
    return a->data + ((size_t)(buf % a->nbuf) * (size_t)a->size + (size_t)q) * (size_t)a->slot_bytes;
}

static inline char *region(ArenaObject *a, int64_t buf)
{
    return a->data + (size_t)(buf % a->nbuf) * (size_t)a->size * (size_t)a->slot_bytes;
}

static inline int64_t take(ArenaObject *a, int64_t n)
{
    int64_t b = a->next_buf;
    a->next_buf = (int)((b + n) % a->nbuf);
    return b;
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
        int rc_ = pyc_phase_wait(a, c, end);                                               \
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
        pyc_copy(dst, src, bytes);
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
    copy(a, mine + (size_t)hi * isz, chunk + (size_t)hi * isz, (size_t)(m - hi) * isz);
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
        srcs[q] = q == r ? chunk + (size_t)lo * isz : slot(a, buf, q) + (size_t)lo * isz;
    char *mine = slot(a, buf, r) + (size_t)lo * isz;
    reduce_into(a, c, mine, srcs, hi - lo);
    if (c->writes)
        copy_out(a, c, chunk + (size_t)lo * isz, mine, (size_t)(hi - lo) * isz);
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
            copy_out(a, c, chunk + (size_t)lo * isz, slot(a, buf, q) + (size_t)lo * isz, (size_t)(hi - lo) * isz);
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
                        srcs[q] = c->views[q] + (size_t)lo * isz;
                    char *dst = c->views[c->plan.root < 0 ? r : c->plan.root];
                    reduce_into(a, c, dst + (size_t)lo * isz, srcs, hi - lo);
                }
            }
            if (c->s >= 1) {
                WAIT_FOR(c->target);
                if (c->plan.root < 0) { /* the others' reduced shares of the previous chunk */
                    int64_t lo0 = (c->s - 1) * c->per, m = min64(c->per, c->n - lo0);
                    for (int q = 0; q < p; q++) {
                        int64_t lo = lo0 + cut(m, p, q, isz), hi = lo0 + cut(m, p, q + 1, isz);
                        if (q != r && hi > lo)
                            copy_out(a, c, c->views[r] + (size_t)lo * isz, c->views[q] + (size_t)lo * isz,
                                     (size_t)(hi - lo) * isz);
                    }
                }
            }
            c->target = pyc_bump(a);
        }
        /* nobody returns (and lets its buffer change) while a peer still reads it */
        WAIT_FOR(c->target);
    }
    return ST_DONE;
}

/* ---- all_reduce by single copy: every rank reads the others' data and writes them its
 * results straight in their buffers (peermem.c), with no slot in between ----
 *
 * Phase 0 announces every rank's buffer (ADDR, with the call). Then the whole buffer is
 * cut into pieces, and every rank takes pieces from the arena's claim word (H_CLAIM, a
 * compare-and-swap) until none is left: for each it reads every peer's piece into tmp,
 * reduces them in rank order with its own, in place, and writes the result into every
 * peer's buffer at the same place. A piece is read and written, in every buffer, by the
 * rank that took it alone, so no phase is needed between pieces, and a rank the
 * scheduler holds back takes fewer of them instead of keeping the others waiting. The
 * last phase carries every rank's error word (SC_ERR, written before it), so either every
 * rank returns DONE or every rank fails, and nobody returns (and lets its buffer go)
 * while a peer may still read or write it. Per byte of the call at p=2, whoever does it:
 * read from the peer into tmp (hot), a reduction, written to the peer; no copy in, no
 * copy out. */

/* The next piece of the call for this rank to do, or -1 when all k are taken. Every rank
 * zeroes the word before it enters the call's phase 0 and takes pieces only after it, so
 * every reset comes before every claim of the call, and after every claim of the last one
 * (a rank enters a call only after every rank passed the last one's last phase). */
static int64_t claim(ArenaObject *a, int64_t k)
{
    int64_t j = __atomic_fetch_add((int64_t *)a->mem.buf + H_CLAIM, 1, __ATOMIC_ACQ_REL);
    return j >= 0 && j < k ? j : -1;
}

/* A rank's error word (SC_ERR) for its single copy: 0, or the errno in the low 32 bits
 * and, above them, 1 + the rank whose buffer it could not reach. So every rank names
 * that rank (a process gone: the one killed), not the one that found it gone. */
static int64_t single_error_word(const call_t *c)
{
    return c->err ? (int64_t)c->err | ((int64_t)(c->err_peer + 1) << 32) : 0;
}

/* A single-copy call's end, after its last phase: our error, else the first peer's error
 * word (which it wrote before that phase) fails the call here too. */
static int single_verdict(ArenaObject *a, call_t *c)
{
    for (int q = 0; q < a->size && !c->err; q++) {
        int64_t e = q == a->rank ? 0 : ld(word(a, q, SC_ERR));
        if (e) { /* a peer's word: data, checked */
            int64_t code = e & 0xffffffff, at = (e >> 32) - 1;
            c->err = code > 0 && code < 4096 ? (int)code : EIO;
            c->err_peer = at >= 0 && at < a->size ? (int)at : q;
        }
    }
    return c->err ? ST_FAILED : ST_DONE;
}

/* Every peer's address announced for this call (ADDR; 0 for ourselves and for a peer
 * that announced none), read once after phase 0. */
static void peer_addrs(ArenaObject *a, uint64_t *addr)
{
    for (int q = 0; q < a->size; q++)
        addr[q] = q == a->rank ? 0 : (uint64_t)ld(word(a, q, ADDR));
}

/* One piece of single copy's reads: srcs[q] = `own` for us, else `bytes` of peer q's
 * announced buffer from `off`, read into the scratch (a piece_bytes slot a peer), in
 * rank order for the reduction. 0, or the errno with c->err_peer set to that peer. */
static int read_peers(ArenaObject *a, call_t *c, const uint64_t *addr, uint64_t off,
                      size_t bytes, const void *own, const void **srcs)
{
    char *t = a->tmp;
    for (int q = 0; q < a->size; q++) {
        if (q == a->rank) {
            srcs[q] = own;
            continue;
        }
        srcs[q] = t;
        int err = addr[q] ? pyc_peer_read((pid_t)a->pids[q], t, addr[q] + off, bytes) : EINVAL;
        if (err) {
            c->err_peer = q;
            return err;
        }
        t += a->piece_bytes;
    }
    return 0;
}

static int run_single(ArenaObject *a, call_t *c, int64_t end)
{
    const int p = a->size, r = a->rank;
    const size_t isz = c->plan.itemsize;
    switch (c->pc) {
    case 0:
        __atomic_store_n((int64_t *)a->mem.buf + H_CLAIM, 0, __ATOMIC_RELEASE);
        c->target = pyc_bump(a); /* its fence orders the reset before it */
        WAIT_FOR(c->target);
        if (c->shared) { /* every rank's buffer shared: reduce straight from them */
            YIELD(ST_VIEWS);
            if (c->have_views) {
                c->per = min64(a->slot_bytes, a->chunk_bytes) / (int64_t)isz;
                c->per = c->per < 1 ? 1 : c->per;
                c->k = (c->n + c->per - 1) / c->per;
                c->direct = 1;
                c->pc = 0;
                return run_direct(a, c, end);
            }
        }
        nogil(a);
        c->err = 0;
        {
            uint64_t addr[MAX_RANKS];
            peer_addrs(a, addr);
            int64_t piece = a->piece_bytes / (int64_t)isz;
            piece = piece < 1 ? 1 : piece;
            const int64_t k = (c->n + piece - 1) / piece;
            for (int64_t j; !c->err && (j = claim(a, k)) >= 0;) {
                const int64_t x = j * piece;
                size_t bytes = (size_t)min64(piece, c->n - x) * isz;
                const void *srcs[MAX_RANKS];
                char *mine = c->out + (size_t)x * isz;
                if ((c->err = read_peers(a, c, addr, (uint64_t)x * isz, bytes, mine, srcs)))
                    break;
                reduce_into(a, c, mine, srcs, (int64_t)(bytes / isz));
                for (int q = 0; q < p && !c->err; q++) {
                    if (q == r)
                        continue;
                    c->err = pyc_peer_write((pid_t)a->pids[q], mine, addr[q] + (uint64_t)x * isz, bytes);
                    c->err_peer = q;
                }
            }
        }
        /* read by the peers after the last phase; rewritten only at our next single
         * copy's last phase, which they cannot reach before reading it */
        st(word(a, r, SC_ERR), single_error_word(c));
        c->target = pyc_bump(a);
        WAIT_FOR(c->target);
        return single_verdict(a, c);
    }
    return ST_DONE;
}

static int run_reduce(ArenaObject *a, call_t *c, int64_t end)
{
    const int p = a->size, r = a->rank;
    const size_t isz = c->plan.itemsize;
    if (c->direct)
        return run_direct(a, c, end);
    if (c->single)
        return run_single(a, c, end);
    switch (c->pc) {
    case 0:
        if (p == 1)
            break;
        if ((int64_t)((size_t)c->n * isz) <= min64(a->small_bytes, a->slot_bytes)) {
            c->b = take(a, 1);
            memcpy(slot(a, c->b, r), c->out, (size_t)c->n * isz);
            WAIT_FOR(pyc_bump(a));
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
        c->target = pyc_bump(a);
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
                c->target = pyc_bump(a);
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
            copy(a, region(a, buf), c->out + (size_t)lo * isz, (size_t)m * isz);
        break;
    case C_ALL_GATHER:
        copy(a, slot(a, buf, r), c->in + (size_t)lo * isz, (size_t)m * isz);
        /* my own block of the output, chunk by chunk while the input is in cache (and
         * while the peers catch up), instead of all of it before the first phase */
        copy_out(a, c, c->out + (size_t)(r * c->n + lo) * isz, c->in + (size_t)lo * isz, (size_t)m * isz);
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
            copy_out(a, c, c->out + (size_t)lo * isz, region(a, buf), (size_t)m * isz);
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
        reduce_into(a, c, c->out + (size_t)lo * isz, srcs, m);
        break;
    }
    }
}

static int run_pipeline(ArenaObject *a, call_t *c, int64_t end)
{
    const int p = a->size;
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
                c->target = pyc_bump(a);
        }
    }
    return ST_DONE;
}

/* ---- reduce_scatter, all_gather and broadcast by single copy: only reads ----
 *
 * Phase 0 announces every rank's buffer (ADDR: the input of reduce_scatter and
 * all_gather, broadcast's buffer). Then each rank reads what it needs of its peers'
 * straight from them (peermem.c): a peer's memory is never written. The last phase
 * carries every rank's error word, as run_single's does, so every rank returns DONE or
 * every rank fails, and no rank lets its buffer go while a peer may still read it. */

/* reduce_scatter: every rank reads its block of each peer's input, piece by piece into
 * the private scratch, and reduces them in rank order with its own into its output. Per
 * byte one read across processes and the reduction, where the slots add a copy in. */
static int scatter_reads(ArenaObject *a, call_t *c, const uint64_t *addr)
{
    const size_t isz = c->plan.itemsize;
    int64_t piece = a->piece_bytes / (int64_t)isz;
    piece = piece < 1 ? 1 : piece;
    for (int64_t x = 0; x < c->n; x += piece) {
        const size_t at = ((size_t)a->rank * (size_t)c->n + (size_t)x) * isz; /* my block */
        const size_t bytes = (size_t)min64(piece, c->n - x) * isz;
        const void *srcs[MAX_RANKS];
        int err = read_peers(a, c, addr, at, bytes, c->in + at, srcs);
        if (err)
            return err;
        reduce_into(a, c, c->out + (size_t)x * isz, srcs, (int64_t)(bytes / isz));
    }
    return 0;
}

/* all_gather: every rank copies its own input into its block of the output (nothing when
 * the input is that block: in place) and reads every peer's input straight into that
 * peer's block. Per byte one copy across processes where the slots take two (in, out). */
static int gather_reads(ArenaObject *a, call_t *c, const uint64_t *addr)
{
    const int p = a->size, r = a->rank;
    const size_t block = (size_t)c->n * c->plan.itemsize;
    char *mine = c->out + (size_t)r * block;
    if (mine + block <= c->in || c->in + block <= mine)
        copy_out(a, c, mine, c->in, block); /* (non-temporal when large) */
    else if (mine != c->in)
        memmove(mine, c->in, block);
    for (int q = 0; q < p; q++) {
        if (q == r)
            continue;
        int err = addr[q] ? pyc_peer_read((pid_t)a->pids[q], c->out + (size_t)q * block, addr[q], block)
                          : EINVAL;
        if (err) {
            c->err_peer = q;
            return err;
        }
    }
    return 0;
}

/* Broadcast by single copy up to this size. Beyond it the pipeline's copy in (the root)
 * and copy out (the others), side by side on two cores, beat one reader's copy of it all
 * once the buffers leave the cache (p=2, AMD EPYC 32 MiB L3, one run each way: 1 / 4 /
 * 16 MiB 142 / 631 / 2360 us by single copy against 220 / 717 / 2910 us, 32 / 64 MiB
 * 4.42 / 8.84 ms against 3.86 / 6.9 ms). */
#define BCAST_SINGLE_MAX_BYTES ((size_t)16 << 20)

/* broadcast: every rank but the root reads the root's buffer straight into its own; the
 * root only waits. Per byte one copy across processes where the slots take two. */
static int bcast_reads(ArenaObject *a, call_t *c, const uint64_t *addr)
{
    const int root = c->plan.root;
    if (a->rank == root)
        return 0;
    c->err_peer = root;
    return addr[root] ? pyc_peer_read((pid_t)a->pids[root], c->out, addr[root],
                                      (size_t)c->n * c->plan.itemsize)
                      : EINVAL;
}

static int run_single_reads(ArenaObject *a, call_t *c, int64_t end)
{
    switch (c->pc) {
    case 0:
        c->target = pyc_bump(a);
        WAIT_FOR(c->target);
        nogil(a);
        {
            uint64_t addr[MAX_RANKS];
            peer_addrs(a, addr);
            c->err = c->plan.coll == C_REDUCE_SCATTER ? scatter_reads(a, c, addr)
                     : c->plan.coll == C_BROADCAST    ? bcast_reads(a, c, addr)
                                                      : gather_reads(a, c, addr);
        }
        st(word(a, a->rank, SC_ERR), single_error_word(c));
        c->target = pyc_bump(a);
        WAIT_FOR(c->target);
        return single_verdict(a, c);
    }
    return ST_DONE;
}

static int run_barrier(ArenaObject *a, call_t *c, int64_t end)
{
    switch (c->pc) {
    case 0:
        WAIT_FOR(pyc_bump(a));
    }
    return ST_DONE;
}

/* Runs the current call until it ends or needs the caller; restores the GIL. */
int pyc_step(ArenaObject *a, int64_t budget_ns)
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
        rc = c->single ? run_single_reads(a, c, end) : run_pipeline(a, c, end);
    }
    if (a->ts) {
        PyEval_RestoreThread(a->ts);
        a->ts = NULL;
    }
    if (rc == ST_DONE || rc == ST_FAILED) {
        c->pc = -1; /* nothing to resume */
        for (int i = 0; i < 3; i++)
            Py_CLEAR(a->keep[i]);
    }
    return rc;
}

/* The announcement is a seqlock: SEQ is 0 while the words change. */
void pyc_start_call(ArenaObject *a, const PlanObject *plan, char *in, char *out, int64_t n,
                    int64_t seq, const int64_t *shared, PyObject *inobj, PyObject *outobj)
{
    call_t *c = &a->c;
    int64_t *blk = word(a, a->rank, 0);
    st(&blk[SEQ], 0);
    for (int i = 0; i < BUF_WORDS; i++)
        st(&blk[BUF_FD + i], shared[i]);
    for (int i = 0; i < ANN_WORDS; i++)
        st(&blk[KIND + i], plan->ann[i]);
    /* Single copy: the group's threshold and the count are every rank's alike, so every
     * rank decides alike; peers read ADDR only after this call's first phase. */
    const size_t bytes = (size_t)n * plan->itemsize;
    int single = ((plan->coll == C_ALL_REDUCE && bytes >= (size_t)a->single_reduce_bytes) ||
                  plan->coll == C_ALL_GATHER ||
                  plan->coll == C_REDUCE_SCATTER ||
                  (plan->coll == C_BROADCAST && bytes <= BCAST_SINGLE_MAX_BYTES)) &&
                 a->size > 1 && a->single_bytes > 0 && a->tmp &&
                 bytes >= (size_t)a->single_bytes && bytes > (size_t)a->small_bytes;
    /* all_reduce's peers read and write its buffer, broadcast's read the root's, all_gather's
     * and reduce_scatter's read its input (n: the count of one block) */
    char *announced = plan->coll == C_ALL_REDUCE || plan->coll == C_BROADCAST ? out : in;
    st(&blk[ADDR], single ? (int64_t)(uintptr_t)announced : 0);
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
    c->single = single;
    c->err = 0;
}
