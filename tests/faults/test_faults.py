"""Faults in real jobs (the fourth layer of tests, after schedules, the transports'
conformance kit and real processes): mismatched calls, a rank that dies,
a rank that never calls, errors in async work, and tear-down after all of them. Every rank
involved must raise a CollectiveError subclass within a bound; nothing hangs; every process
exits cleanly with no thread left running.

Each job runs tests/faults/_worker.py, which reports every step as a `RESULT {json}` line.
"""

from __future__ import annotations

import re

import pytest
from tests._launch import REPO, RankResult, describe, run_ranks, steps_of

WORKER = REPO / "tests" / "faults" / "_worker.py"
COLLECTIVE_ERRORS = {
    "CollectiveError",
    "TransportError",
    "CollectiveTimeout",
    "MismatchError",
    "UsageError",
}


def _job(nprocs: int, *args: str, timeout: float = 10.0, job_timeout: float = 40.0):
    results = run_ranks(
        WORKER,
        nprocs,
        tuple(args),
        env={"PYCOLLECTIVE_TIMEOUT": str(timeout)},
        timeout=job_timeout,
    )
    return results, {r.rank: steps_of(r) for r in results}


def _check_clean_exit(r: RankResult, steps: dict) -> None:
    """Exit 0; destroy_process_group returned promptly and left no thread running."""
    assert r.returncode == 0, describe(r)
    d = steps.get("destroy")
    assert d is not None, describe(r)
    assert d["elapsed"] < 2.0, describe(r)
    assert d["threads"] == [], describe(r)


def _is_collective_error(step: dict) -> bool:
    return step["error"] is not None and "CollectiveError" in step["bases"]


# ---------------------------------------------------------------------- 1. mismatched calls

# variant -> text each side's description must show (rank 0's side, the others' side)
SIDES = {
    "kind": ("all_reduce(", "broadcast("),
    "count": ("count=10", "count=12"),
    "dtype": ("float32", "float64"),
    "op": ("op=SUM", "op=MAX"),
    "root": ("root=0", "root=1"),
    "algorithm": ("algorithm=ring", "algorithm=tree"),
    "extra": ("all_reduce(", "broadcast("),
    "late": ("barrier(", "all_reduce("),
    "p2p-dtype": ("dtype=float32", "dtype=float64"),
    "p2p-size": ("bytes=16", "bytes=24"),
}
# More kinds (tests/faults/_worker.py MORE_MISMATCHES). `make test` runs every kind at 3
# ranks (two sides and a bystander) and one collective and one point-to-point kind at 2
# ranks too (no bystander); `make faults` runs every kind at 2, 3 and 4 ranks.
MORE_SIDES = {
    "gather-kind": ("all_gather(", "all_reduce("),
    "barrier-kind": ("barrier(", "all_reduce("),
    "reduce-kind": ("called reduce(#1", "all_reduce(#1"),
    "reduce-op": ("op=SUM", "op=MIN"),
    "reduce-dst": ("root=0", "root=1"),
    "gather-dst": ("root=0", "root=1"),
    "scatter-src": ("root=0", "root=1"),
    "gather-vs-scatter": ("gather(", "scatter("),
    "rs-count": ("count=4", "count=5"),
    "rs-op": ("op=SUM", "op=PRODUCT"),
    "a2a-count": ("all_to_all(", "were expected"),
    "bcast-dtype": ("int32", "float32"),
    "bcast-count": ("count=8", "count=9"),
    "ag-dtype": ("int64", "float64"),
    "avg-sum": ("op=AVG", "op=SUM"),
    "subgroup-count": ("count=8", "count=16"),
    "async-count": ("count=8", "count=16"),
    "object-src": ("root=0", "root=1"),
}
SIDES.update(MORE_SIDES)
TWO_RANKS = ("count", "p2p-size")
# A rank whose part is only sending can finish before the receiver sees the mismatch (there
# is no acknowledgement to wait for); it must then raise at its next call on the group.
SEND_ONLY_POSSIBLE = {
    "root",
    "p2p-dtype",
    "p2p-size",
    "reduce-kind",
    "reduce-op",
    "reduce-dst",
    "gather-dst",
    "scatter-src",
    "gather-vs-scatter",
    "bcast-dtype",
    "bcast-count",
    "object-src",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "variant,nprocs",
    [(v, 3) for v in SIDES] + [(v, 2) for v in TWO_RANKS],
)
def test_mismatch_raises_on_every_rank_naming_both_sides(variant: str, nprocs: int) -> None:
    results, steps = _job(nprocs, "mismatch", variant)
    mine, theirs = SIDES[variant]
    for r in results:
        s = steps[r.rank]
        _check_clean_exit(r, s)
        order = ["extra", "mismatch", "after"] if variant == "extra" else ["mismatch", "after"]
        failed = [s[k] for k in order if k in s and s[k]["error"] is not None]
        assert failed, f"no error at all on\n{describe(r)}"
        first = failed[0]
        assert first["error"] == "MismatchError", describe(r)
        if variant not in SEND_ONLY_POSSIBLE:
            # every rank of these receives something in the call itself
            assert s["mismatch" if variant != "extra" or r.rank else "extra"]["error"], describe(r)
        msg = first["msg"]
        assert re.search(r"rank \d+ called .+ but rank \d+ called ", msg), msg
        assert mine in msg and theirs in msg, msg
        assert first["elapsed"] < 5.0, describe(r)  # the timeout is 10 s: not a timeout
        after = s["after"]
        if variant == "subgroup-count":
            # the subgroup failed; the world group, which "after" uses, is not disturbed
            assert after["error"] is None, describe(r)
            continue
        # the group is unusable afterwards, and says so at once
        assert _is_collective_error(after), describe(r)
        assert after["elapsed"] < 1.0, describe(r)


# ---------------------------------------------------------------------- 2. a rank dies


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "nprocs,how,algorithm,victim,count",
    [
        (4, "exit", "ring", 3, 65536),  # ring p=4: rank 1 is not next to rank 3
        (4, "kill", "ring", 1, 65536),
        (4, "kill", "tree", 3, 1000),  # tree p=4: a leaf dies; the root's other side hears late
        (4, "exit", "tree", 0, 100000),  # the root dies
        (3, "kill", "recursive_doubling", 1, 16),
        (3, "exit", "auto", 2, 1 << 20),  # large: dies mid-transfer
    ],
)
def test_rank_death_reaches_every_survivor_promptly(nprocs, how, algorithm, victim, count):
    results, steps = _job(nprocs, "die", how, algorithm, str(victim), str(count), timeout=30)
    for r in results:
        if r.rank == victim:
            assert r.returncode in (17, -9), describe(r)
            continue
        s = steps[r.rank]
        _check_clean_exit(r, s)
        loop = s["loop"]
        assert loop["iterations"] > 0, describe(r)
        assert loop["error"] in ("TransportError", "MismatchError", "CollectiveError"), describe(r)
        assert loop["error"] != "CollectiveTimeout"
        # learned from its own socket or from a peer's abort notice: well before the 30 s
        assert loop["elapsed"] < 5.0, describe(r)
        assert f"rank {victim}" in loop["msg"], describe(r)
        if loop["error"] == "TransportError":
            assert loop["peer"] == victim, describe(r)
        assert _is_collective_error(s["after"]) and s["after"]["elapsed"] < 1.0, describe(r)


# ---------------------------------------------------------------------- 3. a rank never calls


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_rank_that_never_calls_times_out_the_others_and_fails_itself(nprocs: int) -> None:
    timeout = 2.0
    results, steps = _job(nprocs, "sleep", timeout=timeout)
    sleepy = nprocs - 1
    named = set()
    for r in results:
        s = steps[r.rank]
        _check_clean_exit(r, s)
        if r.rank == sleepy:
            late = s["late"]
            # the group already failed: it hears so at once instead of waiting its timeout
            assert _is_collective_error(late), describe(r)
            assert late["elapsed"] < 1.0, describe(r)
            continue
        t = s["timeout"]
        assert t["error"] == "CollectiveTimeout", describe(r)
        assert timeout - 0.1 <= t["elapsed"] < timeout + 1.0, describe(r)
        assert "timed out waiting for rank(s)" in t["msg"], describe(r)
        # ... and says after how long, and how to change it
        assert f"after {timeout:g} s; set timeout= or PYCOLLECTIVE_TIMEOUT" in t["msg"], describe(r)
        named.update(s["timeout-info"]["waiting_on"])
        assert _is_collective_error(s["after"]), describe(r)
    assert sleepy in named, steps


# ---------------------------------------------------------------------- 4. async work, teardown


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["mismatch", "die"])
def test_async_error_is_raised_by_wait_on_every_rank(kind: str) -> None:
    nprocs = 3
    results, steps = _job(nprocs, "async", kind)
    for r in results:
        if kind == "die" and r.rank == nprocs - 1:
            assert r.returncode == 17, describe(r)
            continue
        s = steps[r.rank]
        _check_clean_exit(r, s)
        wait = s["wait"]
        want = "MismatchError" if kind == "mismatch" else "TransportError"
        assert wait["error"] == want, describe(r)
        assert wait["elapsed"] < 5.0, describe(r)
        assert _is_collective_error(s["after-async"]), describe(r)


@pytest.mark.timeout(60)
def test_destroy_with_a_collective_in_flight_returns_promptly() -> None:
    """Rank 0 destroys while its async all_reduce waits on rank 1, who is alive but busy:
    destroy returns within its grace period, the Work fails with a CollectiveError."""
    results, steps = _job(2, "pending")
    r0, r1 = results
    s = steps[0]
    assert r0.returncode == 0 and r1.returncode == 0, describe(r0) + describe(r1)
    assert s["pending"]["done"] is False
    assert s["destroy"]["elapsed"] < 1.5, describe(r0)
    assert s["destroy"]["threads"] == [], describe(r0)
    assert s["wait-after-destroy"]["error"] in COLLECTIVE_ERRORS, describe(r0)
    assert s["wait-after-destroy"]["elapsed"] < 1.0, describe(r0)
    assert steps[1]["destroy"]["elapsed"] < 2.0, describe(r1)


@pytest.mark.timeout(60)
def test_monitored_barrier_names_the_ranks_that_did_not_arrive() -> None:
    nprocs = 3
    results, steps = _job(nprocs, "monitored")
    for r in results:
        s = steps[r.rank]
        _check_clean_exit(r, s)
        assert s["all-arrive"]["error"] is None, describe(r)
        if r.rank == nprocs - 1:
            # the group failed meanwhile: the late rank hears it at once, not at its timeout
            assert _is_collective_error(s["late"]) and s["late"]["elapsed"] < 1.0, describe(r)
            continue
        missing = s["missing"]
        assert _is_collective_error(missing), describe(r)
        assert "did not arrive" in missing["msg"] and "[2]" in missing["msg"], describe(r)
        assert missing["elapsed"] < 3.0, describe(r)
        if r.rank == 0:
            assert missing["error"] == "CollectiveTimeout", describe(r)
            assert s["missing-info"]["waiting_on"] == [2], describe(r)
