"""PYCOLLECTIVE_TIMELINE: real 2-rank jobs write Chrome traces with the expected events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests._launch import REPO, run_ranks

from pycollective.observe import flight as _flight
from pycollective.observe import timeline as _timeline
from pycollective.observe.timeline import summarize

WORKER = Path(__file__).with_name("_timeline_worker.py")
LATE = 0.5  # seconds rank 1 arrives late at the all_reduce of 8 elements

# what every rank runs, in order (init_process_group ends with a barrier)
EXPECTED = [
    ("barrier", 0),
    ("all_reduce", 4096),
    ("all_reduce", 4096),
    ("all_reduce", 4096),
    ("broadcast", 4096),
    ("all_gather", 4096),
    ("p2p", 64),
    ("all_reduce", 32),
    ("all_reduce", 4096),
]


def _ops(trace: dict, rank: int) -> list[dict]:
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
    return sorted(ops, key=lambda e: e["ts"])


def check_trace(trace: dict, ranks: list[int], shm: bool) -> None:
    """Valid Chrome trace events, the expected operations per rank, sane times."""
    assert trace["displayTimeUnit"] == "ms"
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    for rank in ranks:
        assert (rank, "process_name") in names and (rank, "thread_name") in names
        ops = _ops(trace, rank)
        assert [(e["cat"], e["args"]["bytes"]) for e in ops] == EXPECTED, ops
        for e in ops:
            assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid", "args"}
            assert e["dur"] >= 0 and e["args"]["wait_us"] >= 0
            assert e["args"]["wait_us"] <= e["dur"] + 0.01  # rounding to a nanosecond
            assert e["args"]["queued_us"] >= 0
        # one call at a time per rank: each starts after the one before ended
        for a, b in zip(ops, ops[1:], strict=False):
            assert b["ts"] >= a["ts"] + a["dur"] - 0.01
        colls = [e for e in ops if e["cat"] not in ("p2p",)]
        assert {e["args"]["dtype"] for e in colls if e["cat"] != "barrier"} == {"float32"}
        algos = {e["args"]["algorithm"] for e in colls if e["cat"] == "all_reduce"}
        assert (algos == {"shm"}) if shm else ("shm" not in algos), algos
        assert ops[1]["args"]["op"] == "SUM" and ops[4]["args"]["root"] == 0
    # rank 0 waited for late rank 1 in the all_reduce of 8 elements (it cannot have
    # finished before rank 1 arrived), and that wait was measured as waiting
    if 0 in ranks:
        late_call = _ops(trace, 0)[7]
        assert late_call["dur"] >= LATE * 1e6 * 0.5
        assert late_call["args"]["wait_us"] >= LATE * 1e6 * 0.5


@pytest.mark.timeout(90)
def test_pycollective_run_merges_the_ranks_trace(tmp_path) -> None:
    template = tmp_path / "trace.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLLECTIVE_")}
    env["PYCOLLECTIVE_TIMELINE"] = str(template)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective",
            "run",
            "-n",
            "2",
            sys.executable,
            str(WORKER),
            str(LATE),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"timeline in {template}" in proc.stderr
    for rank in (0, 1):
        own = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())
        assert own["otherData"]["rank"] == rank and own["otherData"]["world_size"] == 2
        assert {e["pid"] for e in own["traceEvents"]} == {rank}
        check_trace(own, [rank], shm=True)
    merged = json.loads(template.read_text())
    assert merged["otherData"]["ranks"] == [0, 1]
    assert min(e["ts"] for e in merged["traceEvents"] if e["ph"] == "X") == 0
    check_trace(merged, [0, 1], shm=True)
    lines = summarize(merged)
    assert any(line.split()[:3] == ["0", "all_reduce", "5"] for line in lines), lines


@pytest.mark.timeout(90)
def test_tcp_job_without_our_launcher_and_merge_by_hand(tmp_path) -> None:
    template = tmp_path / "t-{rank}.json"
    results = run_ranks(
        WORKER,
        2,
        (str(LATE),),
        env={"PYCOLLECTIVE_TIMELINE": str(template), "PYCOLLECTIVE_TRANSPORT": "tcp"},
        timeout=80,
    )
    for r in results:
        assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["t-0.json", "t-1.json"]
    out = tmp_path / "merged.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective", "timeline", "merge", str(template), "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    check_trace(json.loads(out.read_text()), [0, 1], shm=False)
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective", "timeline", "summary", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "waiting(ms)" in proc.stdout, proc.stderr


def test_off_by_default_and_file_names(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(_timeline.ENV, raising=False)
    recorder = _flight.FlightRecorder(0, 1, capacity=4)
    assert recorder.timeline is None
    assert type(recorder.record(1, "g", 0, "all_reduce", 4, None, "ring")) is _flight.Entry
    assert _timeline.rank_path("a/trace.json", 3) == "a/trace.rank3.json"
    assert _timeline.rank_path("t-{rank}.json", 12) == "t-12.json"
    assert _timeline.rank_path("trace", 1) == "trace.rank1"
    for name in ("x.rank1.json", "x.rank0.json", "x.rank10.json", "x.json", "y.rank2.json"):
        (tmp_path / name).write_text("{}")
    assert [Path(p).name for p in _timeline.rank_files(str(tmp_path / "x.json"))] == [
        "x.rank0.json",
        "x.rank1.json",
        "x.rank10.json",
    ]


def test_recorded_entry_reaches_the_trace(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(_timeline, "_current", None)
    monkeypatch.setenv(_timeline.ENV, str(tmp_path / "one.json"))
    monkeypatch.setattr(_timeline.WAIT, "on", False)
    # flight ring off, timeline on (a World makes its recorder this way)
    recorder = _flight.FlightRecorder(0, 1, capacity=0, timeline=_timeline.from_env(0, 1))
    tl = recorder.timeline
    assert tl is not None and _timeline.WAIT.on
    e = recorder.record(7, "g", 3, "broadcast", 10, None, "tree", root=0)
    e.start()
    _timeline.WAIT.total += 0.001  # what a transport adds while it blocks
    e.end()
    path = tl.write()
    assert path == str(tmp_path / "one.rank0.json")
    (event,) = [x for x in json.loads(Path(path).read_text())["traceEvents"] if x["ph"] == "X"]
    assert event["cat"] == "broadcast" and event["args"]["seq"] == 3
    assert event["args"]["wait_us"] == pytest.approx(1000.0)
