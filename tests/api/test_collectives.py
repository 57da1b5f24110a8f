"""Every collective x dtype x op x algorithm in real processes over real sockets, started
the way torchrun starts ranks (environment variables). The checks themselves live in
battery.py and run on every rank. The same battery runs under our launcher, real torchrun,
mpirun, mpiexec.hydra and srun in test_launchers.py and test_slurm.py; the schedules
themselves at every world size 1..16 in tests/schedule, without I/O."""

from __future__ import annotations

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

BATTERY = REPO / "tests" / "api" / "battery.py"


@pytest.mark.timeout(240)
# 1-5 (one rank, two, odd and power-of-two counts) and 8 (more ranks than cores several
# times over, a power of two beyond 4): 6 and 7 would add no other kind of layout here.
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])  # (5: as 3, odd; and time)
def test_every_collective_torchrun_env(world_size: int) -> None:
    # Full matrix at small sizes, the quick one (fewer counts and roots) where ranks
    # outnumber this machine's cores several times over.
    args = () if world_size <= 4 else ("--quick",)
    assert_all_ok(run_ranks(BATTERY, world_size, args=args, timeout=220))


@pytest.mark.timeout(240)
# At 3 ranks: test_launchers.py's test_torchrun_battery runs it at 2 under real torchrun.
@pytest.mark.parametrize("world_size", [3])
def test_torch_tensors(world_size: int) -> None:
    pytest.importorskip("torch")
    assert_all_ok(run_ranks(BATTERY, world_size, args=("--quick", "--torch"), timeout=220))
