"""Bruck all-gather: ceil(lg p) rounds for any p, (p-1)*n elements sent per rank.

In round k rank r sends the blocks of ranks r .. r+m-1 (mod p), m = min(2**k, p - 2**k),
to r - 2**k and receives those of r + 2**k .. from r + 2**k. Working directly in the
output (block i = rank i) instead of a rotated buffer saves the final rotation; a range
that wraps past rank p-1 goes as two messages, split at the same block on both ends.
"""

from __future__ import annotations

from ._steps import Chunk, Schedule
from ._util import RoundsBuilder, ceil_log2


def _wrapped(start: int, m: int, size: int) -> list[tuple[int, int]]:
    """Blocks start .. start+m-1 (mod size) as at most two (first_block, nblocks) runs."""
    start %= size
    head = min(m, size - start)
    runs = [(start, head)]
    if m > head:
        runs.append((0, m - head))
    return runs


def all_gather(rank: int, size: int, count: int) -> Schedule:
    """{"input": n, "output": p*n}; block i of output is rank i's input."""
    p, r, n = size, rank, count
    b = RoundsBuilder(r, p)
    b.copy(0, Chunk("input", 0, n), Chunk("output", r * n, n))
    for k in range(ceil_log2(p)):
        d = 1 << k
        m = min(d, p - d)
        for blk, nb in _wrapped(r, m, p):
            b.send(k, (r - d) % p, "output", blk * n, nb * n)
        for blk, nb in _wrapped(r + d, m, p):
            b.recv(k, (r + d) % p, "output", blk * n, nb * n)
    return b.build({"input": n, "output": p * n})
