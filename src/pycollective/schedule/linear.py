"""Linear gather and scatter: the root talks to every other rank in one round.

One alpha, but the root's link carries (p-1)*n: good for small messages and small p.
"""

from __future__ import annotations

from ._steps import Chunk, Schedule
from ._util import RoundsBuilder


def gather(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"input": n, "output": p*n} on root, {"input": n} elsewhere."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    if rank != root:
        b.send(0, root, "input", 0, n)
        return b.build({"input": n})
    b.copy(0, Chunk("input", 0, n), Chunk("output", root * n, n))
    for peer in range(p):
        if peer != root:
            b.recv(0, peer, "output", peer * n, n)
    return b.build({"input": n, "output": p * n})


def scatter(rank: int, size: int, count: int, root: int) -> Schedule:
    """{"input": p*n, "output": n} on root, {"output": n} elsewhere."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    if rank != root:
        b.recv(0, root, "output", 0, n)
        return b.build({"output": n})
    b.copy(0, Chunk("input", root * n, n), Chunk("output", 0, n))
    for peer in range(p):
        if peer != root:
            b.send(0, peer, "input", peer * n, n)
    return b.build({"input": p * n, "output": n})
