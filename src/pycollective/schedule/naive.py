"""Naive all-reduce, the parameter-server-like baseline.

Every rank sends its whole buffer to rank 0, which reduces and sends the one result back:
two rounds, but rank 0's link carries (p-1)*n each way. Here to be beaten.
"""

from __future__ import annotations

from ._steps import Schedule
from ._util import RoundsBuilder


def all_reduce(rank: int, size: int, count: int) -> Schedule:
    """{"data": n}. Rank 0 reduces all p-1 messages in round 0: the simulator applies them
    in step order (rank 1, 2, ...), an executor may apply them as they arrive. Either way
    the sum is formed on rank 0 alone and copied out, so all ranks agree bitwise."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    if rank:
        b.send(0, 0, "data", 0, n)
        b.recv(1, 0, "data", 0, n)
    else:
        for peer in range(1, p):
            b.recv(0, peer, "data", 0, n, reduce=True)
            b.send(1, peer, "data", 0, n)
    return b.build({"data": n})
