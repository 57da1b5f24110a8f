"""Shared helpers for building schedules: block partitions and a per-round step collector."""

from __future__ import annotations

from collections import defaultdict

from ._steps import Chunk, Copy, Recv, Schedule, Send, Step


def block_offsets(count: int, parts: int) -> list[int]:
    """Offsets of `parts` near-equal consecutive blocks of `count` elements (parts+1 entries).

    The first `count % parts` blocks get one extra element, so every rank derives the same
    boundaries from (count, parts) alone and both sides of a message agree on its size.
    """
    base, extra = divmod(count, parts)
    offs = [0]
    for i in range(parts):
        offs.append(offs[-1] + base + (1 if i < extra else 0))
    return offs


def ceil_log2(n: int) -> int:
    """Smallest k with 2**k >= n (0 for n <= 1)."""
    return (n - 1).bit_length() if n > 1 else 0


def lowbit(v: int) -> int:
    return v & -v


class RoundsBuilder:
    """Collects steps by round index, then freezes them into a Schedule.

    Algorithms think in global round numbers (the matching rule pairs messages by round),
    so steps are added by index in any order and empty rounds are kept in place.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self._rounds: dict[int, list[Step]] = defaultdict(list)

    def send(self, rnd: int, peer: int, buf: str, offset: int, count: int) -> None:
        self._rounds[rnd].append(Send(peer, Chunk(buf, offset, count)))

    def recv(
        self, rnd: int, peer: int, buf: str, offset: int, count: int, reduce: bool = False
    ) -> None:
        self._rounds[rnd].append(Recv(peer, Chunk(buf, offset, count), reduce))

    def copy(self, rnd: int, src: Chunk, dst: Chunk) -> None:
        self._rounds[rnd].append(Copy(src, dst))

    def build(
        self,
        buffers: dict[str, int],
        scratch: dict[str, int] | None = None,
        *,
        prune: bool = True,
    ) -> Schedule:
        """Freeze the collected rounds.

        With `prune`, zero-count Sends/Recvs/Copies are dropped. Both sides of a message
        compute its count from the same arguments, so both drop it together and the
        matching of the remaining messages is unchanged. Empty rounds are kept (round
        indices are how messages match) except trailing ones, which carry nothing.
        Barrier passes prune=False: its messages are all zero-count on purpose.
        """
        last = max(self._rounds, default=-1)
        rounds: list[tuple[Step, ...]] = []
        for r in range(last + 1):
            steps = self._rounds.get(r, [])
            if prune:
                steps = [s for s in steps if _count(s) > 0]
            rounds.append(tuple(steps))
        while rounds and not rounds[-1]:
            rounds.pop()
        scratch = {k: v for k, v in (scratch or {}).items()}
        if prune:
            used = {c.buf for s in (x for rnd in rounds for x in rnd) for c in _chunks(s)}
            scratch = {k: v for k, v in scratch.items() if k in used}
        return Schedule(
            rank=self.rank,
            size=self.size,
            rounds=tuple(rounds),
            buffers=dict(buffers),
            scratch=scratch,
        )


def _count(step: Step) -> int:
    if isinstance(step, Send):
        return step.src.count
    if isinstance(step, Recv):
        return step.dst.count
    return step.src.count


def _chunks(step: Step) -> tuple[Chunk, ...]:
    if isinstance(step, Send):
        return (step.src,)
    if isinstance(step, Recv):
        return (step.dst,)
    return (step.src, step.dst)
