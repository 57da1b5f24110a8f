"""Dissemination barrier (Hensgen, Finkel and Manber, 1988).

In round k rank r signals r + 2**k and waits for r - 2**k; after ceil(lg p) rounds every
rank has transitively heard from every other, for any p. Messages carry no data.
"""

from __future__ import annotations

from ._steps import Schedule
from ._util import RoundsBuilder, ceil_log2

SCRATCH = "barrier"


def barrier(rank: int, size: int) -> Schedule:
    """No caller buffers; zero-count messages on a zero-size scratch buffer."""
    b = RoundsBuilder(rank, size)
    for k in range(ceil_log2(size)):
        d = 1 << k
        b.send(k, (rank + d) % size, SCRATCH, 0, 0)
        b.recv(k, (rank - d) % size, SCRATCH, 0, 0)
    return b.build({}, {SCRATCH: 0}, prune=False)
