"""The vocabulary of schedules: chunks of named buffers, and the steps that move them.

A schedule is data. One rank's schedule is a sequence of rounds; every step of a round
may run concurrently. Within a round the executor runs, in this order:

1. every Copy (local, in the order given);
2. every Send and Recv, concurrently;
3. for each Recv with reduce=True, dst = op(dst, received) once that message is in.

Messages are matched by (round index, peer, order among that round's messages to the
same peer): a Send from a to b in round r pairs with the Recv on b from a in round r.
Counts are in elements of the collective's dtype, never bytes, so a schedule does not
depend on the dtype.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Chunk:
    """`count` elements of buffer `buf` starting at element `offset`."""

    buf: str
    offset: int
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.count


@dataclass(frozen=True, slots=True)
class Send:
    peer: int
    src: Chunk


@dataclass(frozen=True, slots=True)
class Recv:
    peer: int
    dst: Chunk
    reduce: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    src: Chunk
    dst: Chunk


Step = Send | Recv | Copy
Round = tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's part of a collective.

    `buffers` names the buffers the caller provides and their sizes in elements; `scratch`
    names the extra buffers the executor must allocate (zero-filled is not promised).
    Rank numbers here, `peer` included, are ranks within the group (0..size-1).
    """

    rank: int
    size: int
    rounds: tuple[Round, ...]
    buffers: dict[str, int] = field(default_factory=dict)
    scratch: dict[str, int] = field(default_factory=dict)

    def steps(self) -> Iterator[Step]:
        for rnd in self.rounds:
            yield from rnd


__all__ = ["Chunk", "Copy", "Recv", "Round", "Schedule", "Send", "Step"]
