"""The scheduled runner's path of repeated calls over TCP (runners/swap.py,
TCPTransport.swap): a small all_reduce between two ranks like one that ran before is one
sendmsg and one recv_into. Real jobs over loopback (the worker of the compiled arena's
path, tests/native/_fast_worker.py, with PYCOLLECTIVE_TRANSPORT=tcp): results equal the
regular path's bit for bit (FAST_TEST_OFF), other frames between calls (point-to-point,
probes, other collectives) are read in order, and a mismatch, a killed peer or a timeout
raise on every rank as on the regular path."""

from __future__ import annotations

import json

import pytest
from tests._launch import REPO, run_ranks

WORKER = REPO / "tests" / "native" / "_fast_worker.py"
OFF = {"FAST_TEST_OFF": "1"}


def _job(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return run_ranks(
        WORKER, 2, args, timeout=timeout, env={"PYCOLLECTIVE_TRANSPORT": "tcp", **(env or {})}
    )


def _lines(r, tag: str) -> list:
    return [json.loads(x[len(tag) + 1 :]) if tag != "DIGEST" else x.split()[1]
            for x in r.stdout.splitlines() if x.startswith(tag + " ")]  # fmt: skip


def _describe(r) -> str:
    return f"rank {r.rank} rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["bits", "mixed", "threads"])
def test_repeated_calls_give_the_regular_paths_bits(scenario: str) -> None:
    fast = _job(scenario)
    regular = _job(scenario, env=OFF)
    for r in fast + regular:
        assert r.returncode == 0, _describe(r)
    # rank by rank: recursive doubling reduces in another order on each rank (complex
    # products, NaN payloads may differ between ranks, as on the regular path)
    for f, p in zip(fast, regular, strict=True):
        assert _lines(f, "DIGEST") == _lines(p, "DIGEST"), (_describe(f), _describe(p))
    for r in fast:
        (counts,) = _lines(r, "FAST")
        # (in "threads" most calls queue behind asynchronous ones: the engine runs them)
        assert counts is not None and counts["calls"] > (0 if scenario == "threads" else 10)
    for r in regular:
        assert _lines(r, "FAST") == [None], _describe(r)
    if scenario == "bits":
        assert _lines(fast[0], "REFUSED") == _lines(regular[0], "REFUSED")
    if scenario == "mixed":  # the late rank's partner waited past the budget: handed over
        assert sum(_lines(r, "FAST")[0]["handed"] for r in fast) >= 2, _describe(fast[0])


@pytest.mark.timeout(60)
def test_the_flight_recorder_shows_repeated_calls_as_regular_ones() -> None:
    fast = _job("flight")
    regular = _job("flight", env=OFF)
    for f, p in zip(fast, regular, strict=True):
        assert f.returncode == 0 and p.returncode == 0, (_describe(f), _describe(p))
        (ff,), (fp,) = _lines(f, "FLIGHT"), _lines(p, "FLIGHT")
        assert ff["times_ok"] and ff == fp, (ff, fp)
        seqs = [e["seq"] for e in ff["entries"]]
        assert seqs == list(range(seqs[0], seqs[0] + 30))
        assert _lines(f, "FAST")[0]["calls"] >= 9, _describe(f)


@pytest.mark.timeout(60)
def test_a_count_mismatch_after_repeated_calls_raises_on_both_ranks() -> None:
    for r in _job("mismatch", "count", env={"PYCOLLECTIVE_TIMEOUT": "20"}):
        (call,) = _lines(r, "RESULT")
        assert call["error"] == "MismatchError", _describe(r)
        assert "count differ" in call["msg"] and "#6" in call["msg"], _describe(r)
        assert call["elapsed"] < 5.0, _describe(r)
        before, after = _lines(r, "FAST")
        assert before["calls"] == 4, _describe(r)  # the first call ran the regular path
        if r.rank == 0:  # rank 1's call is another signature: the regular path
            assert after["handed"] == before["handed"] + 1, _describe(r)


@pytest.mark.timeout(60)
def test_a_peer_killed_while_the_other_waits_in_a_repeated_call_is_named_at_once() -> None:
    results = _job("kill", "1", env={"PYCOLLECTIVE_TIMEOUT": "60"})
    killed_at = _lines(results[1], "RESULT")[0]["at"]
    assert results[1].returncode == -9, _describe(results[1])
    r = results[0]
    (call,) = _lines(r, "RESULT")
    assert call["error"] == "TransportError" and "rank 1" in call["msg"], _describe(r)
    assert call["at"] - killed_at < 0.1, (call["at"] - killed_at, _describe(r))
    before, after = _lines(r, "FAST")
    assert after["handed"] == before["handed"] + 1, _describe(r)  # it was a repeated call


@pytest.mark.timeout(60)
def test_a_timeout_in_a_repeated_call_names_the_rank_waited_on() -> None:
    timeout = 1.5
    results = _job("never", env={"PYCOLLECTIVE_TIMEOUT": str(timeout)})
    r = results[0]
    (call,) = _lines(r, "RESULT")
    assert call["error"] == "CollectiveTimeout", _describe(r)
    assert call["waiting_on"] == [1] and "rank(s) [1]" in call["msg"], _describe(r)
    assert timeout - 0.1 < call["elapsed"] < timeout + 1.0, _describe(r)
    before, after = _lines(r, "FAST")
    assert after["handed"] == before["handed"] + 1, _describe(r)
