"""train.py under failures, on a tiny synthetic dataset: --mode elastic (pycollective.elastic
with the DDP-shaped wrappers) goes on without the killed worker, takes in a replacement, and
ends with every member holding the same parameters and optimizer state, bit for bit.
(--max-restarts resuming from the checkpoint is checked in test_fashion_mnist.py, on the
one-process run that the DDP runs are compared with.)"""

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


@pytest.mark.timeout(180)  # the run's own bound is 150 s
def test_elastic_mode_loses_a_worker_takes_a_replacement_and_stays_identical(synthetic):
    log = synthetic / "steps.jsonl"
    # two workers (the fewest torch processes): one is killed, the other goes on alone.
    # 500 updates are the allowance for the replacement's start (a torch import, seconds on
    # a loaded machine); the run stops 10 updates after it joined, which is enough to show
    # that it trains in step with the survivor (the digests) without running out the 500.
    res = _run(synthetic, ["-n", "2", "--elastic", "1:2", "--max-restarts", "1"],
               "--mode", "elastic", "--samples", "12000", "--batch", "24", "--kill-at", "12",
               "--kill-rank", "1", "--steps-log", str(log),
               "--stop-after-rejoin", "10")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 1 was killed by SIGKILL; 1 rank goes on and rank 2 starts to replace it" in (
        res.stderr
    )
    finals = [json.loads(m) for m in re.findall(r"^\[rank \d\]: FINAL (\{.*\})$", res.stdout, re.M)]
    assert sorted(f["launcher_rank"] for f in finals) == ["0", "2"]
    assert len({f["digest"] for f in finals}) == 1  # bit for bit, the replacement too
    (last,) = {f["step"] for f in finals}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [s for s in lines if "step" in s]
    assert [k["killed"] for k in lines if "killed" in k] == [12]
    # every update committed once, in order, none lost: the curve has no gap
    assert [s["step"] for s in steps] == list(range(1, last + 1))
    members = [s["members"] for s in steps]
    assert members[0] == 2 and 1 in members and members[-1] == 2  # lost one, got one back
    # stopped 10 updates after the round the replacement joined, well before the allowance
    rejoined = members.index(2, members.index(1))
    assert last == rejoined + 10 < 500 and members[rejoined:] == [2] * 10
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(steps[:-1], steps[1:], strict=True)) < 2.5


def test_stop_after_rejoin_is_checked() -> None:
    sys.path.insert(0, str(TRAIN.parent))
    try:
        import train
    finally:
        sys.path.remove(str(TRAIN.parent))
    assert train.parse(["--mode", "elastic", "--stop-after-rejoin", "5"]).stop_after_rejoin == 5
    for bad in (["--mode", "elastic", "--stop-after-rejoin", "-1"],
                ["--mode", "single", "--stop-after-rejoin", "5"]):  # fmt: skip
        with pytest.raises(SystemExit):
            train.parse(bad)
