"""train.py under failures, on a tiny synthetic dataset: --max-restarts resumes from the
checkpoint, and --mode elastic (pycollective.elastic with the DDP-shaped wrappers) goes on
without the killed worker, takes in a replacement, and ends with every member holding the
same parameters and optimizer state, bit for bit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from tests._launch import REPO
from tests.examples.test_fashion_mnist import _write_dataset

TRAIN = REPO / "examples" / "fashion_mnist" / "train.py"


@pytest.fixture
def synthetic(tmp_path):
    (tmp_path / "data").mkdir()
    _write_dataset(tmp_path / "data", n_train=512, n_test=128)
    return tmp_path


def _run(tmp_path, launch: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pycollective", "run", *launch, sys.executable, str(TRAIN),
           "--data-dir", str(tmp_path / "data"), "--no-progress", *args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(180)
def test_a_restarted_job_resumes_from_its_checkpoint(synthetic):
    # one rank (the cheapest job): killed in update 10, restarted, resumed from update 8
    ck = synthetic / "ck.pt"
    res = _run(synthetic, ["-n", "1", "--max-restarts", "1"],
               "--mode", "single", "--samples", "512", "--batch", "32",
               "--checkpoint", str(ck), "--checkpoint-every", "4", "--kill-at", "10",
               "--kill-rank", "0", "--eval-points", "2")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 was killed by SIGKILL" in res.stderr
    assert "restarting every rank (restart 1 of 1)" in res.stderr
    assert "[rank 0]: resumed from" in res.stdout and "at update 8 (restart 1)" in res.stdout
    assert "single x1 (accumulate 1): test accuracy" in res.stdout


@pytest.mark.timeout(240)
def test_elastic_mode_loses_a_worker_takes_a_replacement_and_stays_identical(synthetic):
    log = synthetic / "steps.jsonl"
    # two workers (the fewest torch processes): one is killed, the other goes on alone
    res = _run(synthetic, ["-n", "2", "--elastic", "1:2", "--max-restarts", "1"],
               "--mode", "elastic", "--samples", "12000", "--batch", "24", "--kill-at", "12",
               "--kill-rank", "1", "--steps-log", str(log))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 1 was killed by SIGKILL; 1 rank goes on and rank 2 starts to replace it" in (
        res.stderr
    )
    finals = [json.loads(m) for m in re.findall(r"^\[rank \d\]: FINAL (\{.*\})$", res.stdout, re.M)]
    assert sorted(f["launcher_rank"] for f in finals) == ["0", "2"]
    assert len({f["digest"] for f in finals}) == 1  # bit for bit, the replacement too
    assert {f["step"] for f in finals} == {500}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [s for s in lines if "step" in s]
    assert [k["killed"] for k in lines if "killed" in k] == [12]
    # every update committed once, in order, none lost: the curve has no gap
    assert [s["step"] for s in steps] == list(range(1, 501))
    members = [s["members"] for s in steps]
    assert members[0] == 2 and 1 in members and members[-1] == 2  # lost one, got one back
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(steps[:-1], steps[1:], strict=True)) < 2.5
