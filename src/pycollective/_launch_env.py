"""Read who we are from the environment of whichever launcher started us.

Supported: our own launcher and torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), OpenMPI's mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_*),
and PMI launchers such as MPICH's hydra (PMI_RANK, PMI_SIZE). Launchers that do not say
where rank 0 is (mpirun, srun, hydra) get a rendezvous port derived from their job id, so
every rank of one job computes the same one without talking; the store keys are then
namespaced by the job id too, so two jobs that happen to derive one port never mix.

What each launcher really sets (checked against torchrun 2.13, OpenMPI 4.1, MPICH 4.0 hydra):
- torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT (the agent's TCPStore, already listening), TORCHELASTIC_RUN_ID,
  TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE=True.
- OpenMPI 4.1 mpirun: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; the job id as
  PMIX_NAMESPACE and OMPI_MCA_ess_base_jobid (equal, same on every rank, a 16-bit hash of
  mpirun's host and pid in the high half), and OMPI_MCA_orte_hnp_uri (mpirun's own address).
- srun: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, SLURM_STEP_NUM_TASKS,
  SLURM_NNODES, SLURM_STEP_NUM_NODES, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST,
  SLURM_STEP_TASKS_PER_NODE. A batch script also has SLURM_PROCID and SLURM_NTASKS but is
  not an srun step (no SLURM_STEP_ID, or a reserved one), so it is a world of one.
- MPICH hydra: PMI_RANK, PMI_SIZE, PMI_FD, MPI_LOCALRANKID, MPI_LOCALNRANKS and no job id
  at all; every rank on a host is a child of one hydra_pmi_proxy, whose pid names the job.
  Slurm's pmi2 sets PMI_JOBID; PMI_KVSNAME is honoured where a launcher sets it.
"""

from __future__ import annotations

import os
import re
import subprocess
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from . import _config
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
    store_prefix: str = ""  # namespace for our keys in that store ("" for none)
    port_derived: bool = False  # MASTER_PORT was computed from the job id, not given


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


# Derived ports stay below Linux's default ephemeral range (32768-60999), where the kernel
# hands out ports to outgoing connections and to listeners bound to port 0.
_DERIVED_PORT_BASE = 20000
_DERIVED_PORT_COUNT = 32768 - _DERIVED_PORT_BASE

# Slurm's reserved step ids (batch script, extern, interactive, pending), old and new values.
_SLURM_RESERVED_STEP = 0xFFFFFFF0

_PMI_PROXIES = ("hydra_pmi_proxy", "pmi_proxy")


def _port_from_job(job: str) -> int:
    return _DERIVED_PORT_BASE + zlib.crc32(job.encode()) % _DERIVED_PORT_COUNT


def _pmi_proxy_pid() -> int | None:
    """The pid of the hydra proxy this process descends from (Linux /proc), if any."""
    pid = os.getppid()
    for _ in range(16):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            return None
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        if comm in _PMI_PROXIES:
            return pid
        try:
            pid = int(stat[stat.rfind(")") + 2 :].split()[1])
        except (IndexError, ValueError):
            return None
    return None


def _tasks_on_node(spec: str, node: int) -> int | None:
    """Tasks on node `node` from a Slurm list such as "2(x3),1"; None if unreadable."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node] if 0 <= node < len(counts) else None


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
        prefix = ""
        attempt = _config.get("PYCOLLECTIVE_RESTART_COUNT", env)
        if store_host == "launcher" and attempt:
            # `pycollective run --max-restarts`: the launcher's store outlives an attempt;
            # each attempt meets under keys of its own.
            prefix = f"pycollective/attempt{attempt}"
        if store_host == "torchelastic":
            # The agent's store outlives the workers: a restarted attempt must not read the
            # addresses the failed one left behind. The restart count is per agent, so it
            # only names the attempt when one agent started every rank; across nodes the
            # counts can differ (a membership change restarts without counting).
            prefix = f"pycollective/torchelastic/{env.get('TORCHELASTIC_RUN_ID', '')}"
            if (nnodes or 1) == 1:
                prefix += f"/attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
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
            prefix,
        )

    if _int(env, "OMPI_COMM_WORLD_RANK") is not None:
        world = _int(env, "OMPI_COMM_WORLD_SIZE") or 1
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") or world
        job = (
            env.get("PMIX_NAMESPACE")
            or env.get("OMPI_MCA_ess_base_jobid")
            or env.get("OMPI_MCA_orte_ess_jobid", "")
        )
        if job and env.get("OMPI_MCA_orte_hnp_uri"):
            # The job id's family is a 16-bit hash; mpirun's own address tells apart the
            # jobs of two mpiruns that happen to share it.
            job += f"-{zlib.crc32(env['OMPI_MCA_orte_hnp_uri'].encode()):08x}"
        return _derived(
            "mpirun",
            _int(env, "OMPI_COMM_WORLD_RANK"),
            world,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0,
            local_world,
            job,
            master_addr,
            master_port,
            store_host,
        )

    step_text = (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip()
    step = int(step_text) if step_text.isdigit() else None
    if _int(env, "SLURM_PROCID") is not None and step is not None and step < _SLURM_RESERVED_STEP:
        world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") or 1
        nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
        on_node = _tasks_on_node(spec, _int(env, "SLURM_NODEID") or 0) if spec else None
        if on_node is None:
            on_node = world if nnodes <= 1 else max(1, world // nnodes)
        local_world = on_node
        if master_addr is None and nnodes > 1:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
            master_addr = _first_slurm_host(nodelist) if nodelist else None
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", "")
        return _derived(
            "slurm",
            _int(env, "SLURM_PROCID"),
            world,
            _int(env, "SLURM_LOCALID") or 0,
            local_world,
            f"{job_id}.{step}",
            master_addr,
            master_port,
            store_host,
            nnodes > 1,
        )

    if _int(env, "PMI_RANK") is not None and _int(env, "PMI_SIZE") is not None:
        world = _int(env, "PMI_SIZE") or 1
        local_world = _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") or world
        job = env.get("PMI_KVSNAME") or env.get("PMI_JOBID") or env.get("PMIX_NAMESPACE") or ""
        if not job and master_port is None and local_world >= world:
            # hydra names no job: every rank on this host shares one proxy process.
            proxy = _pmi_proxy_pid()
            if proxy is not None:
                job = f"hydra-proxy-{proxy}"
        if not job and master_port is None and local_world < world:
            raise UsageError(
                "started by a PMI launcher across several hosts that names no job id: export "
                "MASTER_ADDR (the host of rank 0) and MASTER_PORT to every rank"
            )
        return _derived(
            "pmi",
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


_EXPORT_HINT = {
    "mpirun": "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port> ...",
    "slurm": "export MASTER_ADDR=<host of rank 0> MASTER_PORT=<free port> before srun",
    "pmi": "mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT <free port> ...",
}


def _derived(
    launcher: str,
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
                "MASTER_ADDR (the host of rank 0) and MASTER_PORT to every rank, e.g. "
                + _EXPORT_HINT.get(launcher, "")
            )
        master_addr = "127.0.0.1"
    derived = master_port is None
    if derived:
        master_port = _port_from_job(job or launcher)
    # With a derived port the job id also names our keys, so that a job that reaches
    # another job's store (same derived port) waits for its own keys instead of mixing.
    prefix = f"pycollective/{launcher}/{job or 'job'}" if derived else ""
    return LaunchEnv(
        launcher,
        rank,
        world,
        local_rank,
        local_world,
        master_addr,
        master_port,
        multi,
        store_host,
        prefix,
        derived,
    )
