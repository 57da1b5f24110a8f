"""The shared-memory path in real jobs: the API battery with it forced (and with TCP
forced), host identity deciding who shares memory, errors (a rank killed mid-collective,
a rank that never comes, an arena call against a TCP call), and /dev/shm left clean on
every exit path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests._launch import REPO, assert_all_ok, describe, run_ranks, steps_of, within

from pycollective.shm import arena

BATTERY = REPO / "tests" / "api" / "battery.py"
WORKER = REPO / "tests" / "shm" / "_worker.py"

pytestmark = pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm")


def _no_segments_of(pids: list[int]) -> None:
    """Every segment name carries its creator's pid: none of this job's may remain."""
    left = [
        n
        for n in os.listdir(arena.SHM_DIR)
        if n.startswith("pycollective-") and any(f"-{pid}-" in n for pid in pids)
    ]
    assert left == [], left


def _job(nprocs: int, *args: str, env=None, per_rank_env=None, timeout: float = 60.0):
    results = run_ranks(
        WORKER, nprocs, tuple(args), env=env, per_rank_env=per_rank_env, timeout=timeout
    )
    steps = {r.rank: steps_of(r) for r in results}
    _no_segments_of([s["pid"]["pid"] for s in steps.values() if "pid" in s])
    return results, steps


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    # every world size from 1 to 4, then 7 (odd, no power of two) and 8; 5 and 6 add
    # nothing these do not (make test's time on a 2-core machine)
    "transport,world_size",
    [("shm", n) for n in (1, 2, 3, 4, 7, 8)] + [("tcp", 2), ("tcp", 3)],
)
def test_battery_with_transport_forced(transport: str, world_size: int) -> None:
    results = run_ranks(
        BATTERY,
        world_size,
        args=("--quick",),
        timeout=180,
        env={"PYCOLLECTIVE_TRANSPORT": transport},
    )
    assert_all_ok(results)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport,expect", [("auto", True), ("tcp", False), ("shm", True)])
def test_one_host_uses_shm_unless_told_not_to(transport: str, expect: bool) -> None:
    results, steps = _job(4, "info", env={"PYCOLLECTIVE_TRANSPORT": transport})
    for r in results:
        info = steps[r.rank]["info"]
        assert r.returncode == 0 and info["ok"], describe(r)
        assert info["shm"] is expect, describe(r)
        assert ("shm" in info["algorithms"]) is expect
        if r.rank % 2 == 0:
            assert info["sub_shm"] is expect  # subgroups get an arena of their own


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "off,agreed",
    [
        ({}, True),
        ({1: {"PYCOLLECTIVE_SHM_SINGLE_COPY": "0"}}, False),  # one rank declines: nobody
        ({0: {"PYCOLLECTIVE_NATIVE": "0"}}, False),  # a rank in the Python arena: nobody
    ],
)
def test_single_copy_is_agreed_by_every_rank_or_none(off, agreed) -> None:
    if (
        os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0"
        or os.environ.get("PYCOLLECTIVE_SHM_SINGLE_COPY", "1") == "0"
    ):
        agreed = False
    results, steps = _job(3, "single", env={"PYCOLLECTIVE_TRANSPORT": "shm"}, per_rank_env=off)
    for r in results:
        single = steps[r.rank]["single"]
        assert r.returncode == 0 and single["ok"], describe(r)
        # the compiled ranks agree (a Python rank has no compiled runner to ask)
        if "PYCOLLECTIVE_NATIVE" not in off.get(r.rank, {}):
            assert single["agreed"] is agreed, describe(r)


@pytest.mark.timeout(60)
def test_ranks_on_different_hosts_use_tcp() -> None:
    # Ranks 0,1 on "host a" and 2,3 on "host b" (as network namespaces would be): the
    # world spans hosts, so TCP; the subgroup {0, 2} too.
    hosts = {r: {"PYCOLLECTIVE_HOST_ID": "a" if r < 2 else "b"} for r in range(4)}
    results, steps = _job(4, "info", per_rank_env=hosts)
    for r in results:
        info = steps[r.rank]["info"]
        assert r.returncode == 0 and info["ok"], describe(r)
        assert info["shm"] is False and "shm" not in info["algorithms"]


@pytest.mark.timeout(60)
def test_shm_forced_across_hosts_fails_every_rank_clearly() -> None:
    hosts = {r: {"PYCOLLECTIVE_HOST_ID": f"h{r}"} for r in range(2)}
    results, steps = _job(2, "info", env={"PYCOLLECTIVE_TRANSPORT": "shm"}, per_rank_env=hosts)
    for r in results:
        init = steps[r.rank]["init"]
        assert init["error"] in ("UsageError", "CollectiveError"), describe(r)
        assert "not every rank is on this host" in init["msg"], describe(r)


@pytest.mark.timeout(60)
# 4 MiB through the arena's pipeline; 16 MiB and 4 bytes by single copy (where it is on)
@pytest.mark.parametrize(
    "nprocs,victim,count", [(2, 1, 1 << 20), (3, 0, (1 << 22) + 1), (4, 2, 64)]
)
def test_killed_rank_reaches_every_survivor_within_two_seconds(nprocs, victim, count) -> None:
    results, steps = _job(
        nprocs,
        "kill",
        str(victim),
        str(count),
        env={"PYCOLLECTIVE_TIMEOUT": "60", "PYCOLLECTIVE_TRANSPORT": "shm"},
    )
    for r in results:
        if r.rank == victim:
            assert r.returncode == -9, describe(r)
            continue
        loop = steps[r.rank]["loop"]
        assert loop["error"] in ("TransportError", "CollectiveError"), describe(r)
        assert loop["elapsed"] < within(2.0), describe(r)
        assert f"rank {victim}" in loop["msg"], describe(r)
        assert r.returncode == 0, describe(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nprocs,victim,count", [(2, 1, 1), (3, 2, 1 << 20)])
def test_peers_waiting_for_a_killed_rank_raise_at_once(nprocs, victim, count) -> None:
    # They wait in the arena's wait (compiled unless PYCOLLECTIVE_NATIVE=0): it hands back
    # to Python every millisecond, which sees the rank's TCP connection go.
    results, steps = _job(
        nprocs,
        "kill_waiting",
        str(victim),
        str(count),
        env={"PYCOLLECTIVE_TIMEOUT": "60", "PYCOLLECTIVE_TRANSPORT": "shm"},
    )
    killed_at = steps[victim]["killed"]["at"]
    for r in results:
        if r.rank == victim:
            assert r.returncode == -9, describe(r)
            continue
        call = steps[r.rank]["call"]
        assert call["error"] in ("TransportError", "CollectiveError"), describe(r)
        assert f"rank {victim}" in call["msg"], describe(r)
        assert call["at"] - killed_at < within(0.5), (call["at"] - killed_at, describe(r))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_arena_call_against_tcp_call_is_a_mismatch_on_every_rank(nprocs: int) -> None:
    results, steps = _job(nprocs, "mixed", env={"PYCOLLECTIVE_TIMEOUT": "20"})
    for r in results:
        s = steps[r.rank]
        # A rank whose gather part is only a send may finish it (as over TCP alone): it
        # hears at its next call.
        first = s["call"] if s["call"]["error"] or r.rank < 2 else s["after"]
        assert first["error"] == "MismatchError", describe(r)
        assert "all_reduce(" in first["msg"] and "gather(" in first["msg"], describe(r)
        assert first["elapsed"] < 5.0, describe(r)
        assert s["after"]["error"] is not None, describe(r)


@pytest.mark.timeout(60)
def test_a_rank_that_never_comes_times_out_the_others_naming_it() -> None:
    timeout = 1.5
    results, steps = _job(3, "never", env={"PYCOLLECTIVE_TIMEOUT": str(timeout)})
    for r in results[:2]:
        call = steps[r.rank]["call"]
        assert call["error"] == "CollectiveTimeout", describe(r)
        assert timeout - 0.1 <= call["elapsed"] < timeout + 1.0, describe(r)
        assert 2 in call["waiting_on"], describe(r)


@pytest.mark.timeout(60)
def test_exception_exit_leaves_no_segment() -> None:
    results, steps = _job(3, "raise")
    assert all(r.returncode == 1 and "deliberate" in r.stderr for r in results)


@pytest.mark.timeout(60)
def test_sigterm_through_the_launcher_leaves_no_segment() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pycollective",
            "run",
            "-n",
            "3",
            sys.executable,
            str(WORKER),
            "hang",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids, ready = [], 0
    deadline = time.monotonic() + 40
    assert proc.stdout is not None
    for line in proc.stdout:
        if '"step": "pid"' in line:
            pids.append(json.loads(line.split("RESULT ", 1)[1])["pid"])
        ready += "READY" in line
        if ready == 3 or time.monotonic() > deadline:
            break
    assert ready == 3, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    _no_segments_of(pids)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_collectives_on_shared_buffers_match_numpy(nprocs: int) -> None:
    # Small chunks, so the direct path runs many steps.
    results, steps = _job(nprocs, "shared", env={"PYCOLLECTIVE_SHM_CHUNK_BYTES": "65536"})
    for r in results:
        info = steps[r.rank]["shared"]
        assert r.returncode == 0 and info["ok"], (info, describe(r))
        # Each peer still holds 3 buffers it used (the last `a`, `big`, the last `fresh`): the
        # 7 fresh ones it freed were dropped.
        assert info["maps"] <= 3 * (nprocs - 1), info
    # The shared buffers are memfds, named nowhere; _job checked that no arena segment
    # named after our pids remains. (Other jobs on the machine may add their own entries.)


@pytest.mark.timeout(60)
def test_kill_9_with_shared_buffers_leaves_nothing_in_dev_shm() -> None:
    results, steps = _job(3, "shared_kill", env={"PYCOLLECTIVE_TIMEOUT": "20"})
    assert results[2].returncode == -9
    for r in results:
        assert steps[r.rank]["used"]["ok"], describe(r)
