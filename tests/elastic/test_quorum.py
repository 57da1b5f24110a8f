"""The membership rule (elastic/_quorum.py) and the shard plan, without processes."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective.elastic import ElasticSampler, Registration, decide
from pycollective.elastic._quorum import Decision


def reg(
    uid: str, step: int = 5, fresh: bool = False, order: int = 1 << 30, commit_round: int = 2
) -> Registration:
    return Registration(uid, step, fresh, order=order, commit_round=commit_round)


KW = dict(min_size=2, max_size=8, initial=4)
PREV = ["a", "b", "c", "d"]


def test_first_round_waits_for_the_initial_members_and_orders_them_by_rank():
    regs = [reg("b", 0, True, 1), reg("a", 0, True, 0), reg("c", 0, True, 2)]
    assert decide(0, "a", None, regs, set(), False, **KW) is None
    d = decide(0, "a", None, [*regs, reg("d", 0, True, 3)], set(), False, **KW)
    assert d.uids == ["a", "b", "c", "d"] and d.donor == "a" and d.behind == ("b", "c", "d")
    # at the join timeout, min_size is enough; below it the round fails
    assert decide(0, "a", None, regs[:2], set(), True, **KW).uids == ["a", "b"]
    assert "fewer than the 2 needed" in decide(0, "a", None, regs[:1], set(), True, **KW).failed


def test_a_lost_member_is_excluded_at_once_when_its_lease_ended():
    regs = [reg("a"), reg("c"), reg("d")]
    assert decide(3, "a", PREV, regs, set(), False, **KW) is None  # b may still come
    d = decide(3, "a", PREV, regs, {"b"}, False, **KW)
    assert d.uids == ["a", "c", "d"] and not d.failed and d.behind == ()


def test_the_step_in_flight_is_committed_everywhere_or_nowhere():
    # a and d committed step 6; c did not: c receives a's state (step 6)
    regs = [reg("a", 6), reg("c", 5), reg("d", 6)]
    d = decide(3, "c", PREV, regs, {"b"}, False, **KW)
    assert d.donor == "a" and d.behind == ("c",) and d.max_step == 6


def test_a_member_left_out_with_a_step_of_its_own_adopts_the_jobs():
    # x committed step 6 in round 2, in a group the job did not go on with (it was slow,
    # left out of round 3); a and b redid step 6 in round 3. Same step, other states.
    regs = [reg("a", 6, commit_round=3), reg("b", 6, commit_round=3), reg("x", 6, commit_round=2)]
    d = decide(4, "a", ["a", "b"], regs, set(), False, **KW)
    assert d.donor == "a" and d.behind == ("x",)
    # and equal versions need no transfer
    same = decide(4, "a", ["a", "b"], regs[:2], set(), False, **KW)
    assert same.behind == () and same.donor == ""


def test_majority_of_the_live_previous_members():
    regs = [reg("a"), reg("b")]
    # c and d are alive (leases held) but silent: 2 of 4 is no majority
    assert decide(3, "a", PREV, regs, set(), False, **KW) is None
    d = decide(3, "a", PREV, regs, set(), True, **KW)
    assert d.failed and "no majority: 2 of the 4 live members" in d.failed
    # three of four is one
    assert decide(3, "a", PREV, [*regs, reg("c")], set(), True, **KW).uids == ["a", "b", "c"]
    # two simultaneous deaths (leases ended) leave two live members, both here: go on
    assert decide(3, "a", PREV, regs, {"c", "d"}, False, **KW).uids == ["a", "b"]


def test_newcomers_never_decide_and_join_behind_the_members():
    regs = [reg("x", 0, True), reg("a"), reg("b"), reg("c"), reg("d")]
    assert decide(3, "x", PREV, regs, set(), True, **KW) is None
    d = decide(3, "a", PREV, regs, set(), False, **KW)
    assert d.uids == ["a", "b", "c", "d", "x"] and d.behind == ("x",) and d.donor == "a"
    assert decide(3, "a", PREV, regs, set(), False, min_size=2, max_size=4, initial=4).uids == PREV


def test_a_round_without_a_holder_of_the_state_fails_once_a_group_formed():
    regs = [reg("x", 0, True), reg("y", 0, True)]
    d = decide(3, "x", ["x", "y"], regs, set(), False, **KW, held=True)
    assert "no member holds the training state" in d.failed
    assert decide(1, "x", ["x", "y"], regs, set(), False, **KW, held=False).donor == "x"


def test_too_few_members_wait_for_replacements_then_fail():
    regs = [reg("a")]
    assert decide(3, "a", PREV, regs, {"b", "c", "d"}, False, **KW) is None
    failed = decide(3, "a", PREV, regs, {"b", "c", "d"}, True, **KW).failed
    assert "fewer than the 2 needed" in failed


def test_decisions_round_trip_through_json():
    d = decide(0, "a", None, [reg("a", 0, True, 0), reg("b", 0, True, 1)], set(), True, **KW)
    assert Decision.from_json(d.to_json()) == d


class _Mgr:
    def __init__(self, rank: int, size: int, samples: int = 0) -> None:
        self.rank, self.size, self.samples = rank, size, samples


@pytest.mark.parametrize("size", [1, 3, 4, 7])
def test_the_shard_plan_splits_one_global_batch_whatever_the_membership(size):
    batches = []
    for rank in range(size):
        s = ElasticSampler(_Mgr(rank, size, samples=90), 100, 32, seed=3)
        batches.append(s.indices())
        assert s.share() == len(s.indices()) / 32
    whole = np.concatenate(batches)
    assert len(whole) == 32
    ref = ElasticSampler(_Mgr(0, 1, samples=90), 100, 32, seed=3).batch_indices()
    assert (whole == ref).all()  # the same samples, crossing into epoch 1
    # epoch 0 ends after 10 of them; epoch 1 is a new permutation
    first = ElasticSampler(_Mgr(0, 1), 100, 100, seed=3).batch_indices()
    assert sorted(first) == list(range(100)) and (ref[:10] == first[90:]).all()
