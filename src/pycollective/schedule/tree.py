"""Binomial trees: broadcast, reduce, all-reduce (reduce then broadcast), gather, scatter.

Ranks are renumbered relative to the root (virtual rank v = (rank - root) mod p, the
trick of gloo/broadcast.cc) so one tree shape serves every root. ceil(lg p) rounds each
way, for any p: a binomial tree needs no folding.

Broadcast grows the informed set: in round k ranks v < 2**k send to v + 2**k.
Reduce/gather shrink it: in round k rank v with lowest set bit 2**k sends its subtree
[v, v + 2**k) to v - 2**k. Scatter is gather run backwards.
"""

from __future__ import annotations

from ._steps import Chunk, Schedule
from ._util import RoundsBuilder, ceil_log2, lowbit


def _real(v: int, root: int, size: int) -> int:
    return (v + root) % size


def _bcast(b: RoundsBuilder, v: int, root: int, buf: str, n: int, first: int) -> None:
    p = b.size
    for k in range(ceil_log2(p)):
        mask = 1 << k
        if v < mask and v + mask < p:
            b.send(first + k, _real(v + mask, root, p), buf, 0, n)
        elif mask <= v < 2 * mask:
            b.recv(first + k, _real(v - mask, root, p), buf, 0, n)


def _reduce(b: RoundsBuilder, v: int, root: int, buf: str, acc: str, n: int) -> bool:
    """Binomial reduce of `buf` towards v=0. Partial sums go to `acc` on ranks that
    receive (acc may equal buf). Returns whether acc was used (so it needs allocating)."""
    p = b.size
    receives = [
        k for k in range(ceil_log2(p)) if (v == 0 or (1 << k) < lowbit(v)) and v + (1 << k) < p
    ]
    src = acc if receives else buf
    if receives and acc != buf:
        b.copy(0, Chunk(buf, 0, n), Chunk(acc, 0, n))
    for k in receives:
        b.recv(k, _real(v + (1 << k), root, p), src, 0, n, reduce=True)
    if v:
        k = lowbit(v).bit_length() - 1
        b.send(k, _real(v - (1 << k), root, p), src, 0, n)
    return bool(receives)


def broadcast(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"data": n}; root's data ends on every rank."""
    b = RoundsBuilder(rank, size)
    _bcast(b, (rank - root) % size, root, "data", count, 0)
    return b.build({"data": count})


def reduce(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"data": n}; result on root's data, other ranks' data unchanged (scratch "acc")."""
    b = RoundsBuilder(rank, size)
    v = (rank - root) % size
    _reduce(b, v, root, "data", "data" if v == 0 else "acc", count)
    return b.build({"data": count}, {"acc": count})


def all_reduce(rank: int, size: int, count: int) -> Schedule:
    """{"data": n}; reduce to rank 0 in place, then broadcast the one finished copy."""
    b = RoundsBuilder(rank, size)
    _reduce(b, rank, 0, "data", "data", count)
    _bcast(b, rank, 0, "data", count, ceil_log2(size))
    return b.build({"data": count})


def _pieces(lo: int, hi: int, root: int, size: int) -> list[tuple[int, int]]:
    """Split a virtual rank range where real ranks wrap past size-1, so that each piece is
    contiguous in real-rank order. Both ends of a message split the same way."""
    wrap = size - root
    if lo < wrap < hi:
        return [(lo, wrap), (wrap, hi)]
    return [(lo, hi)] if hi > lo else []


def gather(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"input": n, "output": p*n} on root, {"input": n} elsewhere.

    Interior ranks collect their subtree's blocks in virtual order in scratch "tmp"; the
    root receives straight into output, which is why ranges are split at the wrap point.
    """
    p, n = size, count
    b = RoundsBuilder(rank, p)
    v = (rank - root) % p
    span = p if v == 0 else min(lowbit(v), p - v)  # subtree [v, v+span)
    kids = [k for k in range(ceil_log2(p)) if (1 << k) < span]
    if v == 0:
        buffers = {"input": n, "output": p * n}
        b.copy(0, Chunk("input", 0, n), Chunk("output", rank * n, n))
        for k in kids:
            lo, hi = 1 << k, min(2 << k, p)
            for a, c in _pieces(lo, hi, root, p):
                b.recv(k, _real(lo, root, p), "output", _real(a, root, p) * n, (c - a) * n)
        return b.build(buffers)
    buffers = {"input": n}
    parent_round = lowbit(v).bit_length() - 1
    parent = _real(v - lowbit(v), root, p)
    if span == 1:
        b.send(parent_round, parent, "input", 0, n)
        return b.build(buffers)
    b.copy(0, Chunk("input", 0, n), Chunk("tmp", 0, n))
    for k in kids:
        lo, hi = v + (1 << k), min(v + (2 << k), v + span)
        for a, c in _pieces(lo, hi, root, p):
            b.recv(k, _real(lo, root, p), "tmp", (a - v) * n, (c - a) * n)
    for a, c in _pieces(v, v + span, root, p):
        b.send(parent_round, parent, "tmp", (a - v) * n, (c - a) * n)
    return b.build(buffers, {"tmp": span * n})


def scatter(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"input": p*n, "output": n} on root, {"output": n} elsewhere.

    Gather reversed in time: round L-1-k moves the subtrees of size 2**k.
    """
    p, n = size, count
    b = RoundsBuilder(rank, p)
    v = (rank - root) % p
    L = ceil_log2(p)
    span = p if v == 0 else min(lowbit(v), p - v)
    kids = [k for k in range(ceil_log2(p)) if (1 << k) < span]
    if v == 0:
        buffers = {"input": p * n, "output": n}
        b.copy(0, Chunk("input", rank * n, n), Chunk("output", 0, n))
        for k in kids:
            lo, hi = 1 << k, min(2 << k, p)
            for a, c in _pieces(lo, hi, root, p):
                b.send(L - 1 - k, _real(lo, root, p), "input", _real(a, root, p) * n, (c - a) * n)
        return b.build(buffers)
    buffers = {"output": n}
    k0 = lowbit(v).bit_length() - 1
    parent = _real(v - lowbit(v), root, p)
    if span == 1:
        b.recv(L - 1 - k0, parent, "output", 0, n)
        return b.build(buffers)
    for a, c in _pieces(v, v + span, root, p):
        b.recv(L - 1 - k0, parent, "tmp", (a - v) * n, (c - a) * n)
    b.copy(L - k0, Chunk("tmp", 0, n), Chunk("output", 0, n))
    for k in kids:
        lo, hi = v + (1 << k), min(v + (2 << k), v + span)
        for a, c in _pieces(lo, hi, root, p):
            b.send(L - 1 - k, _real(lo, root, p), "tmp", (a - v) * n, (c - a) * n)
    return b.build(buffers, {"tmp": span * n})
