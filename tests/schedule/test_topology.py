"""The two-level cost model (schedule/topology.py): no I/O, checked against the one-level
model where the two coincide and against closed forms where they exist."""

from __future__ import annotations

import math

import pytest

from pycollective.schedule import cost
from pycollective.schedule import topology as T
from pycollective.schedule.cost import CostParams

INTRA = CostParams(alpha=2e-6, beta=0.1e-9, gamma=0.12e-9)
INTER = CostParams(alpha=20e-6, beta=0.8e-9, gamma=0.12e-9)
FLAT = ("ring", "recursive_doubling", "halving_doubling", "tree", "naive")


def topo(h: int, l: int) -> T.Topology:
    return T.Topology(h, l, INTRA, INTER)


@pytest.mark.parametrize("algo", FLAT)
@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("count", [0, 1, 1000, 4096 * 3])
def test_one_rank_per_host_is_the_flat_model_with_inter_params(algo, p, count):
    got = T.predict(algo, count, 4, topo(p, 1))
    assert got == pytest.approx(cost.predict("all_reduce", algo, p, count, 4, INTER))


@pytest.mark.parametrize("algo", FLAT)
@pytest.mark.parametrize("p", [2, 5, 8])
def test_one_host_is_the_flat_model_with_intra_params(algo, p):
    got = T.predict(algo, 12345, 4, topo(1, p))
    assert got == pytest.approx(cost.predict("all_reduce", algo, p, 12345, 4, INTRA))


@pytest.mark.parametrize("h,l", [(2, 4), (4, 2), (3, 3), (8, 8)])
def test_flat_ring_is_limited_by_the_inter_host_link(h, l):
    p, n = h * l, 64 * h * l * 100
    a, b, g = INTER.alpha, INTER.beta * 4, INTRA.gamma * 4
    want = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
    assert T.predict("ring", n, 4, topo(h, l)) == pytest.approx(want)


@pytest.mark.parametrize("h,l", [(2, 4), (4, 2), (3, 3), (2, 32)])
@pytest.mark.parametrize("blocks", [1, 111])
def test_ring_closed_form_matches_the_schedules(h, l, blocks):
    t, count = topo(h, l), blocks * h * l
    built = T.flat_profile("all_reduce", "ring", h, l, count)
    closed = T._ring_profile(h, l, count)
    assert T.price_flat(closed, 4, t) == pytest.approx(T.price_flat(built, 4, t))
    # Uneven blocks: the closed form charges the largest block everywhere (<= 1 element).
    built = T.flat_profile("all_reduce", "ring", h, l, count + 1)
    closed = T._ring_profile(h, l, count + 1)
    assert T.price_flat(built, 4, t) <= T.price_flat(closed, 4, t)
    assert T.price_flat(closed, 4, t) == pytest.approx(T.price_flat(built, 4, t), rel=0.5 / blocks)


def test_halving_doubling_loads_the_nic_with_every_rank_of_a_host():
    # Its first round pairs ranks p/2 apart: all 4 ranks of a host send n/2 across at
    # once, so the host's link carries 4 x n/2 in that round alone.
    h, l, n = 4, 4, 1 << 20
    prof = T.flat_profile("all_reduce", "halving_doubling", h, l, n)
    assert prof[0][1] == l * n // 2
    assert T.predict("halving_doubling", n, 4, topo(h, l)) > 2 * T.predict("ring", n, 4, topo(h, l))


def test_hierarchical_by_steps():
    h, l, n = 16, 8, 1 << 24
    t = topo(h, l)
    hc = T.hierarchical(n, 4, t)
    b = n // l
    assert hc.reduce_scatter == pytest.approx(
        cost.predict("reduce_scatter", "ring", l, b, 4, INTRA)
    )
    assert hc.all_gather == pytest.approx(cost.predict("all_gather", "ring", l, b, 4, INTRA))
    shared = CostParams(alpha=INTER.alpha, beta=INTER.beta * l, gamma=INTER.gamma)
    assert hc.cross == pytest.approx(
        cost.predict("all_reduce", hc.cross_algorithm, h, b, 4, shared)
    )
    assert hc.total == pytest.approx(hc.reduce_scatter + hc.cross + hc.all_gather)
    # Same NIC bandwidth term as the flat ring (2(H-1)/H n), plus the intra-host steps:
    # at this size the two are close; with less data the ring's 2(p-1) alphas dominate.
    assert hc.total == pytest.approx(T.predict("ring", n, 4, t), rel=0.1)
    assert T.hierarchical(1 << 18, 4, t).total < T.predict("ring", 1 << 18, 4, t) / 2


def test_hierarchical_degenerate_layouts():
    assert T.hierarchical(0, 4, topo(4, 4)).total == 0.0
    one_host = T.hierarchical(4000, 4, topo(1, 4))
    assert one_host.cross == 0.0
    assert one_host.total == pytest.approx(
        cost.predict("reduce_scatter", "ring", 4, 1000, 4, INTRA)
        + cost.predict("all_gather", "ring", 4, 1000, 4, INTRA)
    )
    per_host = T.hierarchical(4000, 4, topo(4, 1))
    best = min(cost.predict("all_reduce", a, 4, 4000, 4, INTER) for a in FLAT)
    assert per_host.total == pytest.approx(best)


def test_select_prefers_hierarchy_at_scale_and_flat_on_one_host():
    assert T.select(1 << 24, 4, topo(128, 8)) == "hierarchical"
    assert T.select(1 << 24, 4, topo(1, 8), candidates=FLAT) in FLAT


def test_large_worlds_are_priced():
    for algo in ("ring", "hierarchical", "halving_doubling"):
        assert math.isfinite(T.predict(algo, 1 << 24, 4, topo(512, 8)))


def test_bad_input():
    with pytest.raises(ValueError, match="hosts"):
        T.Topology(0, 4, INTRA, INTER)
    with pytest.raises(ValueError, match="ranks_per_host"):
        T.Topology(2, 1.5, INTRA, INTER)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown all_reduce algorithm"):
        T.predict("bogus", 10, 4, topo(2, 2))
    with pytest.raises(ValueError, match="no candidate"):
        T.select(10, 4, topo(2, 2), candidates=[])
