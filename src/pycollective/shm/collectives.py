"""Collectives over a group's arena (see arena.py), for groups whose ranks share one host.

Each function runs one rank's part. Data moves in chunks of at most one slot per rank;
consecutive chunks take consecutive buffers of the arena (NBUF of them, round robin).
Ranks synchronise with phases (`Sync`): arrive (bump my counter), then wait until every
peer has arrived too. The rule that makes reuse safe: a buffer is rewritten only after a
wait that every rank passes only once it has finished reading that buffer.

all_reduce, reduce (large): a software pipeline with one phase per chunk. Step s copies
chunk s in (the shares the others own, into my slot of buffer s), waits for every rank to
finish step s-1, reduces my share of chunk s-1 (my own data straight from my buffer, plus
every peer's slot) into my slot and at once into my buffer (still in cache), copies the
others' reduced shares of chunk s-2 out, and arrives. The copy-in of step s overlaps the
wait, so a rank keeps working while a slower one catches up; with four buffers, buffer s
was last read in step s-2, which every rank finished before we passed the wait of s-1.
When every rank's buffer is itself shared memory (`pycollective.empty`), the ranks agree
on it at the first wait and reduce straight from each other's buffers instead (`_direct`):
no copy in, no copy of the own share out, no arena slots.
all_reduce, reduce (small): copy in, one phase, every rank reduces the whole payload from
every slot itself, in rank order (bitwise the same result everywhere).
Reductions are fused over the p inputs in rank order (Reducer), as the compiled arena
does them, so a rank on either path computes the same bits.
all_gather, reduce_scatter, broadcast: one phase per chunk (copy in, phase, copy out).
Every rank runs the same number of phases for the same call, whatever its role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .._dtypes import DType
from .._reduce_ops import ReduceOp, fused_reduce
from . import arena as _arena
from .arena import Arena


class Sync:
    """Phases over an arena. `arrive()` bumps this rank's counter and returns the target
    to wait for; `wait(target)` returns once every peer has arrived there too (polling
    `poll` meanwhile; it raises to give up). `first(target)` runs after the first wait of
    a call (the call checks). Calling the object runs a whole phase."""

    def __init__(
        self,
        arena: Arena,
        poll: Callable[[int], None],
        first: Callable[[int], None] | None = None,
    ) -> None:
        self.arena = arena
        self.poll = poll
        self.first = first

    def arrive(self) -> int:
        return self.arena.bump()

    def wait(self, target: int) -> None:
        self.arena.wait_all(target, self.poll)
        if self.first is not None:
            check, self.first = self.first, None
            check(target)

    def __call__(self) -> None:
        self.wait(self.arena.bump())


# Views of every rank's buffer of this call (index q: rank q's), when all are shared memory
# this rank has mapped; None to use the arena's slots. Asked for after the first wait.
PeerViews = Callable[[], "list[np.ndarray] | None"]


@dataclass(frozen=True)
class Reducer:
    """`fused(out, srcs)`: out = srcs[0] op srcs[1] op ..., in that (rank) order, with
    float16/bfloat16 accumulated in float32 and rounded once, and AVG's division by
    `divisor` (> 1) applied as each element is finished: _reduce_ops.fused_reduce, the
    reduction the compiled arena (pycollective._native) computes bit for bit. Every
    element of a call is reduced by one rank from the p inputs in rank order, so every
    rank gets the same bits whichever path each of them runs."""

    op: ReduceOp
    dtype: DType
    divisor: int = 0

    def fused(self, out: np.ndarray, srcs: list[np.ndarray]) -> None:
        fused_reduce(self.op, self.dtype, out, srcs, self.divisor)


@lru_cache(maxsize=256)
def reducer(op: ReduceOp, dtype: DType, divisor: int = 0) -> Reducer:
    """The reduction of `op` on `dtype`; with AVG and divisor > 1 the division is fused."""
    return Reducer(op, dtype, divisor if op is ReduceOp.AVG else 0)


# Up to this many bytes, all_reduce/reduce use the one-phase path (each rank reduces the
# whole payload itself): a second phase costs more than reducing p slots that are still in
# cache. Compiled, p=2, alternating in the same ranks: one phase 23 / 37 us at 64 / 256 KiB
# against 36 / 66 us for the pipeline; even at 1 MiB (183 vs 198 us).
SMALL_BYTES = 256 * 1024
# Largest chunk of a pipelined reduction by the compiled arena: arena.py chooses the
# group's (Arena.chunk_bytes, in the header), the same for every rank.
CHUNK_BYTES = _arena.CHUNK_BYTES_COMPILED
ALIGN_BYTES = 64  # shares start on cache-line boundaries


@lru_cache(maxsize=1024)
def _shares(m: int, p: int, itemsize: int) -> tuple[int, ...]:
    """Boundaries of p contiguous shares of m elements, on cache-line boundaries."""
    align = max(1, ALIGN_BYTES // itemsize)
    cuts = [min(m, (m * q // p) // align * align) for q in range(p)]
    return (*cuts, m)


def chunk_elements(arena: Arena, itemsize: int) -> int:
    """Elements per chunk of a pipelined reduction: one slot, at most the group's chunk."""
    return max(1, min(arena.slot_bytes, arena.chunk_bytes) // itemsize)


def all_reduce(
    arena: Arena, data: np.ndarray, red: Reducer, sync: Sync, views: PeerViews | None = None
) -> None:
    _reduce(arena, data, red, sync, None, views)


def reduce(
    arena: Arena,
    data: np.ndarray,
    red: Reducer,
    sync: Sync,
    root: int,
    views: PeerViews | None = None,
) -> None:
    """Only `root`'s data changes; the others' may be read-only."""
    _reduce(arena, data, red, sync, root, views)


def _reduce(
    arena: Arena,
    data: np.ndarray,
    red: Reducer,
    sync: Sync,
    root: int | None,
    views: PeerViews | None,
) -> None:
    p, r, n = arena.size, arena.rank, data.size
    if p == 1:
        return  # one rank: its data is the result
    typed = arena.typed(data.dtype)
    if n * data.itemsize <= min(SMALL_BYTES, arena.slot_bytes):
        b = arena.take()
        arena.slot(typed, b, r)[:n] = data
        sync()
        if root is None or root == r:
            red.fused(data, [arena.slot(typed, b, q)[:n] for q in range(p)])
        return
    per = chunk_elements(arena, data.itemsize)
    chunks = [data[lo : lo + per] for lo in range(0, n, per)]
    k = len(chunks)
    writes = root is None or root == r
    others = [q for q in range(p) if q != r]
    base = arena.take()
    state: list = [None] * k  # per chunk: (my slot, every slot, share cuts)

    def copy_in(c: int, b: int) -> None:
        chunk = chunks[c]
        m = chunk.size
        slots = [arena.slot(typed, b, q) for q in range(p)]
        cuts = _shares(m, p, data.itemsize)
        mine, lo, hi = slots[r], cuts[r], cuts[r + 1]
        mine[:lo] = chunk[:lo]  # the others' shares; mine is reduced straight from `chunk`
        mine[hi:m] = chunk[hi:m]
        state[c] = (slots, cuts)

    copy_in(0, base)
    target = sync.arrive()
    waited = False
    if views is not None:
        sync.wait(target)  # every rank has announced its buffer: all see the same answer
        waited = True
        bufs = views()
        if bufs is not None:
            _direct(bufs, r, red, sync, root, per)
            return
    if k > 1:
        arena.take(k - 1)  # buffers base+1 .. base+k-1, consecutive with base
    for s in range(1, k + 2):
        if s < k:
            copy_in(s, base + s)
        if not waited:
            sync.wait(target)
        waited = False
        if s <= k:  # reduce my share of chunk s-1, and keep it in my buffer too
            slots, cuts = state[s - 1]
            lo, hi = cuts[r], cuts[r + 1]
            if hi > lo:
                chunk, mine = chunks[s - 1], slots[r][lo:hi]
                red.fused(mine, [chunk[lo:hi] if q == r else slots[q][lo:hi] for q in range(p)])
                if writes:
                    chunk[lo:hi] = mine
        if s >= 2:
            if writes:  # the others' reduced shares of chunk s-2
                slots, cuts = state[s - 2]
                chunk = chunks[s - 2]
                for q in others:
                    lo, hi = cuts[q], cuts[q + 1]
                    if hi > lo:
                        chunk[lo:hi] = slots[q][lo:hi]
            state[s - 2] = None
        if s <= k:
            target = sync.arrive()


def _direct(
    bufs: list[np.ndarray], r: int, red: Reducer, sync: Sync, root: int | None, per: int
) -> None:
    """Reduce straight from every rank's shared buffer. Step t: reduce my share of chunk
    t in place (all_reduce: in my buffer; reduce: in the root's, where each rank writes
    only its own share), wait for step t-1 everywhere, copy the others' reduced shares of
    chunk t-1 from their buffers (all_reduce), arrive. My share of chunk t in any buffer
    is written by me alone, and read by others only after the wait that follows."""
    p, n = len(bufs), bufs[r].size
    others = [q for q in range(p) if q != r]
    itemsize = bufs[r].itemsize
    target = 0
    k = -(-n // per)
    dst = bufs[r if root is None else root]
    for t in range(k + 1):
        if t < k:
            lo0 = t * per
            m = min(per, n - lo0)
            cuts = _shares(m, p, itemsize)
            lo, hi = lo0 + cuts[r], lo0 + cuts[r + 1]
            if hi > lo:
                red.fused(dst[lo:hi], [b[lo:hi] for b in bufs])
        if t >= 1:
            sync.wait(target)
            if root is None:
                lo0 = (t - 1) * per
                m = min(per, n - lo0)
                cuts = _shares(m, p, itemsize)
                for q in others:
                    lo, hi = lo0 + cuts[q], lo0 + cuts[q + 1]
                    if hi > lo:
                        bufs[r][lo:hi] = bufs[q][lo:hi]
        target = sync.arrive()
    sync.wait(target)  # nobody returns (and lets its buffer change) while a peer reads it


def _pipeline(
    k: int, sync: Sync, put: Callable[[int, int], None], get: Callable[[int, int], None], base: int
) -> None:
    """k chunks, one phase each: step s puts chunk s into buffer base+s, waits for step
    s-1 everywhere, gets chunk s-1 out, arrives. The put overlaps the wait; buffer s was
    last read in step s-3 (NBUF = 4), which every rank finished before the wait of s-2."""
    target = 0
    for s in range(k + 1):
        if s < k:
            put(s, base + s)
        if s >= 1:
            sync.wait(target)
            get(s - 1, base + s - 1)
        if s < k:
            target = sync.arrive()


def _count(n: int, per: int) -> int:
    return max(1, -(-n // per))  # an empty call still runs one phase


def broadcast(arena: Arena, data: np.ndarray, sync: Sync, root: int) -> None:
    typed = arena.typed(data.dtype)
    per = arena.size * arena.slot_bytes // data.itemsize
    n = data.size
    is_root = arena.rank == root
    k = _count(n, per)

    def put(c: int, b: int) -> None:
        if is_root:
            lo = c * per
            m = min(per, n - lo)
            arena.region(typed, b)[:m] = data[lo : lo + m]

    def get(c: int, b: int) -> None:
        if not is_root:
            lo = c * per
            m = min(per, n - lo)
            data[lo : lo + m] = arena.region(typed, b)[:m]

    _pipeline(k, sync, put, get, arena.take(k))


def all_gather(arena: Arena, inp: np.ndarray, out: np.ndarray, sync: Sync) -> None:
    """`out` holds p blocks of inp.size elements; block q is rank q's input."""
    p, r, n = arena.size, arena.rank, inp.size
    typed = arena.typed(inp.dtype)
    per = arena.slot_bytes // inp.itemsize
    out[r * n : (r + 1) * n] = inp
    k = _count(n, per)

    def put(c: int, b: int) -> None:
        lo = c * per
        m = min(per, n - lo)
        arena.slot(typed, b, r)[:m] = inp[lo : lo + m]

    def get(c: int, b: int) -> None:
        lo = c * per
        m = min(per, n - lo)
        for q in range(p):
            if q != r:
                out[q * n + lo : q * n + lo + m] = arena.slot(typed, b, q)[:m]

    _pipeline(k, sync, put, get, arena.take(k))


def reduce_scatter(
    arena: Arena, inp: np.ndarray, out: np.ndarray, red: Reducer, sync: Sync
) -> None:
    """`inp` holds p blocks of out.size elements; rank r gets the reduction of block r."""
    p, r, n = arena.size, arena.rank, out.size
    typed = arena.typed(out.dtype)
    per = max(1, arena.slot_bytes // out.itemsize // p)
    if p == 1:
        out[:] = inp
        return
    k = _count(n, per)

    def put(c: int, b: int) -> None:
        lo = c * per
        m = min(per, n - lo)
        mine = arena.slot(typed, b, r)
        for q in range(p):
            if q != r:
                mine[q * m : (q + 1) * m] = inp[q * n + lo : q * n + lo + m]

    def get(c: int, b: int) -> None:
        lo = c * per
        m = min(per, n - lo)
        srcs = [
            inp[r * n + lo : r * n + lo + m]
            if q == r
            else arena.slot(typed, b, q)[r * m : (r + 1) * m]
            for q in range(p)
        ]
        red.fused(out[lo : lo + m], srcs)

    _pipeline(k, sync, put, get, arena.take(k))


def barrier(arena: Arena, sync: Sync) -> None:
    sync()
