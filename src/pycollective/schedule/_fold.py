"""Folding a non-power-of-two world onto a power-of-two core (the usual MPICH approach).

With p ranks and p2 the largest power of two <= p, rem = p - p2. The first 2*rem ranks
pair up (2i, 2i+1): the even one hands its data to the odd one and sits out the core, so
the core has exactly p2 members. Core rank v maps back to real rank 2v+1 for v < rem and
v + rem otherwise, which keeps the core ordered by real rank (needed when core ranks own
contiguous ranges of real ranks' blocks, as in recursive-halving reduce-scatter).
"""

from __future__ import annotations


def core_size(size: int) -> int:
    """Largest power of two <= size."""
    return 1 << (size.bit_length() - 1)


def extras(size: int) -> int:
    """How many ranks sit out the core (= how many pairs fold)."""
    return size - core_size(size)


def core_rank(rank: int, size: int) -> int | None:
    """The core rank of `rank`, or None if it sits out."""
    rem = extras(size)
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else None
    return rank - rem


def real_rank(vrank: int, size: int) -> int:
    """The real rank of core rank `vrank`."""
    rem = extras(size)
    return 2 * vrank + 1 if vrank < rem else vrank + rem


def fold_partner(rank: int, size: int) -> int | None:
    """For a rank inside the first 2*rem, the other member of its pair; else None."""
    if rank < 2 * extras(size):
        return rank ^ 1
    return None


def real_ranks_of(vrank: int, size: int) -> range:
    """The real ranks a core rank stands for (two for folded pairs, else one), contiguous."""
    rem = extras(size)
    if vrank < rem:
        return range(2 * vrank, 2 * vrank + 2)
    return range(vrank + rem, vrank + rem + 1)
