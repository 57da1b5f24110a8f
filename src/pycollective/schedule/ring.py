"""Ring algorithms: all-reduce (reduce-scatter then all-gather), all-gather, reduce-scatter.

Rank r sends to r+1 and receives from r-1 every round, one block at a time, so each link
carries (p-1)/p of the data per phase and no rank ever holds more than one extra block.
"""

from __future__ import annotations

from ._steps import Chunk, Schedule
from ._util import RoundsBuilder, block_offsets


def all_reduce(rank: int, size: int, count: int) -> Schedule:
    """{"data": n}. After the reduce-scatter phase rank r owns the finished block r+1; the
    all-gather phase only copies finished blocks, so every rank ends bitwise identical."""
    p, r = size, rank
    b = RoundsBuilder(r, p)
    offs = block_offsets(count, p)
    nxt, prv = (r + 1) % p, (r - 1) % p

    def blk(i: int) -> tuple[int, int]:
        i %= p
        return offs[i], offs[i + 1] - offs[i]

    for s in range(p - 1):
        b.send(s, nxt, "data", *blk(r - s))
        b.recv(s, prv, "data", *blk(r - s - 1), reduce=True)
    for s in range(p - 1):
        t = p - 1 + s
        b.send(t, nxt, "data", *blk(r + 1 - s))
        b.recv(t, prv, "data", *blk(r - s))
    return b.build({"data": count})


def all_gather(rank: int, size: int, count: int) -> Schedule:
    """{"input": n, "output": p*n}; block i of output is rank i's input."""
    p, r, n = size, rank, count
    b = RoundsBuilder(r, p)
    nxt, prv = (r + 1) % p, (r - 1) % p
    b.copy(0, Chunk("input", 0, n), Chunk("output", r * n, n))
    for s in range(p - 1):
        b.send(s, nxt, "output", ((r - s) % p) * n, n)
        b.recv(s, prv, "output", ((r - s - 1) % p) * n, n)
    return b.build({"input": n, "output": p * n})


def reduce_scatter(rank: int, size: int, count: int) -> Schedule:
    """{"input": p*n, "output": n}; input is read only.

    At step s rank r forwards the partial sum of block r-s-1 and folds its own input for
    block r-s-2 into what arrives, so the partial for block r completes on rank r at step
    p-2. Two scratch slots alternate: one is being sent while the next is being filled.
    """
    p, r, n = size, rank, count
    b = RoundsBuilder(r, p)
    nxt, prv = (r + 1) % p, (r - 1) % p
    if p == 1:
        b.copy(0, Chunk("input", 0, n), Chunk("output", 0, n))
        return b.build({"input": n, "output": n})

    def slot(s: int) -> str:
        return "output" if s == p - 2 else "acc"

    def slot_off(s: int) -> int:
        return 0 if s == p - 2 else (s % 2) * n

    for s in range(p - 1):
        if s == 0:
            b.send(0, nxt, "input", ((r - 1) % p) * n, n)
        else:
            b.send(s, nxt, slot(s - 1), slot_off(s - 1), n)
        blk = (r - s - 2) % p
        b.copy(s, Chunk("input", blk * n, n), Chunk(slot(s), slot_off(s), n))
        b.recv(s, prv, slot(s), slot_off(s), n, reduce=True)
    return b.build({"input": p * n, "output": n}, {"acc": 2 * n})
