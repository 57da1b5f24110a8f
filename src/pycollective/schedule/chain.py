"""Pipelined chain broadcast: root -> root+1 -> ... -> root+p-1.

The data is cut into segments; segment s crosses hop h (virtual rank h to h+1) in round
s+h, so every link is busy at once once the pipe is full: S+p-2 rounds for S segments,
about n*beta + (p-2)*segment*beta in time instead of lg p * n*beta for a tree.
"""

from __future__ import annotations

from ._steps import Schedule
from ._util import RoundsBuilder

DEFAULT_SEGMENTS = 8


def default_segment(count: int) -> int:
    """About DEFAULT_SEGMENTS segments, at least one element each."""
    return max(1, -(-count // DEFAULT_SEGMENTS))


def broadcast(rank: int, size: int, count: int, root: int, segment: int = 0) -> Schedule:
    """{"data": n}; `segment` elements per message (0 = default_segment(count))."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    seg = segment if segment > 0 else default_segment(n)
    nseg = -(-n // seg)
    v = (rank - root) % p
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    for s in range(nseg):
        off = s * seg
        cnt = min(seg, n - off)
        if v > 0:
            b.recv(s + v - 1, prv, "data", off, cnt)
        if v < p - 1:
            b.send(s + v, nxt, "data", off, cnt)
    return b.build({"data": n})
