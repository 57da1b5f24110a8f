"""Where torch.distributed defines the answer, pycollective gives the same one: checked
against torch's own functions in this process (a world of one for each), and in a real
two-rank job for what needs a non-member."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pycollective as dist
from pycollective._errors import UsageError

torch = pytest.importorskip("torch")
td = pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.timeout(60)

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID", "PYCOLLECTIVE_STORE_HOSTED")  # fmt: skip
LAUNCH_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL")


@pytest.fixture
def alone(monkeypatch):
    """No launcher in the environment; both libraries' default groups torn down after."""
    for key in list(os.environ):
        if key in LAUNCH_VARS or key.startswith(LAUNCH_PREFIXES):
            monkeypatch.delenv(key)
    yield monkeypatch
    dist.destroy_process_group()
    if td.is_initialized():
        td.destroy_process_group()


def torch_world_of_one() -> None:
    td.init_process_group("gloo", store=td.HashStore(), rank=0, world_size=1)


def raises(fn) -> type[BaseException] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return type(exc)
    return None


def test_a_string_or_int_op_is_refused_as_torch_refuses_it(alone):
    torch_world_of_one()
    dist.init_process_group()
    for op in ("sum", "SUM", 0):
        assert raises(lambda op=op: td.all_reduce(torch.ones(2), op=op)) is not None
        with pytest.raises(UsageError, match=r"op must be a ReduceOp \(e\.g\. ReduceOp\."):
            dist.all_reduce(np.ones(2), op=op)
    # torch's own ReduceOp and ours both work in both
    x = np.ones(2)
    dist.all_reduce(x, op=td.ReduceOp.MAX)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    assert x.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("device_id", ["cpu", 0, "cuda:0"])
def test_init_device_id_is_refused_on_cpus_as_torch_does(alone, device_id):
    dev = device_id if isinstance(device_id, int) else torch.device(device_id)
    theirs = raises(
        lambda: td.init_process_group(
            "gloo", store=td.HashStore(), rank=0, world_size=1, device_id=dev
        )  # fmt: skip
    )
    assert theirs is not None and issubclass(theirs, ValueError)
    with pytest.raises(ValueError, match="pycollective runs on CPUs: leave device_id out"):
        dist.init_process_group(device_id=dev)
    assert not dist.is_initialized()


def test_barrier_device_ids(alone):
    torch_world_of_one()
    dist.init_process_group()
    td.barrier(device_ids=[0])  # torch on CPUs: accepted
    dist.barrier(device_ids=[0])
    for bad in ([], 0, ["0"], "cuda:0"):
        with pytest.raises(UsageError, match="device_ids must be a list of one device id"):
            dist.barrier(device_ids=bad)


def test_helpers_answer_as_torch_does(alone):
    for name in ("nccl", "ucc", "xccl", "gloo"):
        assert getattr(dist, f"is_{name}_available")() == getattr(td, f"is_{name}_available")()
    assert dist.is_backend_available("gloo") and not dist.is_backend_available("nccl")
    assert dist.is_mpi_available()  # backend="mpi" runs on pycollective
    assert dist.is_torchelastic_launched() is td.is_torchelastic_launched() is False
    alone.setenv("TORCHELASTIC_RUN_ID", "job")
    assert dist.is_torchelastic_launched() is td.is_torchelastic_launched() is True
    alone.delenv("TORCHELASTIC_RUN_ID")
    with pytest.raises(RuntimeError):
        td.get_node_local_rank()
    with pytest.raises(RuntimeError, match="fallback_rank"):
        dist.get_node_local_rank()
    assert dist.get_node_local_rank(fallback_rank=3) == td.get_node_local_rank(3) == 3
    alone.setenv("LOCAL_RANK", "2")
    assert dist.get_node_local_rank(fallback_rank=3) == td.get_node_local_rank(3) == 2
    alone.delenv("LOCAL_RANK")
    # beyond torch: other launchers' local rank
    alone.setenv("OMPI_COMM_WORLD_RANK", "5")
    alone.setenv("OMPI_COMM_WORLD_SIZE", "8")
    alone.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    alone.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    alone.setenv("MASTER_ADDR", "127.0.0.1")
    assert dist.get_node_local_rank() == 1


def test_non_member_world_size_is_minus_one_in_a_real_job():
    code = textwrap.dedent(
        """
        import pycollective as dist
        dist.init_process_group()
        g = dist.new_group([0])
        print("SIZES", dist.get_rank(g), dist.get_world_size(g), dist.get_world_size())
        dist.destroy_process_group()
        """
    )
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = sorted(line.split("SIZES ")[1] for line in res.stdout.splitlines() if "SIZES" in line)
    # torch documents -1 for both on a rank outside the group
    assert got == ["-1 -1 2", "0 1 2"]
