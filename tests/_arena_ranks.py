"""Ranks as forked processes over one new shared-memory arena, for the arena's tests (the
Python arena's and the compiled one's)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

from pycollective.shm import arena


def run_on_new_arena(
    p: int,
    slot: int,
    target: Callable[..., None],
    extra: Callable[[int], tuple[Any, ...]] = lambda r: (),
    timeout: float = 100,
) -> dict[int, str | None]:
    """A new arena segment for `p` ranks of `slot` bytes a slot, then
    target(segment name, its size, p, rank, *extra(rank), queue) in a forked process per
    rank; each puts (rank, None or what it raised) on the queue. Returns those, by rank,
    once every rank has (within `timeout` seconds each); the segment is unlinked and no
    process is left running."""
    nbytes = arena.layout(p, slot)[2]
    seg = arena.Segment.create(nbytes)
    arena.Arena(seg, p, 0, slot).init_header()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(seg.name, nbytes, p, r, *extra(r), out)) for r in range(p)
    ]
    try:
        for proc in procs:
            proc.start()
        return dict(out.get(timeout=timeout) for _ in range(p))
    finally:
        seg.unlink()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
