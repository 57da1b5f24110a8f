"""`init_process_group()` with no arguments, for real, under every launcher: torchrun,
`pycollective run`, OpenMPI's mpirun and MPICH's hydra (when installed), and srun and PMI
ranks started here with exactly the variables those launchers set (no MASTER_ADDR/PORT).
Every job runs tests/api/battery.py, which checks every collective on every rank and exits
non-zero on any failure.

Each job is bounded, and every process it started is tagged through its environment, so a
test that leaves one behind kills it and fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycollective._netutil import free_port

REPO = Path(__file__).resolve().parents[2]
BATTERY = REPO / "tests" / "api" / "battery.py"
# The battery without bfloat16 (ml_dtypes: half a second of CPU in every rank): these jobs
# check how ranks are started; test_collectives.py checks bfloat16 (battery.py says where).
QUICK = ("--quick", "--no-bfloat16")
PYTHON = sys.executable
TAG = "PYCOLLECTIVE_TEST_JOB"

LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_", "MPI_LOCAL", "HYDRA_")
LAUNCHER_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYCOLLECTIVE_STORE_HOSTED",
    "PYCOLLECTIVE_NNODES",
    "PYCOLLECTIVE_SECRET",
    "PYCOLLECTIVE_SECRET_FILE",
}


# --- harness ----------------------------------------------------------------------------------


def _tagged_pids(tag: str) -> list[int]:
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def _tagged_env() -> Iterator[dict[str, str]]:
    """A clean environment (no launcher variables) whose processes are checked for leaks."""
    tag = uuid.uuid4().hex
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)
    }
    env.update({TAG: tag, "PYTHONUNBUFFERED": "1", "PYCOLLECTIVE_TIMEOUT": "60"})
    yield env
    deadline = time.monotonic() + 5
    while (left := _tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def job_env():
    with _tagged_env() as env:
        yield env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def run_job(cmd: list, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    """Run a launcher command to the end, killing its process group (and every process of
    the job, found by tag) at the timeout."""
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        for pid in _tagged_pids(env[TAG]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
        pytest.fail(
            f"{cmd[0]} did not finish in {timeout} s\nstdout:\n{out[-4000:]}\n"
            f"stderr:\n{err[-4000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def start_ranks(per_rank: list[dict[str, str]], env: dict[str, str], args: list[str]):
    """Start one process per rank, as a launcher would: the job's env plus the rank's own."""
    return [
        subprocess.Popen(
            [PYTHON, *args],
            env={**env, **extra},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for extra in per_rank
    ]


def finish_ranks(procs: list[subprocess.Popen], timeout: float = 60) -> list[tuple[int, str, str]]:
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    _kill_group(p)
                out, err = proc.communicate()
                err += f"\n[test] killed after {timeout} s"
            results.append((proc.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
                p.wait()
    return results


def assert_battery_passed(res: subprocess.CompletedProcess, nranks: int) -> None:
    summary = re.findall(r"rank (\d+): (\d+) checks, (\d+) failures", res.stdout)
    detail = f"exit {res.returncode}\nstdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-4000:]}"
    assert res.returncode == 0, detail
    assert sorted(int(r) for r, _, _ in summary) == list(range(nranks)), detail
    assert all(int(n) > 100 and f == "0" for _, n, f in summary), detail


def assert_ranks_passed(results: list[tuple[int, str, str]]) -> None:
    for rank, (code, out, err) in enumerate(results):
        assert code == 0 and f"rank {rank}: " in out and " 0 failures" in out, (
            f"rank {rank} exit {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        )


# --- torchrun ---------------------------------------------------------------------------------

TORCHRUN = Path(PYTHON).parent / "torchrun"
needs_torchrun = pytest.mark.skipif(
    not TORCHRUN.exists(), reason=f"torchrun is not installed next to {PYTHON}"
)


@needs_torchrun
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, extra", [(2, ["--torch"]), (3, [])], ids=["2-torch", "3"])
def test_torchrun_battery(job_env, n, extra):
    # torchrun's agent hosts a torch TCPStore at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True)
    res = run_job(
        [TORCHRUN, "--nproc-per-node", n, "--master-port", free_port(), BATTERY, *QUICK, *extra],
        job_env,
    )
    assert_battery_passed(res, n)


@needs_torchrun
@pytest.mark.timeout(120)
def test_torchrun_standalone_without_the_shared_agent_store(job_env):
    # The c10d rendezvous with its store not shared: MASTER_PORT is free and rank 0 hosts ours.
    job_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    res = run_job([TORCHRUN, "--standalone", "--nproc-per-node", 2, BATTERY, *QUICK], job_env)
    assert_battery_passed(res, 2)


RESTART = """
    import os, sys, time
    import numpy as np
    import pycollective as dist

    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    if attempt == 0:
        dist.init_process_group()
        if rank == 1:
            sys.exit(3)  # the agent stops rank 0 too and starts attempt 1
        time.sleep(60)
    if rank == 0:
        time.sleep(1.5)  # attempt 0's addresses are still in the agent's store meanwhile
    dist.init_process_group(timeout=20)
    t = np.full(4, rank + 1.0)
    dist.all_reduce(t)
    print(f"attempt {attempt} rank {rank} sum {t[0]:g}", flush=True)
    dist.destroy_process_group()
"""


@needs_torchrun
@pytest.mark.timeout(120)
def test_torchrun_restart_never_reads_the_failed_attempts_addresses(job_env, tmp_path):
    script = tmp_path / "restart.py"
    script.write_text(textwrap.dedent(RESTART))
    res = run_job(
        [
            TORCHRUN,
            "--nproc-per-node",
            2,
            "--max-restarts",
            1,
            "--monitor-interval",
            "0.2",
            "--master-port",
            free_port(),
            script,
        ],
        job_env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "attempt 1 rank 0 sum 3" in res.stdout and "attempt 1 rank 1 sum 3" in res.stdout


# --- pycollective run -------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_pycollective_run_battery(job_env, n):
    res = run_job([PYTHON, "-m", "pycollective", "run", "-n", n, BATTERY, *QUICK], job_env)
    assert_battery_passed(res, n)
    # the launcher's prefix on every line of every rank's output
    for rank in range(n):
        assert f"[rank {rank}]: rank {rank}: " in res.stdout, res.stdout[-3000:]


FAILING = """
    import os, sys, time
    import numpy as np
    import pycollective as dist

    dist.init_process_group()
    rank = dist.get_rank()
    if rank == 1:
        sys.exit(7)
    try:
        while True:
            dist.all_reduce(np.ones(8))
    except dist.CollectiveError as exc:
        print(f"rank {rank} saw {type(exc).__name__}", flush=True)
        time.sleep(1)  # so that rank 1 is surely the first to fail
        sys.exit(1)
"""


@pytest.mark.timeout(90)
def test_pycollective_run_names_the_failing_rank(job_env, tmp_path):
    script = tmp_path / "failing.py"
    script.write_text(textwrap.dedent(FAILING))
    res = run_job([PYTHON, "-m", "pycollective", "run", "-n", 3, "--grace", 5, script], job_env)
    assert res.returncode == 7, res.stderr
    assert "rank 1 exited with status 7 (the first rank to fail)" in res.stderr
    assert "rank 0 saw TransportError" in res.stdout and "rank 2 saw TransportError" in res.stdout


# --- OpenMPI mpirun ---------------------------------------------------------------------------


def _openmpi() -> str | None:
    for name in ("mpirun.openmpi", "mpirun"):
        path = shutil.which(name)
        if path:
            try:
                out = subprocess.run(
                    [path, "--version"], capture_output=True, text=True, timeout=20
                ).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            if "Open MPI" in out:
                return path
    return None


MPIRUN = _openmpi()
needs_mpirun = pytest.mark.skipif(
    MPIRUN is None, reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)"
)


def mpirun_cmd(n: int, *args) -> list:
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", n, PYTHON, *args]


@pytest.fixture(scope="module")
def two_mpirun_jobs() -> Iterator[dict[int, tuple[int, str, str]]]:
    """OpenMPI jobs of 2 and 3 ranks started at the same time, once for the tests that read
    them (exit status, stdout, stderr by size): a job alone is the same battery without the
    other job beside it, so the pair checks all that two single jobs did, and more."""
    with _tagged_env() as env:
        procs = [
            subprocess.Popen(
                [str(c) for c in mpirun_cmd(n, BATTERY, *QUICK)],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for n in (2, 3)
        ]
        yield dict(zip((2, 3), finish_ranks(procs, 80), strict=True))


@needs_mpirun
@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_mpirun_battery_two_jobs_at_once(two_mpirun_jobs, n):
    # No MASTER_*: every rank derives one port from the job id (PMIX_NAMESPACE), so two
    # jobs at once each find their own ranks and pass the battery.
    code, out, err = two_mpirun_jobs[n]
    assert_battery_passed(subprocess.CompletedProcess([], code, out, err), n)


# --- MPICH hydra ------------------------------------------------------------------------------

HYDRA = shutil.which("mpiexec.hydra")


@pytest.mark.skipif(HYDRA is None, reason="MPICH's mpiexec.hydra is not installed (apt mpich)")
@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_hydra_battery(job_env, n):
    # hydra sets PMI_RANK/PMI_SIZE/MPI_LOCALRANKID and no job id: its proxy's pid names the job.
    res = run_job([HYDRA, "-n", n, PYTHON, BATTERY, *QUICK], job_env)
    assert_battery_passed(res, n)


# --- srun and PMI, with exactly their variables -----------------------------------------------


def srun_vars(rank: int, n: int, job: str, step: str) -> dict[str, str]:
    host = socket.gethostname()
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(n),
        "SLURM_NPROCS": str(n),
        "SLURM_STEP_NUM_TASKS": str(n),
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_STEP_ID": step,
        "SLURM_STEPID": step,
        "SLURM_STEP_NODELIST": host,
        "SLURM_JOB_NODELIST": host,
        "SLURM_NODELIST": host,
        "SLURM_TASKS_PER_NODE": str(n),
        "SLURM_STEP_TASKS_PER_NODE": str(n),
        "SLURM_GTIDS": ",".join(map(str, range(n))),
        "SLURMD_NODENAME": host,
        "SLURM_CPUS_ON_NODE": str(os.cpu_count() or 1),
        "SLURM_JOB_NAME": "battery",
    }


@pytest.mark.timeout(90)
def test_srun_two_steps_at_once(job_env):
    # Two steps of one allocation run side by side (2 and 3 tasks); each finds its own rank 0.
    job = str(random.randrange(100000, 999999))
    steps = [
        start_ranks([srun_vars(r, n, job, step) for r in range(n)], job_env, [str(BATTERY), *QUICK])
        for n, step in ((2, "0"), (3, "1"))
    ]
    for procs in steps:
        assert_ranks_passed(finish_ranks(procs, 80))


def pmi_vars(rank: int, n: int, **extra: str) -> dict[str, str]:
    return {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(n),
        "MPI_LOCALRANKID": str(rank),
        "MPI_LOCALNRANKS": str(n),
        **extra,
    }


@pytest.mark.timeout(90)
def test_pmi_jobs(job_env):
    # One PMI job that names its kvs (2 ranks) beside one that names nothing, as hydra (3 ranks).
    kvs = f"kvs_{random.randrange(10**6)}_0"
    jobs = [
        start_ranks(
            [pmi_vars(r, 2, PMI_KVSNAME=kvs) for r in range(2)], job_env, [str(BATTERY), *QUICK]
        ),
        start_ranks([pmi_vars(r, 3) for r in range(3)], job_env, [str(BATTERY), *QUICK]),
    ]
    for procs in jobs:
        assert_ranks_passed(finish_ranks(procs, 80))
