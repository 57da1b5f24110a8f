"""Calibration with real ranks: `pycollective calibrate` writes sane numbers to the cache,
and PYCOLLECTIVE_CALIBRATE=1 calibrates at init with every rank adopting the same ones."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

from pycollective.tuning import cache as _costcache

WORKER = Path(__file__).with_name("_calib_worker.py")


@pytest.mark.timeout(180)
def test_calibrate_command_caches_positive_numbers(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    out = tmp_path / "cal.json"
    env = {**__import__("os").environ, "PYCOLLECTIVE_COST_CACHE": str(cache)}
    env.pop("PYCOLLECTIVE_COST_TCP", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective", "calibrate", "-n", "2,3", "--budget", "0.3",
         "--force", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "after (" in proc.stdout and str(cache) in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["world_size"] for r in runs] == [2, 3]
    for run in runs:
        for name, value in run["params"].items():
            assert math.isfinite(value) and value > 0, (name, value)
        assert run["measured"] and all(m["seconds"] > 0 for m in run["measured"])
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", str(cache))
    cached = _costcache.load("tcp")
    assert cached is not None
    assert cached.gamma == runs[-1]["params"]["gamma"]
    # sane: a round costs between a microsecond and a second, a byte less than a microsecond
    assert 1e-6 < cached.alpha < 1.0 and 0 < cached.beta < 1e-6 and 0 < cached.gamma < 1e-6


@pytest.mark.timeout(120)
def test_calibration_at_init_is_the_same_on_every_rank(tmp_path) -> None:
    env = {"PYCOLLECTIVE_CALIBRATE": "1", "PYCOLLECTIVE_COST_CACHE": "off"}
    results = run_ranks(WORKER, 2, env=env, timeout=110)
    assert_all_ok(results)
    seen = {next(ln for ln in r.stdout.splitlines() if ln.startswith("PARAMS ")) for r in results}
    assert len(seen) == 1, seen
    # the defaults would print these; a calibration replaced gamma at least
    assert "gamma=1.2e-10" not in seen.pop()


def test_calibration_needs_two_ranks(monkeypatch) -> None:
    import pycollective as dist
    from pycollective.api.calibrate import calibrate

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group()
    try:
        with pytest.raises(dist.UsageError, match="2 ranks or more"):
            calibrate(save=False)
    finally:
        dist.destroy_process_group()
