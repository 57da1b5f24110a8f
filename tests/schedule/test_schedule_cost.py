"""The alpha-beta-gamma model: schedule costs against the closed forms of DESIGN.md
section 4, the selector's choices, and the large-world fast paths."""

from __future__ import annotations

import time

import pytest
from sched_helpers import PAIRS, SIZES

from pycollective.schedule import ALGORITHMS, build_all
from pycollective.schedule.cost import (
    CostParams,
    formula,
    predict,
    profile,
    schedule_cost,
    select,
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
