"""The compiled path of repeated calls (ProcessGroup.fast, _native.CallPath): a call like one
that ran before goes from the API function straight to C. Real jobs: its results are the
Python reference's bit for bit, it refuses what the Python path refuses, the flight
recorder shows its calls, and a mismatch, a killed peer or a timeout raise on every rank
as on the Python path."""

from __future__ import annotations

import json
import os
import sys

import pytest
from tests._launch import REPO, describe, run_bounded, run_ranks, tagged, within

from pycollective.shm import arena

WORKER = REPO / "tests" / "native" / "_fast_worker.py"

pytestmark = [
    pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm"),
    pytest.mark.skipif(
        os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0", reason="PYCOLLECTIVE_NATIVE=0"
    ),
]
# Every repeated call of a scenario takes the compiled path (see the worker's docstring).
ALWAYS = {"FAST_TEST_RECHECK": "3600"}


def _job(nprocs: int, *args: str, env: dict[str, str] | None = None, timeout: float = 90):
    results = run_ranks(
        WORKER, nprocs, args, timeout=timeout,
        env={"PYCOLLECTIVE_TRANSPORT": "shm", **(env or {})},
    )  # fmt: skip
    return results


def _compiled_and_reference(nprocs: int, scenario: str) -> tuple[list, list]:
    """The scenario's job compiled (every repeated call on the compiled path) and on the
    Python arena (the reference): every rank succeeded, and all results' digests agree."""
    compiled = _job(nprocs, scenario, env=ALWAYS)
    python = _job(nprocs, scenario, env={"PYCOLLECTIVE_NATIVE": "0"})
    for r in compiled + python:
        assert r.returncode == 0, describe(r)
    digests = {d for r in compiled + python for d in tagged(r, "DIGEST")}
    assert len(digests) == 1, [describe(r) for r in compiled + python]
    return compiled, python


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_repeated_calls_give_the_python_references_bits(nprocs: int) -> None:
    # ALWAYS: every repeated call compiled however slow the machine (a sanitizer's build, a
    # loaded runner), so that the count below does not depend on its speed (at the default
    # recheck, only 249 calls per rank took it under ASan at load 13, against > 300 here).
    compiled, python = _compiled_and_reference(nprocs, "bits")
    for c, p in zip(compiled, python, strict=True):  # each rank's own results
        assert tagged(c, "OWN") == tagged(p, "OWN") and len(tagged(c, "OWN")) == 1, describe(c)
    for r in compiled:
        (fast,) = tagged(r, "FAST")
        # the repeated calls (two of three of each signature, most of the rest) ran compiled
        assert fast is not None and fast["calls"] > 300, describe(r)
        refused = tagged(r, "REFUSED")[0]
        assert all(": accepted" not in x for x in refused), refused
    for r in python:
        assert tagged(r, "FAST") == [None], describe(r)
    assert tagged(compiled[0], "REFUSED") == tagged(python[0], "REFUSED")


@pytest.mark.timeout(60)
def test_every_repeated_call_it_should_take_runs_compiled() -> None:
    """The compiled path must not be off, silently, for calls it is for (it reads the
    group's and engine's state as C-owned records, _callstate.py, so no Python rename can
    turn it off; this counts it): 2 ranks, after the first all_reduce, broadcast, barrier,
    reduce, all_gather_into_tensor and reduce_scatter_tensor (which teach it their
    signatures), 100 more of each: all of them."""
    n = 100
    results = _job(2, "repeat", str(n), env=ALWAYS)
    for r in results:
        assert r.returncode == 0, describe(r)
        assert tagged(r, "REPEATED") == [6 * n], describe(r)


@pytest.mark.timeout(60)
def test_flight_recorder_shows_compiled_calls_as_python_ones() -> None:
    compiled = _job(2, "flight", env=ALWAYS)
    python = _job(2, "flight", env={**ALWAYS, "PYCOLLECTIVE_NATIVE": "0"})
    for r in compiled + python:
        assert r.returncode == 0, describe(r)
    for c, p in zip(compiled, python, strict=True):
        (fc,), (fp,) = tagged(c, "FLIGHT"), tagged(p, "FLIGHT")
        assert fc["times_ok"] and fc == fp, (fc, fp)
        entries = fc["entries"]
        assert [e["seq"] for e in entries] == list(range(entries[0]["seq"], entries[0]["seq"] + 30))
        assert all(e["state"] == "completed" for e in entries)
        assert [e["kind"] for e in entries[:3]] == ["all_reduce", "broadcast", "barrier"]
        assert tagged(c, "FAST")[0]["calls"] >= 27, describe(c)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "how", ["count", "op", "reduce-root", "all_gather-count", "reduce_scatter-dtype"]
)
def test_a_mismatch_after_repeated_calls_raises_on_every_rank(how: str) -> None:
    # the repeated call is an all_reduce, or the collective named before the "-"; rank 1
    # calls one whose field after it differs
    results = _job(3, "mismatch", how, env={**ALWAYS, "PYCOLLECTIVE_TIMEOUT": "20"})
    field = how.split("-")[-1]
    for r in results:
        (call,) = tagged(r, "RESULT")
        assert call["error"] == "MismatchError", describe(r)
        assert f"{field} differ" in call["msg"] and "#6" in call["msg"], describe(r)
        assert call["elapsed"] < 5.0, describe(r)
        before, after = tagged(r, "FAST")
        assert before["calls"] == 4, describe(r)  # the first call ran the Python path
        if r.rank != 1:  # rank 1's call is another signature: the Python path
            # handed to Python (a repeated call before it may have been too: one that
            # waited past a millisecond, on a loaded machine)
            assert after["handed"] == before["handed"] + 1, describe(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "nprocs,victim,collective",
    [(2, 1, "all_reduce"), (3, 0, "all_reduce"), (2, 0, "reduce"), (3, 2, "all_gather"),
     (2, 1, "reduce_scatter"), (2, 1, "all_reduce_large"), (3, 0, "all_reduce_large")],
)  # fmt: skip
def test_peers_waiting_in_a_compiled_call_for_a_killed_rank_raise_at_once(
    nprocs: int, victim: int, collective: str
) -> None:
    results = _job(
        nprocs, "kill", str(victim), collective, env={**ALWAYS, "PYCOLLECTIVE_TIMEOUT": "60"}
    )
    killed_at = tagged(results[victim], "RESULT")[0]["at"]
    for r in results:
        if r.rank == victim:
            assert r.returncode == -9, describe(r)
            continue
        (call,) = tagged(r, "RESULT")
        assert call["error"] in ("TransportError", "CollectiveError"), describe(r)
        assert f"rank {victim}" in call["msg"], describe(r)
        assert call["at"] - killed_at < within(0.5), (call["at"] - killed_at, describe(r))
        before, after = tagged(r, "FAST")
        assert after["handed"] == before["handed"] + 1, describe(r)  # it was a compiled call


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_repeated_large_all_reduces_go_by_single_copy_with_the_references_bits(
    nprocs: int,
) -> None:
    """all_reduce above the small calls (the arena's pipeline, then single copy) is
    repeated compiled, with the Python arena's bits; on a shared buffer
    (`pycollective.empty`) of the same signature the compiled path declines, so the peers
    still learn that it is shared."""
    compiled, _python = _compiled_and_reference(nprocs, "large")
    for r in compiled:
        (fast,) = tagged(r, "FAST")
        assert fast["calls"] >= 21, describe(r)  # of 24: all but the first of each op
        assert tagged(r, "LARGE") == [{"shared_compiled": 0}], describe(r)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_repeated_large_all_gathers_and_reduce_scatters_go_by_single_copy_with_the_references_bits(
    nprocs: int,
) -> None:
    compiled, _python = _compiled_and_reference(nprocs, "large_gather")
    for r in compiled:
        (fast,) = tagged(r, "FAST")
        # of 16 all_gathers and 8 reduce_scatters: all but the first of each form or op
        assert fast["calls"] >= 20, describe(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "nprocs,collective",
    [(2, "all_reduce"), (3, "all_reduce"), (2, "all_gather"), (3, "reduce_scatter")],
)
def test_a_compiled_single_copy_that_fails_raises_on_every_rank(
    nprocs: int, collective: str
) -> None:
    results = _job(nprocs, "unreachable", collective, env={**ALWAYS, "PYCOLLECTIVE_TIMEOUT": "30"})
    for r in results:
        (call,) = tagged(r, "RESULT")
        assert call["error"] == "TransportError", describe(r)
        assert f"single-copy {collective}" in call["msg"] and "ESRCH" in call["msg"], describe(r)
        before, after = tagged(r, "FAST")
        assert after["handed"] == before["handed"] + 1, describe(r)  # it was a compiled call


@pytest.mark.timeout(240)  # the job's 90 s, then diagnose's 120 s: bounds for a hang
def test_a_timeout_in_a_compiled_call_names_the_rank_and_diagnose_finds_it(tmp_path) -> None:
    timeout = 1.5
    results = _job(
        3, "never", env={**ALWAYS, "PYCOLLECTIVE_TIMEOUT": str(timeout),
                         "PYCOLLECTIVE_FLIGHT_DIR": str(tmp_path)},
    )  # fmt: skip
    waited = set()
    for r in results[:2]:
        (call,) = tagged(r, "RESULT")
        assert call["error"] in ("CollectiveTimeout", "CollectiveError"), describe(r)
        assert call["elapsed"] < timeout + 1.0, describe(r)
        waited.update(call["waiting_on"])
        before, after = tagged(r, "FAST")
        assert after["handed"] == before["handed"] + 1, describe(r)
    assert 2 in waited, [describe(r) for r in results]
    # a hang of diagnose fails on its CPU time (it needs well under a second of it), not on
    # the wall clock of a loaded machine (30 s of it did not do at load 14-18)
    out = run_bounded(
        [sys.executable, "-m", "pycollective", "diagnose", str(tmp_path), "--json"],
        cpu_seconds=20, wall_seconds=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    facts = [f["facts"] for fs in json.loads(out.stdout).values() for f in fs]
    assert any(f.get("behind") == [2] and f.get("at_seq") == 6 for f in facts), facts


@pytest.mark.timeout(60)
def test_async_calls_and_waiting_threads_keep_their_order() -> None:
    results = _job(2, "threads")
    for r in results:
        assert r.returncode == 0, describe(r)
    assert len({d for r in results for d in tagged(r, "DIGEST")}) == 1
    assert all(tagged(r, "FAST")[0]["calls"] > 0 for r in results)
