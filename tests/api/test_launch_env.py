"""Who am I, from each launcher's environment: `_launch_env.detect(env)` on the variables each
launcher really sets (captured from torchrun 2.13, OpenMPI 4.1 and MPICH 4.0 hydra; srun's from
its manual), and init_process_group's messages for bad input. Pure and fast: no process starts."""

from __future__ import annotations

import datetime
import os
import socket

import pytest

import pycollective as dist
from pycollective import StoreError, UsageError
from pycollective import _launch_env as le
from pycollective.core import rendezvous

LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_", "MPI_LOCAL")
LAUNCHER_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYCOLLECTIVE_STORE_HOSTED",
    "PYCOLLECTIVE_NNODES",
)


def torchrun_env(rank: int, world: int = 2, **extra: str) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "37393",
        "TORCHELASTIC_RUN_ID": "e75cb405",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra)
    return env


def ompi_env(
    rank: int, world: int = 2, local: int | None = None, job: str = "1413808129", **extra: str
) -> dict[str, str]:
    local = world if local is None else local
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local),
        "OMPI_COMM_WORLD_NODE_RANK": str(rank % local),
        "OMPI_MCA_ess_base_jobid": job,
        "OMPI_MCA_ess_base_vpid": str(rank),
        "PMIX_NAMESPACE": job,
        "PMIX_RANK": str(rank),
        "PMIX_ID": f"{job}.{rank}",
        "OMPI_MCA_orte_num_nodes": "1",
        "OMPI_MCA_orte_hnp_uri": f"{int(job) - 1}.0;tcp://192.0.2.2:34413",
    }
    env.update(extra)
    return env


def srun_env(
    rank: int, world: int = 2, job: str = "4242", step: str = "0", nnodes: int = 1, **extra: str
) -> dict[str, str]:
    per_node = world // nnodes
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NODEID": str(rank // per_node),
        "SLURM_NTASKS": str(world),
        "SLURM_NPROCS": str(world),
        "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_STEP_ID": step,
        "SLURM_STEPID": step,
        "SLURM_STEP_NODELIST": "node01" if nnodes == 1 else f"node[01-{nnodes:02d}]",
        "SLURM_JOB_NODELIST": "node01" if nnodes == 1 else f"node[01-{nnodes:02d}]",
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nnodes})" if nnodes > 1 else str(world),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nnodes})" if nnodes > 1 else str(world),
    }
    env.update(extra)
    return env


def hydra_env(rank: int, world: int = 2, **extra: str) -> dict[str, str]:
    env = {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(world),
        "PMI_FD": str(6 + 2 * rank),
        "MPI_LOCALRANKID": str(rank),
        "MPI_LOCALNRANKS": str(world),
        "MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "vm",
    }
    env.update(extra)
    return env


@pytest.fixture
def no_scontrol(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("scontrol is not installed here")

    monkeypatch.setattr(le.subprocess, "run", refuse)


# --- torchrun, our launcher, plain variables -------------------------------------------------


def test_torchrun_uses_the_agent_store_under_an_attempt_prefix():
    env = le.detect(torchrun_env(1))
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("torchrun", 1, 2, 1)
    assert (env.master_addr, env.master_port, env.store_host) == (
        "localhost",
        37393,
        "torchelastic",
    )
    assert env.store_prefix == "pycollective/torchelastic/e75cb405/attempt0"
    assert not env.multi_node and not env.port_derived
    again = le.detect(torchrun_env(1, TORCHELASTIC_RESTART_COUNT="1"))
    assert again.store_prefix != env.store_prefix  # a restart never reads the old addresses


def test_torchrun_across_nodes_leaves_the_restart_count_out():
    # Agents count restarts each on their own, so the count may differ between nodes.
    env = le.detect(
        torchrun_env(
            3,
            4,
            LOCAL_WORLD_SIZE="2",
            LOCAL_RANK="1",
            GROUP_RANK="1",
            GROUP_WORLD_SIZE="2",
            TORCHELASTIC_RESTART_COUNT="2",
        )
    )
    assert env.multi_node and env.local_world_size == 2
    assert env.store_prefix == "pycollective/torchelastic/e75cb405"


def test_torchrun_without_the_shared_agent_store_has_rank0_host():
    env = le.detect(torchrun_env(0, TORCHELASTIC_USE_AGENT_STORE="False"))
    assert (env.launcher, env.store_host, env.store_prefix) == ("torchrun", "rank0", "")


def test_our_launcher_and_plain_variables():
    ours = le.detect(
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "2",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "PYCOLLECTIVE_STORE_HOSTED": "1",
        }
    )
    assert (ours.launcher, ours.store_host, ours.rank, ours.store_prefix) == (
        "pycollective",
        "launcher",
        2,
        "",
    )
    plain = le.detect({"RANK": "0", "WORLD_SIZE": "2"})
    assert (plain.launcher, plain.store_host, plain.master_addr) == ("env", "rank0", None)
    multi = le.detect({"RANK": "0", "WORLD_SIZE": "4", "PYCOLLECTIVE_NNODES": "2"})
    assert multi.multi_node


def test_no_launcher_is_a_world_of_one():
    env = le.detect({"HOME": "/root"})
    assert (env.launcher, env.rank, env.world_size) == ("none", None, None)


def test_rank_variables_win_over_the_mpi_ones():
    # torchrun or `pycollective run` started inside an mpirun or srun job
    env = le.detect({**ompi_env(1), **srun_env(1), **torchrun_env(0)})
    assert (env.launcher, env.rank) == ("torchrun", 0)


def test_non_integer_variable_is_named():
    with pytest.raises(UsageError, match=r"RANK='zero' is not an integer"):
        le.detect({"RANK": "zero", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="OMPI_COMM_WORLD_SIZE"):
        le.detect(ompi_env(0, OMPI_COMM_WORLD_SIZE="two"))


# --- OpenMPI mpirun ---------------------------------------------------------------------------


def test_mpirun_ranks_of_one_job_derive_one_port():
    envs = [le.detect(ompi_env(r, 3)) for r in range(3)]
    assert [e.rank for e in envs] == [0, 1, 2]
    assert {e.launcher for e in envs} == {"mpirun"}
    assert {(e.master_addr, e.master_port, e.store_prefix) for e in envs} == {
        ("127.0.0.1", envs[0].master_port, envs[0].store_prefix)
    }
    assert envs[0].port_derived and envs[0].store_prefix.startswith("pycollective/mpirun/")
    assert 20000 <= envs[0].master_port < 32768  # below the kernel's ephemeral ports


def test_mpirun_jobs_differ_by_job_id_and_by_mpirun():
    a = le.detect(ompi_env(0, job="1413808129"))
    b = le.detect(ompi_env(0, job="562298881"))
    assert a.master_port != b.master_port and a.store_prefix != b.store_prefix
    # Same 16-bit job family from two mpiruns: mpirun's own address still tells them apart.
    c = le.detect(ompi_env(0, OMPI_MCA_orte_hnp_uri="1413808128.0;tcp://192.0.2.2:40001"))
    assert c.store_prefix != a.store_prefix


def test_mpirun_without_pmix_namespace_uses_the_ess_job_id():
    env = ompi_env(1)
    del env["PMIX_NAMESPACE"]
    assert le.detect(env).master_port == le.detect(ompi_env(1)).master_port


def test_mpirun_given_master_port_is_used_as_is():
    env = le.detect(ompi_env(0, MASTER_PORT="29511"))
    assert (env.master_port, env.port_derived, env.store_prefix) == (29511, False, "")


def test_mpirun_across_hosts_needs_master_addr():
    with pytest.raises(
        UsageError,
        match=r"mpirun across several hosts without MASTER_ADDR.*"
        r"mpirun -x MASTER_ADDR=",
    ):
        le.detect(ompi_env(3, 4, local=2))
    env = le.detect(ompi_env(3, 4, local=2, MASTER_ADDR="10.0.0.5"))
    assert env.multi_node and env.master_addr == "10.0.0.5" and env.local_rank == 1


# --- Slurm srun -------------------------------------------------------------------------------


def test_srun_single_node():
    envs = [le.detect(srun_env(r, 3)) for r in range(3)]
    assert [(e.launcher, e.rank, e.world_size, e.local_rank) for e in envs] == [
        ("slurm", r, 3, r) for r in range(3)
    ]
    assert len({e.master_port for e in envs}) == 1
    assert envs[0].master_addr == "127.0.0.1" and not envs[0].multi_node
    assert envs[0].store_prefix == "pycollective/slurm/4242.0"


def test_srun_steps_and_jobs_differ():
    ports = {
        le.detect(srun_env(0, job=j, step=s)).master_port
        for j, s in (("4242", "0"), ("4242", "1"), ("4243", "0"))
    }
    assert len(ports) == 3


def test_srun_step_inside_a_bigger_allocation_counts_the_step():
    env = le.detect(srun_env(1, 2, SLURM_NTASKS="2", SLURM_JOB_NUM_NODES="4"))
    assert env.world_size == 2 and not env.multi_node


def test_srun_across_nodes_finds_the_first_host(no_scontrol):
    env = le.detect(srun_env(5, 8, nnodes=4))
    assert env.multi_node and env.master_addr == "node01"
    assert (env.local_rank, env.local_world_size) == (1, 2)


def test_first_slurm_host_parses_node_lists(no_scontrol):
    assert le._first_slurm_host("node[03-05,07],gpu1") == "node03"
    assert le._first_slurm_host("gpu1,gpu2") == "gpu1"
    assert le._first_slurm_host("login") == "login"


def test_slurm_tasks_per_node():
    assert le._tasks_on_node("2(x3),1", 0) == 2
    assert le._tasks_on_node("2(x3),1", 3) == 1
    assert le._tasks_on_node("2(x3),1", 4) is None
    assert le._tasks_on_node("junk", 0) is None
    env = le.detect(
        srun_env(
            6, 7, nnodes=4, SLURM_NODEID="3", SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE="2(x3),1"
        )
    )
    assert env.local_world_size == 1


@pytest.mark.parametrize("step", [None, "4294967291", "4294967294", "batch"])
def test_a_batch_script_is_not_an_srun_step(step):
    # sbatch gives its script SLURM_PROCID=0 and the allocation's SLURM_NTASKS; it is one
    # process, and waiting for the other "ranks" would hang forever.
    env = srun_env(0, 8)
    for k in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"):
        env.pop(k)
    if step is not None:
        env["SLURM_STEP_ID"] = step
    assert le.detect(env).launcher == "none"


def test_srun_multi_node_without_a_node_list_needs_master_addr(no_scontrol):
    env = srun_env(0, 4, nnodes=2)
    del env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"]
    with pytest.raises(UsageError, match="slurm across several hosts without MASTER_ADDR"):
        le.detect(env)


# --- PMI (MPICH hydra, Slurm pmi2) ------------------------------------------------------------


def test_pmi_with_a_kvs_name():
    envs = [le.detect(hydra_env(r, 2, PMI_KVSNAME="kvs_123_0")) for r in range(2)]
    assert [(e.launcher, e.rank, e.local_rank) for e in envs] == [("pmi", 0, 0), ("pmi", 1, 1)]
    assert envs[0].master_port == envs[1].master_port
    assert envs[0].store_prefix == "pycollective/pmi/kvs_123_0"


def test_hydra_names_no_job_so_its_proxy_does(monkeypatch):
    monkeypatch.setattr(le, "_pmi_proxy_pid", lambda: 4242)
    env = le.detect(hydra_env(1, 3))
    assert env.store_prefix == "pycollective/pmi/hydra-proxy-4242" and env.port_derived
    monkeypatch.setattr(le, "_pmi_proxy_pid", lambda: 4343)
    assert le.detect(hydra_env(1, 3)).master_port != env.master_port


def test_hydra_without_a_proxy_falls_back_to_one_port(monkeypatch):
    monkeypatch.setattr(le, "_pmi_proxy_pid", lambda: None)
    env = le.detect(hydra_env(0))
    assert env.master_port == le._port_from_job("pmi")
    assert env.store_prefix == "pycollective/pmi/job"


def test_pmi_across_hosts_without_a_job_id_needs_the_port_too():
    with pytest.raises(UsageError, match="MASTER_ADDR .* and MASTER_PORT"):
        le.detect(hydra_env(0, 4, MPI_LOCALNRANKS="2", MASTER_ADDR="10.0.0.5"))
    env = le.detect(
        hydra_env(0, 4, MPI_LOCALNRANKS="2", MASTER_ADDR="10.0.0.5", MASTER_PORT="29400")
    )
    assert env.multi_node and env.master_port == 29400
    slurm_pmi2 = le.detect(
        hydra_env(0, 4, MPI_LOCALNRANKS="2", MASTER_ADDR="10.0.0.5", PMI_JOBID="4242.0")
    )
    assert slurm_pmi2.port_derived


def test_this_test_process_has_no_hydra_proxy():
    assert le._pmi_proxy_pid() is None


# --- the torch store adapter ------------------------------------------------------------------


def test_torch_store_adapter_prefixes_keys_and_raises_store_error():
    tdist = pytest.importorskip("torch.distributed")
    server = tdist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
    client = tdist.TCPStore(
        "127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=5)
    )
    adapter = rendezvous.TorchStoreAdapter(client, "pycollective/torchelastic/x/attempt0", "agent")
    adapter.set("pycollective/1/tcp/0", b"127.0.0.1:1234")
    assert server.get("pycollective/torchelastic/x/attempt0/pycollective/1/tcp/0") == (
        b"127.0.0.1:1234"
    )
    assert adapter.get("pycollective/1/tcp/0", timeout=1.0) == b"127.0.0.1:1234"
    with pytest.raises(StoreError, match=r"get 'missing' from agent failed: .*timeout"):
        adapter.get("missing", timeout=0.2)
    adapter.close()


# --- init_process_group's messages ------------------------------------------------------------


@pytest.fixture
def bare_env(monkeypatch):
    """No launcher variables; the default group is destroyed after the test."""
    for key in list(os.environ):
        if key in LAUNCHER_NAMES or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)
    yield monkeypatch
    dist.destroy_process_group()


def test_init_rank_out_of_range(bare_env):
    with pytest.raises(UsageError, match="rank 5 is out of range for world size 2"):
        dist.init_process_group(rank=5, world_size=2)
    bare_env.setenv("RANK", "3")
    bare_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match=r"rank 3 is out of range for world size 2 \(set RANK\)"):
        dist.init_process_group()
    assert not dist.is_initialized()


def test_init_world_size_without_rank(bare_env):
    with pytest.raises(UsageError, match="world size 4 needs this process's rank: pass rank="):
        dist.init_process_group(world_size=4)


@pytest.mark.parametrize("backend", ["nccl", "NCCL", "cpu:gloo,cuda:nccl", "ucc"])
def test_init_gpu_backends_are_refused(bare_env, backend):
    with pytest.raises(UsageError, match="needs GPUs; pycollective is a CPU backend"):
        dist.init_process_group(backend)
    assert not dist.is_initialized()


def test_init_unknown_backend_and_bad_timeout(bare_env):
    with pytest.raises(UsageError, match="unknown backend 'mystery'"):
        dist.init_process_group("mystery")
    with pytest.raises(UsageError, match="timeout must be a positive number"):
        dist.init_process_group(timeout=-1)


def test_init_without_a_rendezvous(bare_env):
    with pytest.raises(UsageError, match="world size 2 needs a rendezvous: set MASTER_ADDR"):
        dist.init_process_group(rank=0, world_size=2)
    with pytest.raises(UsageError, match="unsupported init_method 'udp://x:1'"):
        dist.init_process_group(init_method="udp://x:1", rank=0, world_size=2)


def test_init_from_a_bad_launcher_environment(bare_env):
    bare_env.setenv("RANK", "zero")
    bare_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="RANK='zero' is not an integer"):
        dist.init_process_group()
    bare_env.delenv("RANK")
    bare_env.delenv("WORLD_SIZE")
    for key, value in ompi_env(0, 4, local=2).items():
        bare_env.setenv(key, value)
    with pytest.raises(UsageError, match="without MASTER_ADDR"):
        dist.init_process_group()


def test_init_alone_is_a_world_of_one(bare_env):
    dist.init_process_group()
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)


def test_init_derived_port_taken_says_to_export_master_port(bare_env):
    job = f"{os.getpid()}77"
    env = ompi_env(0, 2, job=job)
    for key, value in env.items():
        bare_env.setenv(key, value)
    port = le.detect(env).master_port
    with socket.socket() as blocker:
        try:
            blocker.bind(("127.0.0.1", port))
            blocker.listen()
        except OSError:
            pass  # someone else holds it: just as good
        with pytest.raises(
            StoreError,
            match=rf"port {port} was derived from the mpirun job id.*"
            "export MASTER_PORT",
        ):
            dist.init_process_group(timeout=5)
    assert not dist.is_initialized()
