"""Every collective x dtype x op x algorithm in real processes over real sockets, at world
sizes 1..8, started the way torchrun starts ranks (environment variables) and through our
own launcher. The checks themselves live in battery.py and run on every rank."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

BATTERY = REPO / "tests" / "api" / "battery.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_collective_torchrun_env(world_size: int) -> None:
    # Full matrix at small sizes, the quick one (fewer counts and roots) where ranks
    # outnumber this machine's cores several times over.
    args = () if world_size <= 4 else ("--quick",)
    assert_all_ok(run_ranks(BATTERY, world_size, args=args, timeout=220))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_tensors(world_size: int) -> None:
    pytest.importorskip("torch")
    assert_all_ok(run_ranks(BATTERY, world_size, args=("--quick", "--torch"), timeout=220))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [1, 3, 5])
def test_every_collective_through_launcher(world_size: int) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pycollective",
            "run",
            "-n",
            str(world_size),
            sys.executable,
            str(BATTERY),
            "--quick",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for rank in range(world_size):
        assert f"[rank {rank}]: rank {rank}: " in proc.stdout
    assert "0 failures" in proc.stdout
