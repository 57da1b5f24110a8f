"""The alpha-beta-gamma model: schedule costs against the closed forms (docs/cost_model.md,
cost.formula), the selector's choices, and the large-world fast paths."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from sched_helpers import PAIRS, SIZES

from pycollective.schedule import ALGORITHMS, build_all
from pycollective.schedule.cost import (
    CostParams,
    formula,
    predict,
    price,
    price_work,
    profile,
    schedule_cost,
    select,
    work,
)

PARAMS = [
    CostParams(alpha=1.0, beta=0.0, gamma=0.0),
    CostParams(alpha=0.0, beta=1.0, gamma=0.0),
    CostParams(alpha=0.0, beta=0.0, gamma=1.0),
    CostParams(alpha=5e-6, beta=1e-9, gamma=2e-10),
]
WITH_OVERHEAD = CostParams(alpha=5e-6, beta=1e-9, gamma=2e-10, overhead=1e-6)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
def test_schedule_cost_matches_formula(algorithm: str, p: int) -> None:
    p2 = 1 << (p.bit_length() - 1)
    n = p * p2 * 3  # splits evenly into p blocks and into p2 blocks
    itemsize = 4
    scheds = build_all("all_reduce", algorithm, p, n)
    for params in PARAMS:
        got = schedule_cost(scheds, itemsize, params)
        want = formula("all_reduce", algorithm, p, n * itemsize, params)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), params
        assert predict("all_reduce", algorithm, p, n, itemsize, params) == pytest.approx(got)


def test_ring_is_bandwidth_optimal_rd_latency_optimal() -> None:
    bw = CostParams(alpha=1e-9, beta=1e-9, gamma=0.0)
    lat = CostParams(alpha=1e-3, beta=1e-12, gamma=0.0)
    assert select("all_reduce", 8, 1 << 24, 4, bw) in ("ring", "halving_doubling")
    assert select("all_reduce", 7, 1 << 24, 4, bw) == "ring"
    # One alpha per round whatever the number of peers: naive's 2 rounds win tiny messages
    # unless each extra message costs something.
    assert select("all_reduce", 16, 4, 4, lat) == "naive"
    lat_o = CostParams(alpha=1e-3, beta=1e-12, gamma=0.0, overhead=1e-3)
    assert select("all_reduce", 16, 4, 4, lat_o) == "recursive_doubling"
    assert select("gather", 16, 4, 4, lat_o) == "tree"
    assert select("gather", 16, 4, 4, lat) == "linear"
    assert select("broadcast", 32, 1 << 24, 4, bw) == "chain"
    assert select("broadcast", 32, 1, 4, lat) == "tree"


def test_select_ties_and_candidates() -> None:
    zero = CostParams(0.0, 0.0, 0.0)
    for collective, algs in ALGORITHMS.items():
        assert select(collective, 5, 10, 4, zero) == algs[0]
    lat = CostParams(alpha=1.0, beta=0.0, gamma=0.0)
    assert select("all_reduce", 8, 100, 4, lat, candidates=["ring", "naive"]) == "naive"
    with pytest.raises(ValueError, match="unknown algorithm"):
        select("all_reduce", 8, 100, 4, lat, candidates=["bogus"])
    with pytest.raises(ValueError, match="unknown collective"):
        select("bogus", 8, 100, 4, lat)


def test_predict_does_not_depend_on_root() -> None:
    params = PARAMS[3]
    for collective, algorithm in PAIRS:
        for p in (5, 8):
            by_root = {
                schedule_cost(build_all(collective, algorithm, p, 37, root), 4, params)
                for root in range(p)
            }
            assert len(by_root) == 1, (collective, algorithm)
            assert predict(collective, algorithm, p, 37, 4, params, root=p - 1) == by_root.pop()


@pytest.mark.parametrize("p", [17, 24, 33, 40])
def test_large_world_profile_equals_full(p: int) -> None:
    """Above EXACT_LIMIT predict() uses closed forms, rank 0 or a rank sample: check them
    against every rank at sizes where both are cheap."""
    for collective, algorithm in PAIRS:
        for n in (0, 1, p - 1, p + 1, 7 * p + 3):
            for root in (0, p // 3) if collective in ("broadcast", "gather") else (0,):
                fast = profile(collective, algorithm, p, n, root, 0, 0)
                full = profile(collective, algorithm, p, n, root, 0, 10**6)
                assert fast == full, (collective, algorithm, n, root)


def test_predict_at_4096_ranks_is_quick() -> None:
    params = PARAMS[3]
    t0 = time.perf_counter()
    costs = {
        a: predict("all_reduce", a, 4096, 1 << 20, 4, params) for a in ALGORITHMS["all_reduce"]
    }
    assert time.perf_counter() - t0 < 10
    assert costs["ring"] == pytest.approx(formula("all_reduce", "ring", 4096, 4 << 20, params))
    assert costs["halving_doubling"] < costs["recursive_doubling"] < costs["naive"]


def test_overhead_counts_extra_messages() -> None:
    plain = CostParams(1.0, 0.0, 0.0)
    per_msg = CostParams(1.0, 0.0, 0.0, overhead=0.5)
    for p in (2, 5, 9):
        naive = build_all("all_reduce", "naive", p, 10)
        # Rank 0 receives p-1 messages in round 0 and sends p-1 in round 1.
        assert schedule_cost(naive, 4, per_msg) == schedule_cost(naive, 4, plain) + (p - 2)
        ring = build_all("all_reduce", "ring", p, 10 * p)
        assert schedule_cost(ring, 4, per_msg) == schedule_cost(ring, 4, plain)
    assert predict("gather", "linear", 9, 3, 4, WITH_OVERHEAD) > predict(
        "gather", "linear", 9, 3, 4, CostParams(5e-6, 1e-9, 2e-10)
    )


def test_cost_params_validated() -> None:
    with pytest.raises(ValueError, match="alpha"):
        CostParams(-1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="gamma"):
        CostParams(0.0, 0.0, float("nan"))
    with pytest.raises(ValueError, match="no closed form"):
        formula("broadcast", "tree", 4, 100, PARAMS[0])


# ------------------------------------------------------------ more ranks than cores

CPU = CostParams(
    alpha=200e-6, beta=0.6e-9, gamma=0.12e-9, overhead=100e-6,
    msg_cpu=170e-6, byte_cpu=1.5e-9, call_cpu=1e-3,
)  # fmt: skip


def test_one_rank_per_core_prices_lockstep_only() -> None:
    flat = CostParams(200e-6, 0.6e-9, 0.12e-9, 100e-6)
    for collective, algorithm in PAIRS:
        for p in (2, 5, 8):
            a = predict(collective, algorithm, p, 1000, 4, CPU)
            assert a == predict(collective, algorithm, p, 1000, 4, flat), (collective, algorithm)


def test_work_counts_every_message_end() -> None:
    # Tree all-reduce at 4 ranks: 3 messages up, 3 down; each has two ends.
    n = 1000
    msgs, elems, red = work("all_reduce", "tree", 4, n)
    assert msgs == pytest.approx(2 * 2 * 3 / 4)
    assert elems == pytest.approx(2 * 2 * 3 * n / 4)
    assert red == pytest.approx(3 * n / 4)  # p - 1 blocks of n are added, over 4 ranks
    msgs, elems, red = work("all_reduce", "ring", 4, 4 * n)
    assert msgs == 4 * 3 and elems == 4 * 3 * n and red == 3 * n


def test_oversubscribed_call_is_the_larger_of_lockstep_and_work() -> None:
    k = replace(CPU, ranks_per_core=2.0)
    for algorithm in ALGORITHMS["all_reduce"]:
        lock = price(profile("all_reduce", algorithm, 4, 4096), 4, k)
        cpu = price_work(work("all_reduce", algorithm, 4, 4096), 4, k)
        assert predict("all_reduce", algorithm, 4, 4096, 4, k) == pytest.approx(max(lock, cpu))
        w = work("all_reduce", algorithm, 4, 4096)
        per_rank = k.call_cpu + k.msg_cpu * w[0] + (k.byte_cpu * w[1] + k.gamma * w[2]) * 4
        assert cpu == pytest.approx(2.0 * per_rank)


def test_oversubscription_lets_tree_win_small_all_reduce() -> None:
    """The known gap: with lockstep pricing alone tree never wins all_reduce at 4 ranks;
    with 4 and 8 ranks on 2 cores it does for small and medium messages (as measured)."""
    for p in (4, 8):
        for count in (64, 256, 16384, 65536):
            assert select("all_reduce", p, count, 4, CPU) != "tree"
            shared = replace(CPU, ranks_per_core=p / 2)
            assert select("all_reduce", p, count, 4, shared) == "tree", (p, count)
        # Large messages: bytes decide; the algorithms moving 2n per rank or more lose.
        big = replace(CPU, ranks_per_core=p / 2)
        assert select("all_reduce", p, 1 << 22, 4, big) not in ("recursive_doubling", "naive")
    # One element: ring does the work of tree (most blocks are empty), but its element
    # goes round the ring hop by hop: the shorter critical path wins the tie.
    one = replace(CPU, ranks_per_core=4.0)
    assert select("all_reduce", 8, 1, 4, one, candidates=["ring", "tree"]) == "tree"
    # and chain broadcast, which needs every rank on a core of its own, loses at 8 on 2
    assert select("broadcast", 8, 1 << 22, 4, CPU, segment=65536) == "chain"
    shared = replace(CPU, ranks_per_core=4.0)
    assert select("broadcast", 8, 1 << 22, 4, shared, segment=65536) == "tree"


def test_large_world_work_matches_every_rank() -> None:
    for p in (17, 33):
        for collective, algorithm in PAIRS:
            n = 7 * p
            fast = work(collective, algorithm, p, n, 0, 0)
            full = work(collective, algorithm, p, n, 0, 10**6)
            if (collective, algorithm) == ("all_reduce", "ring") or fast == full:
                assert fast == pytest.approx(full), (collective, algorithm)


def test_cpu_side_validated() -> None:
    with pytest.raises(ValueError, match="ranks_per_core"):
        CostParams(0.0, 0.0, 0.0, ranks_per_core=0.0)
    with pytest.raises(ValueError, match="byte_cpu"):
        CostParams(0.0, 0.0, 0.0, byte_cpu=-1.0)
    assert not CostParams(1.0, 1.0, 1.0, ranks_per_core=1.0).oversubscribed
    assert CostParams(1.0, 1.0, 1.0, ranks_per_core=1.5).oversubscribed
