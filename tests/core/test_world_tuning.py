"""Cost parameters live on each World (no process-global tuning state): two Worlds of one
process - the default group's and a torch backend's, say - price `auto` independently, and
calibrating one leaves the other as it was."""

from __future__ import annotations

from dataclasses import replace

from pycollective._dtypes import BY_NAME
from pycollective.core.group import ProcessGroup
from pycollective.core.world import World
from pycollective.runners import Members, ScheduledRunner, Spec
from pycollective.schedule.cost import CostParams
from pycollective.tuning.params import JobCost, Tuning

F32 = BY_NAME["float32"]
# Latency dominates: few rounds win. Bandwidth dominates: the ring's 2(p-1)/p n wins.
LATENCY_BOUND = JobCost({"tcp": CostParams(alpha=1e-2, beta=1e-13, gamma=1e-13)}, 8, 8)
BANDWIDTH_BOUND = JobCost({"tcp": CostParams(alpha=1e-9, beta=1e-8, gamma=1e-13)}, 8, 8)


def _choice(world: World, count: int = 1 << 20) -> str:
    members = Members(tuple(range(8)), 0, 1, 1.0, world)
    return ScheduledRunner(members).choose(Spec("all_reduce", count, F32, 0, 0))


def test_two_worlds_price_with_their_own_parameters() -> None:
    a = World(0, 1, None, None, 1.0, tuning=Tuning(LATENCY_BOUND))
    b = World(0, 1, None, None, 1.0, tuning=Tuning(BANDWIDTH_BOUND))
    latency, bandwidth = _choice(a), _choice(b)
    assert latency != bandwidth
    assert bandwidth in ("ring", "halving_doubling")  # n bytes, not lg p * n
    # a calibration of one World (what api/calibrate.py adopts) changes only that one
    a.tuning.adopt(replace(LATENCY_BOUND, params={"tcp": BANDWIDTH_BOUND.params["tcp"]}))
    assert _choice(a) == bandwidth and _choice(b) == bandwidth
    b.tuning.adopt(LATENCY_BOUND)
    assert _choice(b) == latency and _choice(a) == bandwidth


def test_a_group_prices_with_its_worlds_tuning() -> None:
    w = World(0, 1, None, None, 1.0, tuning=Tuning(BANDWIDTH_BOUND))
    g = ProcessGroup(w, [0], 7, "one")
    assert g.members.tuning is w.tuning
    assert g.choose_algorithm("all_reduce", None, 16, F32, 0) in g.algorithms("all_reduce")


def test_a_world_without_a_job_prices_with_this_hosts_parameters() -> None:
    t = Tuning()
    assert t.job is None and not t.wants_calibration
    assert replace(t.group_params("tcp", 1), ranks_per_core=1.0) == t.params("tcp")
