"""Read who we are from the environment of whichever launcher started us.

Supported: our own launcher and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), OpenMPI's mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_*),
and PMI launchers such as MPICH's hydra (PMI_RANK, PMI_SIZE). Launchers that do not say
where rank 0 is (mpirun, srun) get a rendezvous port derived from their job id, so every
rank of one job computes the same one without talking.
"""

from __future__ import annotations

import os
import re
import subprocess
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ._errors import UsageError


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str  # "pycollective", "torchrun", "env", "mpirun", "slurm", "pmi" or "none"
    rank: int | None
    world_size: int | None
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    multi_node: bool
    store_host: str  # who serves the store at MASTER_ADDR:PORT: "rank0", "launcher", "torchelastic"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise UsageError(
                    f"environment variable {name}={value!r} is not an integer"
                ) from None
    return None


def _port_from_job(job: str) -> int:
    return 20000 + zlib.crc32(job.encode()) % 30000


def _first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list such as "node[03-05,07],gpu1"."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        first = out.stdout.split()
        if first:
            return first[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = re.split(r",(?![^\[]*\])", nodelist)[0]
    m = re.match(r"^(.*?)\[(\d+)", head)
    return m.group(1) + m.group(2) if m else head


def detect(env: Mapping[str, str] | None = None) -> LaunchEnv:
    env = os.environ if env is None else env
    master_addr = env.get("MASTER_ADDR") or None
    master_port = _int(env, "MASTER_PORT")
    if env.get("PYCOLLECTIVE_STORE_HOSTED") == "1":
        store_host = "launcher"
    elif env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        store_host = "torchelastic"
    else:
        store_host = "rank0"

    if _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None:
        launcher = (
            "pycollective"
            if store_host == "launcher"
            else "torchrun"
            if "TORCHELASTIC_RUN_ID" in env or store_host == "torchelastic"
            else "env"
        )
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") or world or 1
        nnodes = _int(env, "PYCOLLECTIVE_NNODES", "GROUP_WORLD_SIZE")
        return LaunchEnv(
            launcher,
            _int(env, "RANK"),
            world,
            _int(env, "LOCAL_RANK") or 0,
            local_world,
            master_addr,
            master_port,
            (nnodes or 1) > 1 or local_world < (world or 1),
            store_host,
        )

    if _int(env, "OMPI_COMM_WORLD_RANK") is not None:
        world = _int(env, "OMPI_COMM_WORLD_SIZE") or 1
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") or world
        job = (
            env.get("PMIX_NAMESPACE")
            or env.get("OMPI_MCA_ess_base_jobid")
            or env.get("OMPI_MCA_orte_ess_jobid", "")
        )
        return _derived(
            "mpirun",
            env,
            _int(env, "OMPI_COMM_WORLD_RANK"),
            world,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0,
            local_world,
            job,
            master_addr,
            master_port,
            store_host,
        )

    if _int(env, "SLURM_PROCID") is not None and _int(env, "SLURM_NTASKS") is not None:
        world = _int(env, "SLURM_NTASKS") or 1
        nnodes = _int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1
        local_world = world // nnodes if nnodes else world
        if master_addr is None and nnodes > 1:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
            master_addr = _first_slurm_host(nodelist) if nodelist else None
        job = f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"
        return _derived(
            "slurm",
            env,
            _int(env, "SLURM_PROCID"),
            world,
            _int(env, "SLURM_LOCALID") or 0,
            local_world,
            job,
            master_addr,
            master_port,
            store_host,
            nnodes > 1,
        )

    if _int(env, "PMI_RANK") is not None and _int(env, "PMI_SIZE") is not None:
        world = _int(env, "PMI_SIZE") or 1
        local_world = _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") or world
        job = env.get("PMI_KVSNAME") or env.get("PMI_ID", "") or env.get("PMIX_NAMESPACE", "")
        return _derived(
            "pmi",
            env,
            _int(env, "PMI_RANK"),
            world,
            _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK") or 0,
            local_world,
            job,
            master_addr,
            master_port,
            store_host,
        )

    return LaunchEnv("none", None, None, 0, 1, master_addr, master_port, False, store_host)


def _derived(
    launcher: str,
    env: Mapping[str, str],
    rank: int | None,
    world: int,
    local_rank: int,
    local_world: int,
    job: str,
    master_addr: str | None,
    master_port: int | None,
    store_host: str,
    multi_node: bool | None = None,
) -> LaunchEnv:
    multi = local_world < world if multi_node is None else multi_node
    if master_addr is None:
        if multi:
            raise UsageError(
                f"started by {launcher} across several hosts without MASTER_ADDR: export "
                "MASTER_ADDR (the host of rank 0) and MASTER_PORT to every rank"
            )
        master_addr = "127.0.0.1"
    if master_port is None:
        master_port = _port_from_job(job or launcher)
    return LaunchEnv(
        launcher, rank, world, local_rank, local_world, master_addr, master_port, multi, store_host
    )
