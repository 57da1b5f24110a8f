"""Recursive-doubling all-reduce: lg p rounds, each exchanging the whole buffer.

Partners combine the same two operands (op is commutative), so both hold bitwise equal
values after every round. Non-powers of two fold the extra ranks in first and hand them
the result at the end (see _fold).
"""

from __future__ import annotations

from . import _fold
from ._steps import Schedule
from ._util import RoundsBuilder


def all_reduce(rank: int, size: int, count: int) -> Schedule:
    """{"data": n}; result in data on every rank."""
    p, n = size, count
    b = RoundsBuilder(rank, p)
    p2, rem = _fold.core_size(p), _fold.extras(p)
    lg = p2.bit_length() - 1
    v = _fold.core_rank(rank, p)
    partner = _fold.fold_partner(rank, p)
    first = 1 if rem else 0
    if v is None:
        # Sitting out: contribute, then wait for the answer.
        assert partner is not None
        b.send(0, partner, "data", 0, n)
        b.recv(first + lg, partner, "data", 0, n)
        return b.build({"data": n})
    if partner is not None:
        b.recv(0, partner, "data", 0, n, reduce=True)
    for k in range(lg):
        peer = _fold.real_rank(v ^ (1 << k), p)
        b.send(first + k, peer, "data", 0, n)
        b.recv(first + k, peer, "data", 0, n, reduce=True)
    if partner is not None:
        b.send(first + lg, partner, "data", 0, n)
    return b.build({"data": n})
