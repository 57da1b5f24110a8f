"""Pairwise all-to-all: in round s rank r sends to r+s and receives from r-s.

p-1 rounds, each rank sends and receives exactly one block per round, so no link or
receiver is oversubscribed; works for any p and uneven block sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from ._steps import Chunk, Schedule
from ._util import RoundsBuilder


def all_to_all(
    rank: int, size: int, send_counts: Sequence[int], recv_counts: Sequence[int]
) -> Schedule:
    """{"input": sum(send_counts), "output": sum(recv_counts)}; input block j goes to rank j,
    output block j comes from rank j."""
    p, r = size, rank
    soff = [0, *accumulate(send_counts)]
    roff = [0, *accumulate(recv_counts)]
    b = RoundsBuilder(r, p)
    # The own block is a local copy (build() checks send_counts[r] == recv_counts[r]).
    own = send_counts[r]
    b.copy(0, Chunk("input", soff[r], own), Chunk("output", roff[r], own))
    for s in range(1, p):
        to, frm = (r + s) % p, (r - s) % p
        b.send(s - 1, to, "input", soff[to], send_counts[to])
        b.recv(s - 1, frm, "output", roff[frm], recv_counts[frm])
    return b.build({"input": soff[-1], "output": roff[-1]})
