"""`pycollective bench`: a tiny run end to end (table, JSON, plot), and its helpers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests._launch import REPO

from pycollective.cli import bench
from pycollective.cli.bench_worker import BUS_FACTOR, per_rank_count


def test_sizes_and_factors() -> None:
    assert bench.parse_size("4") == 4
    assert bench.parse_size("64K") == 64 << 10
    assert bench.parse_size("256MiB") == 256 << 20
    assert bench.sizes(4, 256 << 20, 4)[:3] == [4, 16, 64]
    assert bench.sizes(4, 256 << 20, 4)[-1] == 256 << 20
    assert BUS_FACTOR["all_reduce"](4) == 1.5 and BUS_FACTOR["all_gather"](4) == 0.75
    assert BUS_FACTOR["broadcast"](8) == 1.0
    # nccl-tests sizes: the larger buffer; per-rank counts never 0
    assert per_rank_count("all_gather", 64, 2, 4) == 8
    assert per_rank_count("all_reduce", 64, 2, 4) == 16
    assert per_rank_count("reduce_scatter", 4, 4, 4) == 1


@pytest.mark.timeout(120)
def test_bench_runs_end_to_end(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective",
            "bench",
            "-n",
            "2",
            "-t",
            "shm,tcp",
            "-c",
            "all_reduce,reduce_scatter,barrier",
            "-a",
            "auto,ring",
            "-b",
            "4",
            "-e",
            "4K",
            "-f",
            "32",
            "--reps",
            "3",
            "--min-reps",
            "2",
            "--budget",
            "0.05",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "busbw(GB/s)" in proc.stdout and "auto->shm" in proc.stdout
    assert "side by side" in proc.stdout and "tcp/shm" in proc.stdout
    data = json.loads(out_json.read_text())
    recs = data["records"]
    seen = {(r["transport"], r["collective"], r["algorithm"]) for r in recs}
    assert ("shm", "all_reduce", "auto") in seen and ("tcp", "all_reduce", "ring") in seen
    assert ("shm", "barrier", "auto") in seen
    for r in recs:
        assert r["time_us"] > 0 and r["reps"] >= 2
        if r["collective"] == "all_reduce":
            assert r["busbw"] == pytest.approx(r["algbw"] * 1.0)  # 2(p-1)/p at p=2
    assert out_png.stat().st_size > 1000
