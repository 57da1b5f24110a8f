"""build()'s argument checks and the shape of what it returns."""

from __future__ import annotations

import pytest

from pycollective.schedule import ALGORITHMS, Copy, Recv, Send, build, build_all
from pycollective.schedule.chain import DEFAULT_SEGMENTS


def test_algorithm_table() -> None:
    assert ALGORITHMS == {
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
    assert all("auto" not in algs for algs in ALGORITHMS.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"collective": "allreduce"}, "unknown collective 'allreduce'"),
        ({"algorithm": "auto"}, "unknown algorithm 'auto' for all_reduce"),
        ({"rank": 4}, "rank 4 out of range for size 4"),
        ({"rank": -1}, "rank -1 out of range"),
        ({"size": 0, "rank": 0}, "size must be >= 1"),
        ({"count": -1}, "count must be >= 0"),
        ({"root": 4}, "root 4 out of range"),
        ({"segment": -2}, "segment must be >= 0"),
        ({"count": 2.0}, "count must be an int"),
        ({"rank": True}, "rank must be an int"),
        ({"send_counts": [1, 1, 1, 1]}, "all_to_all only"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"collective": "all_reduce", "algorithm": "ring", "rank": 0, "size": 4, "count": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build(**args)


def test_bad_all_to_all_counts() -> None:
    with pytest.raises(ValueError, match="3 entries, expected one per rank"):
        build("all_to_all", "pairwise", 0, 4, 1, send_counts=[1, 1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        build("all_to_all", "pairwise", 0, 2, 1, recv_counts=[1, -1])
    with pytest.raises(ValueError, match="same size both ways"):
        build("all_to_all", "pairwise", 1, 2, 1, send_counts=[1, 2], recv_counts=[1, 3])


def test_buffer_conventions() -> None:
    p, n = 4, 5
    assert build("all_reduce", "ring", 1, p, n).buffers == {"data": n}
    assert build("reduce", "tree", 1, p, n, root=2).buffers == {"data": n}
    assert build("all_gather", "bruck", 1, p, n).buffers == {"input": n, "output": p * n}
    assert build("reduce_scatter", "ring", 1, p, n).buffers == {"input": p * n, "output": n}
    assert build("gather", "tree", 2, p, n, root=2).buffers == {"input": n, "output": p * n}
    assert build("gather", "tree", 1, p, n, root=2).buffers == {"input": n}
    assert build("scatter", "linear", 2, p, n, root=2).buffers == {"input": p * n, "output": n}
    assert build("scatter", "linear", 1, p, n, root=2).buffers == {"output": n}
    s = build("all_to_all", "pairwise", 1, 3, 0, send_counts=[1, 2, 3], recv_counts=[4, 2, 6])
    assert s.buffers == {"input": 6, "output": 12}
    assert build("barrier", "dissemination", 0, p, 0).buffers == {}


def test_keyword_call_and_types() -> None:
    s = build(collective="broadcast", algorithm="chain", rank=0, size=3, count=16, segment=4)
    assert (s.rank, s.size) == (0, 3)
    assert all(isinstance(step, Send | Recv | Copy) for step in s.steps())
    assert sum(isinstance(step, Send) for step in s.steps()) == 4  # 16 / 4 segments


def test_chain_default_segments() -> None:
    for n in (0, 1, 7, 8, 9, 1000, 1001):
        sends = [x for x in build("broadcast", "chain", 0, 3, n).steps() if isinstance(x, Send)]
        assert sum(x.src.count for x in sends) == n
        assert len(sends) <= DEFAULT_SEGMENTS
        assert len(sends) == min(n, DEFAULT_SEGMENTS) or n == 9  # 9 -> 5 segments of <= 2
        assert all(x.src.count >= 1 for x in sends)


def test_chain_rounds_pipeline() -> None:
    # Segment s crosses hop h in round s + h: S + p - 2 rounds in all.
    p, n, seg = 5, 12, 3
    scheds = build_all("broadcast", "chain", p, n, root=2, segment=seg)
    assert max(len(s.rounds) for s in scheds) == n // seg + p - 2
    hop1 = scheds[3]  # virtual rank 1
    for t, rnd in enumerate(hop1.rounds):
        for step in rnd:
            if isinstance(step, Send):
                assert step.src.offset // seg == t - 1
