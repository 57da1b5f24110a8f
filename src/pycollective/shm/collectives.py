"""Collectives over a group's arena (see arena.py), for groups whose ranks share one host.

Each function runs one rank's part. Data moves in chunks of at most one slot per rank;
consecutive chunks alternate between the arena's two halves. `phase()` is a barrier over
the arena: bump this rank's counter and wait for every peer's. The rule that makes reuse
safe: a rank reads a half only between the phase that published the chunk and the next
phase, and writes a half only before the phase that publishes it. A half is rewritten two
chunks later, after a phase every rank reaches only once it has finished reading it.

all_reduce, reduce: each rank copies its chunk into its slot; after a phase, rank r
reduces the r-th share of the chunk from every slot into its own slot (so the p ranks
reduce in parallel, each share read from memory once); after a second phase, every rank
(or only the root) copies the p reduced shares out. Small calls use one phase: every rank
reduces the whole (tiny) payload from every slot itself.
all_gather, reduce_scatter, broadcast: one phase per chunk (copy in, phase, copy out).
Every rank runs the same number of phases for the same call, whatever its role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .._dtypes import BFLOAT16, DType
from .._reduce_ops import _BOOL_UFUNC, _UFUNC, Kernel, ReduceOp, kernel
from .arena import Arena

Phase = Callable[[], None]


@dataclass(frozen=True)
class Reducer:
    """`inplace(dst, src)`: dst = op(dst, src); `into(out, a, b)`: out = op(a, b), which
    saves copying a rank's own share into the arena before reducing it."""

    inplace: Kernel
    into: Callable[[np.ndarray, np.ndarray, np.ndarray], None]


@lru_cache(maxsize=256)
def reducer(op: ReduceOp, dtype: DType) -> Reducer:
    inplace = kernel(op, dtype)
    ufunc = (_BOOL_UFUNC if dtype.kind == "b" else _UFUNC)[op]
    if dtype is BFLOAT16 and dtype.numpy == np.dtype(np.uint16):  # raw bits: no ufunc

        def into(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            out[...] = a
            inplace(out, b)

    else:

        def into(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            with np.errstate(all="ignore"):  # overflow is the caller's data, as in torch
                ufunc(a, b, out=out)

    return Reducer(inplace, into)

# Below this many bytes, all_reduce/reduce use the one-phase path (each rank reduces the
# whole payload itself): two phases cost more than p small reductions.
SMALL_BYTES = 16 * 1024
_ALIGN_BYTES = 64  # shares start on cache-line boundaries


@lru_cache(maxsize=1024)
def _shares(m: int, p: int, itemsize: int) -> tuple[int, ...]:
    """Boundaries of p contiguous shares of m elements, on cache-line boundaries."""
    align = max(1, _ALIGN_BYTES // itemsize)
    cuts = [min(m, (m * q // p) // align * align) for q in range(p)]
    return (*cuts, m)


def all_reduce(arena: Arena, data: np.ndarray, red: Reducer, phase: Phase) -> None:
    _reduce(arena, data, red, phase, root=None)


def reduce(arena: Arena, data: np.ndarray, red: Reducer, phase: Phase, root: int) -> None:
    """Only `root`'s data changes; the others' may be read-only."""
    _reduce(arena, data, red, phase, root=root)


def _reduce(
    arena: Arena, data: np.ndarray, red: Reducer, phase: Phase, root: int | None
) -> None:
    p, r, n = arena.size, arena.rank, data.size
    if p == 1:
        return  # one rank: its data is the result
    typed = arena.typed(data.dtype)
    per = arena.slot_bytes // data.itemsize
    if n * data.itemsize <= min(SMALL_BYTES, arena.slot_bytes):
        h = arena.flip()
        arena.slot(typed, h, r)[:n] = data
        phase()
        if root is None or root == r:
            red.into(data, arena.slot(typed, h, 0)[:n], arena.slot(typed, h, 1)[:n])
            for q in range(2, p):
                red.inplace(data, arena.slot(typed, h, q)[:n])
        return
    for lo in range(0, n, per):
        m = min(per, n - lo)
        chunk = data[lo : lo + m]
        h = arena.flip()
        slots = [arena.slot(typed, h, q) for q in range(p)]
        cuts = _shares(m, p, data.itemsize)
        mine = slots[r]
        a, b = cuts[r], cuts[r + 1]
        mine[:a] = chunk[:a]  # the others' shares; ours is reduced straight from `chunk`
        mine[b:m] = chunk[b:m]
        phase()
        if b > a:
            others = [q for q in range(p) if q != r]
            red.into(mine[a:b], chunk[a:b], slots[others[0]][a:b])
            for q in others[1:]:
                red.inplace(mine[a:b], slots[q][a:b])
        phase()
        if root is None or root == r:
            for q in range(p):
                a, b = cuts[q], cuts[q + 1]
                if b > a:
                    chunk[a:b] = slots[q][a:b]


def broadcast(arena: Arena, data: np.ndarray, phase: Phase, root: int) -> None:
    typed = arena.typed(data.dtype)
    per = arena.size * arena.slot_bytes // data.itemsize
    n = data.size
    is_root = arena.rank == root
    for lo in range(0, max(n, 1), per):
        m = min(per, n - lo)
        region = arena.half_region(typed, arena.flip())
        if is_root:
            region[:m] = data[lo : lo + m]
        phase()
        if not is_root:
            data[lo : lo + m] = region[:m]


def all_gather(arena: Arena, inp: np.ndarray, out: np.ndarray, phase: Phase) -> None:
    """`out` holds p blocks of inp.size elements; block q is rank q's input."""
    p, r, n = arena.size, arena.rank, inp.size
    typed = arena.typed(inp.dtype)
    per = arena.slot_bytes // inp.itemsize
    out[r * n : (r + 1) * n] = inp
    for lo in range(0, max(n, 1), per):
        m = min(per, n - lo)
        h = arena.flip()
        arena.slot(typed, h, r)[:m] = inp[lo : lo + m]
        phase()
        for q in range(p):
            if q != r:
                out[q * n + lo : q * n + lo + m] = arena.slot(typed, h, q)[:m]


def reduce_scatter(
    arena: Arena, inp: np.ndarray, out: np.ndarray, red: Reducer, phase: Phase
) -> None:
    """`inp` holds p blocks of out.size elements; rank r gets the reduction of block r."""
    p, r, n = arena.size, arena.rank, out.size
    typed = arena.typed(out.dtype)
    per = max(1, arena.slot_bytes // out.itemsize // p)
    if p == 1:
        out[:] = inp
        return
    for lo in range(0, max(n, 1), per):
        m = min(per, n - lo)
        h = arena.flip()
        mine = arena.slot(typed, h, r)
        for b in range(p):
            if b != r:
                mine[b * m : (b + 1) * m] = inp[b * n + lo : b * n + lo + m]
        phase()
        dst = out[lo : lo + m]
        others = [arena.slot(typed, h, q)[r * m : (r + 1) * m] for q in range(p) if q != r]
        red.into(dst, inp[r * n + lo : r * n + lo + m], others[0])
        for src in others[1:]:
            red.inplace(dst, src)


def barrier(arena: Arena, phase: Phase) -> None:
    phase()
