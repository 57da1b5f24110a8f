"""ALGORITHMS and build(): which builder makes which collective's schedule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import (
    bruck,
    chain,
    dissemination,
    halving_doubling,
    linear,
    naive,
    pairwise,
    recursive_doubling,
    ring,
    tree,
)
from ._steps import Schedule

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "recursive_doubling", "halving_doubling", "tree", "naive"),
    "broadcast": ("tree", "chain"),
    "reduce": ("tree",),
    "all_gather": ("ring", "bruck"),
    "reduce_scatter": ("ring", "recursive_halving"),
    "gather": ("linear", "tree"),
    "scatter": ("linear", "tree"),
    "all_to_all": ("pairwise",),
    "barrier": ("dissemination",),
}

ROOTED: frozenset[str] = frozenset({"broadcast", "reduce", "gather", "scatter"})

# (rank, size, count, root, segment, send_counts, recv_counts) -> Schedule
_Builder = Callable[[int, int, int, int, int, tuple[int, ...], tuple[int, ...]], Schedule]

_BUILDERS: dict[tuple[str, str], _Builder] = {
    ("all_reduce", "ring"): lambda r, p, n, *_: ring.all_reduce(r, p, n),
    ("all_reduce", "recursive_doubling"): lambda r, p, n, *_: recursive_doubling.all_reduce(
        r, p, n
    ),
    ("all_reduce", "halving_doubling"): lambda r, p, n, *_: halving_doubling.all_reduce(r, p, n),
    ("all_reduce", "tree"): lambda r, p, n, *_: tree.all_reduce(r, p, n),
    ("all_reduce", "naive"): lambda r, p, n, *_: naive.all_reduce(r, p, n),
    ("broadcast", "tree"): lambda r, p, n, root, *_: tree.broadcast(r, p, n, root),
    ("broadcast", "chain"): lambda r, p, n, root, seg, *_: chain.broadcast(r, p, n, root, seg),
    ("reduce", "tree"): lambda r, p, n, root, *_: tree.reduce(r, p, n, root),
    ("all_gather", "ring"): lambda r, p, n, *_: ring.all_gather(r, p, n),
    ("all_gather", "bruck"): lambda r, p, n, *_: bruck.all_gather(r, p, n),
    ("reduce_scatter", "ring"): lambda r, p, n, *_: ring.reduce_scatter(r, p, n),
    ("reduce_scatter", "recursive_halving"): lambda r, p, n, *_: halving_doubling.reduce_scatter(
        r, p, n
    ),
    ("gather", "linear"): lambda r, p, n, root, *_: linear.gather(r, p, n, root),
    ("gather", "tree"): lambda r, p, n, root, *_: tree.gather(r, p, n, root),
    ("scatter", "linear"): lambda r, p, n, root, *_: linear.scatter(r, p, n, root),
    ("scatter", "tree"): lambda r, p, n, root, *_: tree.scatter(r, p, n, root),
    ("all_to_all", "pairwise"): lambda r, p, n, root, seg, sc, rc: pairwise.all_to_all(
        r, p, sc, rc
    ),
    ("barrier", "dissemination"): lambda r, p, *_: dissemination.barrier(r, p),
}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_counts(
    name: str, counts: Sequence[int] | None, size: int, count: int
) -> tuple[int, ...]:
    if counts is None:
        return (count,) * size
    out = tuple(counts)
    if len(out) != size:
        raise ValueError(f"{name} has {len(out)} entries, expected one per rank ({size})")
    bad = [c for c in out if not _is_int(c) or c < 0]
    if bad:
        raise ValueError(f"{name} must be non-negative ints, got {bad[0]!r}")
    return out


def build(
    collective: str,
    algorithm: str,
    rank: int,
    size: int,
    count: int,
    root: int = 0,
    segment: int = 0,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
) -> Schedule:
    """One rank's schedule for `collective` by `algorithm` in a group of `size`.

    `count` is elements per rank (the per-block count for all_gather, reduce_scatter,
    gather, scatter and all_to_all); `root` matters for rooted collectives only;
    `segment` (elements, 0 = default) for chain broadcast only; send_counts/recv_counts
    (one entry per rank) for all_to_all only, each defaulting to `count` per block.
    Raises ValueError naming the bad argument.
    """
    if collective not in ALGORITHMS:
        raise ValueError(
            f"unknown collective {collective!r}; known: {', '.join(sorted(ALGORITHMS))}"
        )
    if algorithm not in ALGORITHMS[collective]:
        raise ValueError(
            f"unknown algorithm {algorithm!r} for {collective}; "
            f"known: {', '.join(ALGORITHMS[collective])}"
        )
    for name, val in (
        ("size", size),
        ("rank", rank),
        ("count", count),
        ("root", root),
        ("segment", segment),
    ):
        if not _is_int(val):
            raise ValueError(f"{name} must be an int, got {val!r}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} out of range for size {size}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0 <= root < size:
        raise ValueError(f"root {root} out of range for size {size}")
    if segment < 0:
        raise ValueError(f"segment must be >= 0, got {segment}")
    if collective != "all_to_all" and (send_counts is not None or recv_counts is not None):
        raise ValueError("send_counts/recv_counts apply to all_to_all only")
    sc = _check_counts("send_counts", send_counts, size, count)
    rc = _check_counts("recv_counts", recv_counts, size, count)
    if sc[rank] != rc[rank]:
        raise ValueError(
            f"send_counts[{rank}]={sc[rank]} != recv_counts[{rank}]={rc[rank]}: "
            "a rank's block to itself must be the same size both ways"
        )
    return _BUILDERS[collective, algorithm](rank, size, count, root, segment, sc, rc)


def build_all(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    root: int = 0,
    segment: int = 0,
    send_counts: Sequence[Sequence[int]] | None = None,
    recv_counts: Sequence[Sequence[int]] | None = None,
) -> list[Schedule]:
    """Every rank's schedule. For all_to_all, send_counts/recv_counts are per rank."""
    if not _is_int(size) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    for name, per_rank in (("send_counts", send_counts), ("recv_counts", recv_counts)):
        if per_rank is not None and len(per_rank) != size:
            raise ValueError(f"{name} needs one list per rank ({size}), got {len(per_rank)}")
    return [
        build(
            collective,
            algorithm,
            r,
            size,
            count,
            root,
            segment,
            None if send_counts is None else send_counts[r],
            None if recv_counts is None else recv_counts[r],
        )
        for r in range(size)
    ]
