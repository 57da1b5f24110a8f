"""Hierarchical all-reduce in real jobs whose ranks pretend to be on several hosts
(PYCOLLECTIVE_HOST_ID): results against numpy for every dtype and op, auto's choice, the
bytes each rank sends to other hosts, and errors that surface on every rank."""

from __future__ import annotations

import os
from functools import cache

import pytest
from tests._launch import REPO, assert_all_ok, describe, run_ranks, steps_of

WORKER = REPO / "tests" / "hierarchy" / "_worker.py"


def _job(hosts: list[str], scenario: str, env: dict[str, str] | None = None, timeout=90.0):
    per_rank = {i: {"PYCOLLECTIVE_HOST_ID": h} for i, h in enumerate(hosts)}
    results = run_ranks(
        WORKER, len(hosts), (scenario,), env=env, per_rank_env=per_rank, timeout=timeout
    )
    return results, {r.rank: steps_of(r) for r in results}


def native_single_copy() -> bool:
    """Whether this machine lets sibling processes of one user read each other (no Yama,
    its ptrace scope 0, or root's CAP_SYS_PTRACE below scope 3), as set-up's probe needs,
    with single copy not turned off."""
    from pycollective.shm import native  # noqa: PLC0415

    scope = _ptrace_scope()
    return native.single_copy_wanted() and (scope == 0 or (os.geteuid() == 0 and scope < 3))


def _ptrace_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except OSError:
        return 0  # no Yama: the same user's processes may


def _expected_layout(hosts: list[str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for rank, h in enumerate(hosts):
        groups.setdefault(h, []).append(rank)
    return list(groups.values())


@cache
def _correctness_job(hosts: str, transport: str, native: bool = True):
    """The correctness job of a layout (cached). 2 hosts x 2 ranks with the arena also
    measures the cross-host bytes afterwards (test_cross_host_bytes_...): one job less.
    `native=False`: the in-host steps on the Python arena (PYCOLLECTIVE_NATIVE=0)."""
    env = {"PYCOLLECTIVE_TRANSPORT": transport}
    if not native:
        env["PYCOLLECTIVE_NATIVE"] = "0"
    if transport == "tcp":  # and the environment's way of asking for it
        env["PYCOLLECTIVE_ALL_REDUCE_ALGORITHM"] = "hierarchical"
    scenarios = "correctness,traffic" if (hosts, transport) == ("aabb", "auto") else "correctness"
    return _job(list(hosts), scenarios, env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "hosts,transport,native",
    [
        ("aabb", "auto", True),  # 2 hosts x 2 ranks, arena inside each host (compiled)
        ("aabb", "auto", False),  # the same on the Python arena
        ("aabbcc", "auto", True),  # 3 x 2
        ("abab", "auto", True),  # hosts interleaved in rank order
        ("aab", "auto", True),  # uneven 2 + 1: the leader variant
        ("aaabbc", "auto", True),  # uneven 3 + 2 + 1
        ("aabb", "tcp", True),  # no arena: intra-host steps over TCP too
    ],
)
def test_results_match_numpy(hosts: str, transport: str, native: bool) -> None:
    results, res = _correctness_job(hosts, transport, native)
    layout = _expected_layout(list(hosts))
    for r in results:
        c = res[r.rank].get("correctness")
        assert r.returncode == 0 and c is not None, describe(r)
        assert c["failures"] == [] and c["checks"] > 100, describe(r)
        assert c["hosts"] == layout
        assert c["auto"] == "hierarchical", c
        assert "hierarchical" in c["algorithms"]
        # Ranks that share their host with another get an arena for the in-host steps.
        alone = len(next(h for h in layout if r.rank in h)) == 1
        assert c["arena"] is (transport == "auto" and not alone)
        # ... whose steps the compiled arena runs, unless PYCOLLECTIVE_NATIVE=0
        wanted = native and os.environ.get("PYCOLLECTIVE_NATIVE", "1") != "0"
        assert c["compiled"] is (c["arena"] and wanted)
        # (and reads its peers' blocks by single copy where the system lets it)
        assert c["single_copy"] is (c["compiled"] and native_single_copy())


@pytest.mark.timeout(120)  # the job (its bound is 90 s) if no test before ran it
def test_cross_host_bytes_are_what_the_hierarchy_promises() -> None:
    results, res = _correctness_job("aabb", "auto")
    hosts = _expected_layout(list("aabb"))
    L = 2
    host_of = {q: i for i, h in enumerate(hosts) for q in h}
    ring_cross = {0: 0, 1: 0}
    for r in results:
        t = res[r.rank].get("traffic")
        assert r.returncode == 0 and t is not None and t["ok"] and t["arena"], describe(r)
        n = t["nbytes"]
        auto = {int(k): v for k, v in t["sent"]["auto"].items()}
        # Hierarchy: nothing over TCP inside the host (the arena carries it); across, only
        # to the rank with the same local index, n / L bytes (2 hosts: one exchange).
        peer = hosts[1 - host_of[r.rank]][hosts[host_of[r.rank]].index(r.rank)]
        assert auto == {peer: n // L}, t
        for q, v in t["sent"]["ring"].items():
            if host_of[int(q)] != host_of[r.rank]:
                ring_cross[host_of[r.rank]] += v
    # Per host, the flat ring sends 2(p-1)/p n = 1.5 n across; the hierarchy L x n/L = n.
    for h in (0, 1):
        assert ring_cross[h] == 3 * n // 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind", ["count_in_host", "count_across_hosts", "dtype_in_host", "algorithm"]
)
def test_mismatch_fails_every_rank(kind: str) -> None:
    results, res = _job(list("aabb"), f"mismatch:{kind}")
    for r in results:
        steps = res[r.rank]
        assert r.returncode == 0 and "call" in steps, describe(r)
        assert steps["call"]["error"] == "MismatchError", describe(r)
        assert steps["after"]["error"] == "CollectiveError", describe(r)


@pytest.mark.timeout(60)
def test_a_killed_rank_fails_every_other_rank() -> None:
    results, res = _job(list("aabb"), "kill")
    assert results[-1].returncode == -9
    for r in results[:-1]:
        loop = res[r.rank].get("loop")
        assert loop is not None and loop["error"] is not None, describe(r)
        assert loop["error"] in ("TransportError", "CollectiveError"), describe(r)


@pytest.mark.timeout(200)
def test_api_battery_on_two_fake_hosts() -> None:
    """Every collective (tests/api/battery.py) in a group spanning two hosts of two ranks:
    auto's all_reduce is hierarchical there, and algorithms() lists it."""
    per_rank = {i: {"PYCOLLECTIVE_HOST_ID": h} for i, h in enumerate("aabb")}
    battery = REPO / "tests" / "api" / "battery.py"
    assert_all_ok(run_ranks(battery, 4, ("--quick",), per_rank_env=per_rank, timeout=180))
