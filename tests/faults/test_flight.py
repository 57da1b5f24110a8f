"""The flight recorder: the ring itself, dumps on timeout, error and SIGUSR1, and
`pycollective diagnose` naming the rank that is behind and the call where ranks disagree."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests._launch import REPO, run_ranks

from pycollective._errors import CollectiveTimeout, TransportError, UsageError
from pycollective.observe import diagnose
from pycollective.observe import flight as _flight

WORKER = REPO / "tests" / "faults" / "_flight_worker.py"
FAULTS = REPO / "tests" / "faults" / "_worker.py"


def _diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pycollective", "diagnose", *args],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip


def test_ring_keeps_the_last_n_oldest_first(tmp_path) -> None:
    rec = _flight.FlightRecorder(rank=3, size=4, capacity=4)
    for seq in range(10):
        e = rec.record(7, "g", seq, "all_reduce", seq * 2, None, "ring")
        e.start()
        if seq == 9:
            e.failed(CollectiveTimeout("late", waiting_on=[1, 2]))
        else:
            e.end()
    entries = rec.entries()
    assert [e["seq"] for e in entries] == [6, 7, 8, 9]
    assert [e["state"] for e in entries] == ["completed"] * 3 + ["failed"]
    assert entries[-1]["culprits"] == [1, 2] and "late" in entries[-1]["error"]
    assert all(e["duration_s"] is not None and e["duration_s"] >= 0 for e in entries)
    path = rec.dump("test", str(tmp_path))
    assert path is not None and os.path.basename(path) == f"rank3-{os.getpid()}.json"
    data = json.loads(open(path).read())
    assert data["format"] == _flight.FORMAT and data["rank"] == 3 and data["reason"] == "test"
    assert data["recorded"] == 10 and len(data["entries"]) == 4


def test_disabled_recorder_records_and_dumps_nothing(tmp_path) -> None:
    rec = _flight.FlightRecorder(0, 1, capacity=0)
    e = rec.record(1, "g", 0, "barrier", 0, None, "dissemination")
    e.start()
    e.failed(TransportError("x", peer=1))
    assert rec.entries() == [] and rec.dump("x", str(tmp_path)) is None
    assert os.listdir(tmp_path) == []


def test_capacity_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_FLIGHT_RECORDER", "5")
    assert _flight.FlightRecorder(0, 1).capacity == 5
    monkeypatch.delenv("PYCOLLECTIVE_FLIGHT_RECORDER")
    assert _flight.FlightRecorder(0, 1).capacity == _flight.DEFAULT_ENTRIES
    monkeypatch.setenv("PYCOLLECTIVE_FLIGHT_RECORDER", "nonsense")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_FLIGHT_RECORDER='nonsense'.*whole number"):
        _flight.FlightRecorder(0, 1)


@pytest.mark.timeout(60)
def test_timeout_dumps_and_diagnose_names_the_rank_behind(tmp_path) -> None:
    results = run_ranks(
        WORKER, 3, ("sleep",), timeout=40,
        env={"PYCOLLECTIVE_TIMEOUT": "1.5", "PYCOLLECTIVE_FLIGHT_DIR": str(tmp_path)},
    )  # fmt: skip
    infos = []
    for r in results[:2]:
        line = next(x for x in r.stdout.splitlines() if x.startswith("TIMEOUT "))
        infos.append(json.loads(line[len("TIMEOUT ") :]))
        assert "flight recorder: " in infos[-1]["msg"], infos
    # A rank may hear of the timeout from the other (then it names whom it waited on);
    # whoever timed out on its own names rank 2 and says what rank 2 was last doing: its
    # last data was of the broadcast #4.
    assert any(i["waiting"] == [2] for i in infos), infos
    assert any("rank 2: last sent data of broadcast(#4" in i["msg"] for i in infos), infos
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(f.startswith(("rank0-", "rank1-")) for f in files), files
    culprits = set()
    for name in files:
        last = json.loads((tmp_path / name).read_text())["entries"][-1]
        assert (last["kind"], last["seq"], last["state"]) == ("all_reduce", 5, "failed")
        assert last["count"] == 7 and last["dtype"] == "float64"
        culprits.update(last["culprits"])
    assert 2 in culprits, culprits
    out = _diagnose(str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no dump from rank(s) [2]" in out.stdout, out.stdout
    assert "rank(s) [2] never reached all_reduce #5" in out.stdout, out.stdout
    js = json.loads(_diagnose(str(tmp_path), "--json").stdout)
    facts = [f["facts"] for fs in js.values() for f in fs]
    assert any(f.get("behind") == [2] and f.get("at_seq") == 5 for f in facts), facts


@pytest.mark.timeout(60)
def test_sigusr1_dumps_every_rank_and_diagnose_sees_them_level(tmp_path) -> None:
    results = run_ranks(WORKER, 2, ("usr1",), env={"PYCOLLECTIVE_FLIGHT_DIR": str(tmp_path)})
    for r in results:
        assert r.returncode == 0, r.stderr
        assert "DUMPED true" in r.stdout, r.stdout + r.stderr
    dumps = diagnose.load([str(tmp_path)])
    assert sorted(d["rank"] for d in dumps) == [0, 1]
    assert all(d["reason"] == "SIGUSR1" for d in dumps)
    out = _diagnose(str(tmp_path))
    assert "every rank completed broadcast #4" in out.stdout, out.stdout


@pytest.mark.timeout(60)
def test_mismatch_dumps_and_diagnose_names_the_call_where_ranks_disagree(tmp_path) -> None:
    results = run_ranks(
        FAULTS, 2, ("mismatch", "kind"), env={"PYCOLLECTIVE_FLIGHT_DIR": str(tmp_path)}
    )
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    out = _diagnose(str(tmp_path))
    assert "ranks disagree at call #1: rank 0 called all_reduce #1(" in out.stdout, out.stdout
    assert "rank 1 called broadcast #1(" in out.stdout, out.stdout


def test_diagnose_without_dumps_says_so(tmp_path) -> None:
    out = _diagnose(str(tmp_path))
    assert out.returncode == 1 and "no flight-recorder dumps" in out.stderr
