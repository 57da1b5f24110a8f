"""Bytes on the wire against the known formulas, message matching, and hazard checks."""

from __future__ import annotations

import numpy as np
import pytest
from sched_helpers import PAIRS, SIZES, counts_for

from pycollective.schedule import Chunk, Recv, Schedule, Send, build, build_all
from pycollective.schedule._util import block_offsets
from pycollective.schedule.simulate import (
    ScheduleError,
    check_hazards,
    check_matching,
    simulate,
    wire_bytes,
)


def is_pow2(p: int) -> bool:
    return p & (p - 1) == 0


@pytest.mark.parametrize("p", SIZES)
def test_every_send_has_its_recv(p: int) -> None:
    for collective, algorithm in PAIRS:
        for n in counts_for(p):
            for root in sorted({0, p // 2, p - 1}):
                scheds = build_all(collective, algorithm, p, n, root)
                check_matching(scheds)
                for s in scheds:
                    check_hazards(s)


@pytest.mark.parametrize("p", SIZES)
def test_ring_all_reduce_bytes(p: int) -> None:
    for n in counts_for(p):
        w = wire_bytes(build_all("all_reduce", "ring", p, n), 4)
        offs = block_offsets(n, p)
        size = [offs[i + 1] - offs[i] for i in range(p)]
        for r in range(p):
            # Every block but r+1 in reduce-scatter, every block but r+2 in all-gather.
            exact = 0 if p == 1 else 2 * n - size[(r + 1) % p] - size[(r + 2) % p]
            assert w.sent[r] == 4 * exact
            assert abs(w.sent[r] / 4 - 2 * (p - 1) / p * n) <= 2
            assert w.received[r] == w.sent[r] if n % p == 0 else True


@pytest.mark.parametrize("p", SIZES)
def test_recursive_doubling_bytes(p: int) -> None:
    n = 1000 + p
    w = wire_bytes(build_all("all_reduce", "recursive_doubling", p, n), 1)
    p2 = 1 << (p.bit_length() - 1)
    lg = p2.bit_length() - 1
    if is_pow2(p):
        assert w.sent == (lg * n,) * p
    # Core ranks exchange lg p2 full buffers; each folded pair adds two more messages.
    assert w.total == p2 * lg * n + 2 * (p - p2) * n


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16])
def test_halving_doubling_bytes_power_of_two(p: int) -> None:
    n = 16 * 5
    w = wire_bytes(build_all("all_reduce", "halving_doubling", p, n), 1)
    assert w.sent == (2 * (p - 1) * n // p,) * p


@pytest.mark.parametrize("p", SIZES)
def test_naive_bytes_into_rank_zero(p: int) -> None:
    n = 1000 + p
    w = wire_bytes(build_all("all_reduce", "naive", p, n), 1)
    assert w.received[0] == (p - 1) * n
    assert w.sent[0] == (p - 1) * n
    assert all(w.sent[r] == n and w.received[r] == n for r in range(1, p))


@pytest.mark.parametrize("p", SIZES)
def test_gather_family_bytes(p: int) -> None:
    n = 3
    for collective, algorithm in PAIRS:
        if collective in ("all_gather", "reduce_scatter", "all_to_all"):
            w = wire_bytes(build_all(collective, algorithm, p, n), 1)
            if collective != "reduce_scatter" or algorithm == "ring" or is_pow2(p):
                assert w.sent == ((p - 1) * n,) * p, (collective, algorithm)
        elif collective in ("broadcast", "gather", "scatter"):
            for root in range(p):
                w = wire_bytes(build_all(collective, algorithm, p, n, root), 1)
                if collective == "broadcast":
                    assert w.total == (p - 1) * n
                elif collective == "gather":
                    assert w.received[root] == (p - 1) * n
                else:
                    assert w.sent[root] == (p - 1) * n


@pytest.mark.parametrize("p", SIZES)
def test_barrier_messages(p: int) -> None:
    scheds = build_all("barrier", "dissemination", p, 0)
    assert wire_bytes(scheds, 8).total == 0
    lg = (p - 1).bit_length()
    for s in scheds:
        assert len(s.rounds) == lg
        assert sum(isinstance(x, Send) for x in s.steps()) == lg
        assert s.buffers == {}


def test_check_matching_reports_missing_recv() -> None:
    a = Schedule(0, 2, ((Send(1, Chunk("data", 0, 4)),),), {"data": 4})
    b = Schedule(1, 2, ((),), {"data": 4})
    with pytest.raises(ScheduleError, match=r"round 0: rank 0 sends 1 message\(s\) to rank 1"):
        check_matching([a, b])


def test_check_matching_reports_count_mismatch() -> None:
    a = Schedule(0, 2, ((Send(1, Chunk("data", 0, 4)),),), {"data": 4})
    b = Schedule(1, 2, ((Recv(0, Chunk("data", 0, 3)),),), {"data": 4})
    with pytest.raises(ScheduleError, match=r"counts \[4\].*counts \[3\]"):
        check_matching([a, b])


def test_check_matching_rejects_round_shift_and_self_messages() -> None:
    a = Schedule(0, 2, ((Send(1, Chunk("d", 0, 1)),),), {"d": 1})
    b = Schedule(1, 2, ((), (Recv(0, Chunk("d", 0, 1)),)), {"d": 1})
    with pytest.raises(ScheduleError, match="round 0"):
        check_matching([a, b])
    c = Schedule(0, 1, ((Send(0, Chunk("d", 0, 1)),),), {"d": 1})
    with pytest.raises(ScheduleError, match="peer 0"):
        check_matching([c])


def test_inconsistent_all_to_all_counts_detected() -> None:
    send = [[1, 2], [3, 4]]
    bad_recv = [[1, 3], [2, 5]]  # rank 1 expects 5 from itself but sends 4: caught by build
    with pytest.raises(ValueError):
        simulate("all_to_all", "pairwise", [{}, {}], send_counts=send, recv_counts=bad_recv)
    bad_recv = [[1, 9], [2, 4]]  # rank 0 expects 9 from rank 1, which sends 3
    with pytest.raises(ScheduleError, match="rank 1 sends 1 message"):
        simulate("all_to_all", "pairwise", [{}, {}], send_counts=send, recv_counts=bad_recv)


def test_check_hazards() -> None:
    out_of_range = Schedule(0, 2, ((Recv(1, Chunk("d", 2, 3)),),), {"d": 4})
    with pytest.raises(ScheduleError, match="outside"):
        check_hazards(out_of_range)
    overlap = Schedule(0, 3, ((Recv(1, Chunk("d", 0, 2)), Recv(2, Chunk("d", 1, 2))),), {"d": 4})
    with pytest.raises(ScheduleError, match="overlap"):
        check_hazards(overlap)
    unknown = Schedule(0, 2, ((Send(1, Chunk("x", 0, 1)),),), {"d": 4})
    with pytest.raises(ScheduleError, match="no buffer"):
        check_hazards(unknown)


def test_scratch_never_clashes_with_buffers() -> None:
    for collective, algorithm in PAIRS:
        for p in (1, 3, 4, 7):
            for r in range(p):
                s = build(collective, algorithm, r, p, p + 1, root=p - 1)
                assert not set(s.buffers) & set(s.scratch)


def test_zero_count_sends_nothing() -> None:
    for collective, algorithm in PAIRS:
        if collective == "barrier":
            continue
        for p in (1, 2, 5, 16):
            scheds = build_all(collective, algorithm, p, 0)
            assert all(s.rounds == () for s in scheds), (collective, algorithm, p)
            out = simulate(collective, algorithm, [{} for _ in range(p)], count=0)
            assert all(v.size == 0 for d in out for v in d.values())


def test_simulate_does_not_modify_inputs() -> None:
    xs = [np.arange(10) * (r + 1) for r in range(4)]
    copies = [x.copy() for x in xs]
    simulate("all_reduce", "ring", [{"data": x} for x in xs])
    for x, c in zip(xs, copies, strict=True):
        np.testing.assert_array_equal(x, c)
