"""The parameter server in real processes, started by `pycollective run --servers`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

import torch

WORKER = REPO / "tests" / "ps" / "ps_worker.py"


def _launch(tmp_path, workers: int, servers: int, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", str(workers), "--servers",
         str(servers), str(WORKER), "ps", str(tmp_path / "ps"), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip


def _load(prefix, n: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(f"{prefix}.rank{r}.pt") for r in range(n)]


@pytest.mark.timeout(150)
def test_sync_ps_workers_identical_and_match_allreduce(tmp_path) -> None:
    # two servers: the flat parameter vector is really split between them
    res = _launch(tmp_path, 2, 2, "--steps", "15")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "server 0 updates=15 pushes=32" in res.stdout  # 15 steps + the stop, x 2 workers
    assert "server 1 updates=15" in res.stdout
    ps_states = _load(tmp_path / "ps", 2)
    for k in ps_states[0]:
        assert torch.equal(ps_states[0][k], ps_states[1][k]), f"workers differ in {k}"

    assert_all_ok(run_ranks(WORKER, 2, ("allreduce", str(tmp_path / "ar"), "--steps", "15")))
    ar = _load(tmp_path / "ar", 2)
    diff = max((ps_states[0][k] - ar[0][k]).abs().max().item() for k in ar[0])
    assert diff < 1e-5
    moved = max(
        (ps_states[0][k] - v).abs().max().item()
        for k, v in _ps_worker().model().state_dict().items()
    )
    assert moved > 1e-2  # the runs trained: equality is not between two initial states


@pytest.mark.timeout(120)
def test_async_ps_applies_every_push(tmp_path) -> None:
    res = _launch(tmp_path, 2, 1, "--steps", "10", "--ps-mode", "async")
    assert res.returncode == 0, res.stderr[-3000:]
    # async: each push is an update of its own (2 workers x 10 steps), no averaging
    assert "server 0 updates=20 pushes=22" in res.stdout
    for line in res.stdout.splitlines():
        if "worker" in line:
            assert "steps=10" in line


def _ps_worker():
    sys.path.insert(0, str(WORKER.parent))
    try:
        import ps_worker
    finally:
        sys.path.pop(0)
    return ps_worker
