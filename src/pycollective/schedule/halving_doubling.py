"""Recursive halving (reduce-scatter) and Rabenseifner's all-reduce (halving then doubling).

On a power-of-two core, round k pairs ranks at distance p/2**(k+1): each keeps the half of
its current window that holds its own final block, sends the other half, and reduces the
half it keeps. After lg p rounds core rank v holds the finished window v. All-reduce then
doubles the windows back (an all-gather), so each element is computed once and copied.
Extra ranks of a non-power-of-two world fold in first (see _fold).
"""

from __future__ import annotations

from . import _fold
from ._steps import Chunk, Schedule
from ._util import RoundsBuilder, block_offsets


def _halving_windows(v: int, p2: int) -> list[tuple[int, int, int, int, int]]:
    """Per halving round: (partner core rank, keep_lo, keep_hi, send_lo, send_hi) in blocks."""
    out = []
    d = p2 >> 1
    while d:
        lo = v & ~(2 * d - 1)
        if v & d:
            out.append((v ^ d, lo + d, lo + 2 * d, lo, lo + d))
        else:
            out.append((v ^ d, lo, lo + d, lo + d, lo + 2 * d))
        d >>= 1
    return out


def all_reduce(rank: int, size: int, count: int) -> Schedule:
    """{"data": n}; result in data on every rank (bitwise identical)."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    p2, rem = _fold.core_size(p), _fold.extras(p)
    lg = p2.bit_length() - 1
    v = _fold.core_rank(rank, p)
    partner = _fold.fold_partner(rank, p)
    first = 1 if rem else 0
    last = first + 2 * lg
    if v is None:
        assert partner is not None
        b.send(0, partner, "data", 0, n)
        b.recv(last, partner, "data", 0, n)
        return b.build({"data": n})
    if partner is not None:
        b.recv(0, partner, "data", 0, n, reduce=True)
    offs = block_offsets(n, p2)

    def rng(lo: int, hi: int) -> tuple[int, int]:
        return offs[lo], offs[hi] - offs[lo]

    for k, (peer, klo, khi, slo, shi) in enumerate(_halving_windows(v, p2)):
        real = _fold.real_rank(peer, p)
        b.send(first + k, real, "data", *rng(slo, shi))
        b.recv(first + k, real, "data", *rng(klo, khi), reduce=True)
    for k in range(lg):
        d = 1 << k
        mine = v & ~(d - 1)
        theirs = (v ^ d) & ~(d - 1)
        real = _fold.real_rank(v ^ d, p)
        b.send(first + lg + k, real, "data", *rng(mine, mine + d))
        b.recv(first + lg + k, real, "data", *rng(theirs, theirs + d))
    if partner is not None:
        b.send(last, partner, "data", 0, n)
    return b.build({"data": n})


def reduce_scatter(rank: int, size: int, count: int) -> Schedule:
    """{"input": p*n, "output": n}; input is read only, partial sums live in scratch "acc".

    Core rank v owns the contiguous real blocks of the ranks it stands for (two for a
    folded pair), so windows of core ranks are contiguous element ranges. At the end a
    folded pair's core member sends the sitting-out rank its block.
    """
    p, n = size, count
    b = RoundsBuilder(rank, p)
    buffers = {"input": p * n, "output": n}
    if p == 1:
        b.copy(0, Chunk("input", 0, n), Chunk("output", 0, n))
        return b.build(buffers)
    p2, rem = _fold.core_size(p), _fold.extras(p)
    lg = p2.bit_length() - 1
    v = _fold.core_rank(rank, p)
    partner = _fold.fold_partner(rank, p)
    first = 1 if rem else 0
    last = first + lg
    if v is None:
        assert partner is not None
        b.send(0, partner, "input", 0, p * n)
        b.recv(last, partner, "output", 0, n)
        return b.build(buffers)
    b.copy(0, Chunk("input", 0, p * n), Chunk("acc", 0, p * n))
    if partner is not None:
        b.recv(0, partner, "acc", 0, p * n, reduce=True)

    def rng(lo: int, hi: int) -> tuple[int, int]:
        start = _fold.real_ranks_of(lo, p).start
        stop = _fold.real_ranks_of(hi - 1, p).stop
        return start * n, (stop - start) * n

    for k, (peer, klo, khi, slo, shi) in enumerate(_halving_windows(v, p2)):
        real = _fold.real_rank(peer, p)
        b.send(first + k, real, "acc", *rng(slo, shi))
        b.recv(first + k, real, "acc", *rng(klo, khi), reduce=True)
    b.copy(last, Chunk("acc", rank * n, n), Chunk("output", 0, n))
    if partner is not None:
        b.send(last, partner, "acc", partner * n, n)
    return b.build(buffers, {"acc": p * n})
