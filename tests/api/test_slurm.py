"""Under a real Slurm, not only its environment: a one-node cluster on this host (munged,
slurmctld, slurmd; tests/api/_slurm.py) runs the all-collectives battery under `srun -n 3`,
and the sbatch script of docs/multihost.md (2 tasks); where slurmd runs inside the
namespace hosts of tools/nethosts.py, a two-node `srun -N 2` job too. Every rank finds the
others from SLURM_* alone (init_process_group() with no arguments, no MASTER_*).
Skipped, saying why, where Slurm is not installed or cannot start."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tests.api import _slurm
from tools import nethosts

REPO = Path(__file__).resolve().parents[2]
BATTERY = REPO / "tests" / "api" / "battery.py"
# The battery without bfloat16 (ml_dtypes: half a second of CPU in every rank): these jobs
# check how ranks are started; test_collectives.py checks bfloat16 (battery.py says where).
QUICK = ("--quick", "--no-bfloat16")
PYTHON = sys.executable
LAUNCHER = re.compile(
    r"^(OMPI_|PMIX_|PMI_|SLURM_|TORCHELASTIC_|MPI_LOCAL|HYDRA_|PYCOLLECTIVE_)|^(RANK|"
    r"WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|MASTER_ADDR|"
    r"MASTER_PORT)$"
)
_WHY = _slurm.unavailable()
pytestmark = [
    pytest.mark.skipif(_WHY is not None, reason=f"no Slurm: {_WHY}"),
    pytest.mark.timeout(180),
]


def job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not LAUNCHER.match(k)}
    # A secret of this job's own, as a cluster user would set: a job of another cluster
    # that happened on the same derived port would be refused, not mixed with this one.
    env.update(
        PYTHONUNBUFFERED="1", PYCOLLECTIVE_TIMEOUT="60", PYCOLLECTIVE_SECRET=secrets.token_hex(16)
    )
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def assert_battery_passed(out: str, nranks: int) -> None:
    summary = re.findall(r"rank (\d+): (\d+) checks, (\d+) failures", out)
    assert sorted(int(r) for r, _, _ in summary) == list(range(nranks)), out[-4000:]
    assert all(int(n) > 100 and f == "0" for _, n, f in summary), out[-4000:]


def short_dir() -> Path:
    """A directory with a short path: slurmstepd's Unix sockets live in the spool dir
    (108 bytes at most, which pytest's temporary paths can exceed)."""
    return Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))


@pytest.fixture(scope="module")
def cluster():
    root = short_dir()
    c = _slurm.Slurm(root, [(socket.gethostname(), "127.0.0.1")])
    try:
        c.start()
    except (RuntimeError, OSError) as exc:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"Slurm did not start on this host: {exc}")
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


# One job at 3 ranks, not one at 2 and one at 4: what srun adds is the SLURM_* environment
# the ranks find each other from, the same at any size (the sbatch script below runs 2
# tasks, the namespace hosts' job 4 on two nodes); 3 is an odd size, so rings and trees are
# not symmetric; the battery at every size 1-8 runs in tests/shm and tests/api.
@pytest.mark.parametrize("n", [3])
def test_srun_battery(cluster, n):
    res = cluster.run(["srun", "-n", n, PYTHON, BATTERY, *QUICK], env=job_env(), cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_battery_passed(res.stdout, n)


def sbatch_script() -> str:
    text = (REPO / "docs" / "multihost.md").read_text()
    return re.search(r"<!-- test: sbatch -->\n```bash\n(.*?)```", text, re.S).group(1)


TRAIN = """
import numpy as np
import pycollective as dist

dist.init_process_group()
x = np.ones(1000, dtype=np.float32) * (dist.get_rank() + 1)
dist.all_reduce(x)
n = dist.get_world_size()
assert (x == n * (n + 1) / 2).all()
print(f"train.py: rank {dist.get_rank()} of {n} ok", flush=True)
dist.destroy_process_group()
"""


def test_the_docs_sbatch_script(cluster, tmp_path):
    """docs/multihost.md's batch script as a user submits it, on one node here (the
    command line's --nodes and --ntasks-per-node win over its #SBATCH lines)."""
    (tmp_path / "job.sbatch").write_text(sbatch_script())
    (tmp_path / "train.py").write_text(TRAIN)
    res = cluster.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--output=job.out",
         "job.sbatch"],
        env=job_env(), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr + cluster.logs()
    state = _wait_for_job(cluster, res.stdout.strip().split(";")[0])
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state + out + cluster.logs()
    assert sorted(re.findall(r"train\.py: rank (\d) of 2 ok", out)) == ["0", "1"], out


_DONE = re.compile(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|"
                   r"PREEMPTED|BOOT_FAIL|DEADLINE)\b")  # fmt: skip


def _wait_for_job(cluster, job_id: str, timeout: float = 120.0) -> str:
    """The job's `scontrol show job` line once it ended (polled every 0.2 s). `sbatch
    --wait` polls coarsely: here it returned after 2.0 s or after 10.0 s, whenever the job
    took a little more than 2."""
    deadline = time.monotonic() + timeout
    while True:
        res = cluster.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        if _DONE.search(res.stdout):
            return res.stdout
        assert time.monotonic() < deadline, f"job {job_id} not done in {timeout:g} s: {res.stdout}"
        time.sleep(0.2)


_NS = nethosts.available()
CGROUP_V1 = ("cpu", "cpuacct", "memory", "devices", "freezer", "cpuset")


@pytest.mark.skipif(_NS is not None, reason=f"no namespace hosts: {_NS}")
def test_srun_two_nodes_in_namespace_hosts():
    nethosts.cleanup()
    root = short_dir()
    with nethosts.NetHosts(2) as hosts:

        def on_host(k: int, argv: list[str]) -> list[str]:
            # `ip netns exec` mounts a sysfs of the namespace, without the cgroup file
            # systems slurmd initializes: mount them there (its mount namespace is its own).
            mount = (
                "mount -t tmpfs tmpfs /sys/fs/cgroup && for c in " + " ".join(CGROUP_V1)
                + '; do mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup '
                "/sys/fs/cgroup/$c; done && mkdir -p /sys/fs/cgroup/systemd && mount -t "
                'cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; exec "$@"'
            )  # fmt: skip
            return hosts.command(k, ["sh", "-c", mount, "sh", *argv])

        c = _slurm.Slurm(root, list(zip(hosts.names, hosts.addrs, strict=True)), on_host)
        try:
            try:
                c.start()
            except (RuntimeError, OSError) as exc:
                pytest.skip(f"slurmd did not start in namespace hosts: {exc}")
            res = c.run(["srun", "-N", "2", "-n", "4", PYTHON, BATTERY, *QUICK],
                        env=job_env(), cwd=REPO)  # fmt: skip
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + c.logs()
            assert_battery_passed(res.stdout, 4)
        finally:
            c.stop()
            shutil.rmtree(root, ignore_errors=True)
