"""init_process_group's ways in: tcp://, file://, store=, and a world of one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from tests._launch import REPO, free_port

import pycollective as dist

WORKER = REPO / "tests" / "api" / "init_worker.py"


def _run(method: str, world: int, where: str) -> list[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYCOLLECTIVE_STORE_HOSTED")
    }
    env["PYCOLLECTIVE_TIMEOUT"] = "30"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), method, str(r), str(world), where],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err[-3000:]
            outs.append(out.strip())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["tcp", "store", "file"])
def test_init_methods(method: str, tmp_path) -> None:
    world = 3
    where = str(tmp_path / "rendezvous") if method == "file" else f"127.0.0.1:{free_port()}"
    outs = _run(method, world, where)
    for r, line in enumerate(outs):
        assert line == f"rank {r}/{world} sum=[6, 6, 6] bcast=[2]"


def test_world_of_one_without_any_environment(monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    dist.init_process_group()
    try:
        assert dist.is_initialized()
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        x = np.arange(5.0)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        assert np.array_equal(x, np.arange(5.0))
        with pytest.raises(dist.UsageError):
            dist.init_process_group()
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        dist.get_rank()


def test_bad_backend_and_ranks(monkeypatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(dist.UsageError, match="GPU"):
        dist.init_process_group("nccl")
    with pytest.raises(dist.UsageError, match="out of range"):
        dist.init_process_group(rank=3, world_size=2)
    assert not dist.is_initialized()
