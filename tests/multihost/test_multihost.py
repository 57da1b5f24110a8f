"""Real multi-host jobs on hosts made of network namespaces (tools/nethosts.py), under
`pycollective run`, torchrun and OpenMPI's mpirun: 2 hosts x 2 ranks run the all-collectives
battery, after a report (tests/multihost/_job.py) that shows where the bytes went: ranks
on one host share a memory arena, ranks on different hosts talk TCP over the hosts'
10.77.0.x addresses. A kill -9 of one rank on one host must end the job on both, and a
node started with another secret must be refused (and the job fail) on both.

Needs root and `ip netns` (skipped otherwise, saying which is missing).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from tools import nethosts

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "multihost" / "_job.py"
PYTHON = sys.executable
TORCHRUN = Path(PYTHON).parent / "torchrun"
LAUNCHER_VARS = re.compile(
    r"^(OMPI_|PMIX_|PMI_|SLURM_|TORCHELASTIC_|MPI_LOCAL|HYDRA_)|^(RANK|"
    r"WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|"
    r"MASTER_ADDR|MASTER_PORT|PYCOLLECTIVE_STORE_HOSTED|"
    r"PYCOLLECTIVE_SECRET|PYCOLLECTIVE_TRANSPORT|PYCOLLECTIVE_HOST_ID|PYCOLLECTIVE_SOCKET_IFNAME)$"
)
_WHY = nethosts.available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"no namespace hosts: {_WHY}")

HOSTS = 2
PER_HOST = 2


@pytest.fixture(scope="module")
def hosts():
    nethosts.cleanup()  # namespaces of earlier runs that were killed
    with nethosts.NetHosts(HOSTS) as h:
        yield h


@pytest.fixture
def env():
    """The job's environment: no launcher variables of ours, one secret for every node."""
    e = {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.search(k)}
    e.update(PYTHONUNBUFFERED="1", PYCOLLECTIVE_TIMEOUT="30",
             PYCOLLECTIVE_SECRET=secrets.token_hex(16))  # fmt: skip
    return e


_port = iter(range(29400 + os.getpid() % 500, 65000, 7))


def run_on_hosts(hosts, cmds: list[list], env: dict, timeout: float = 90) -> list:
    """Start cmds[k] on host k, wait for all; on timeout kill everything and fail."""
    procs = [
        hosts.popen(k, [str(c) for c in cmd], env=env, cwd=REPO, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        for k, cmd in enumerate(cmds)
    ]  # fmt: skip
    return finish(procs, timeout)


def finish(procs: list[subprocess.Popen], timeout: float) -> list:
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    _killpg(q)
                out, err = p.communicate()
                pytest.fail(f"job did not finish in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                _killpg(p)
                p.wait()
    return results


def _killpg(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass


def check_job(results: list, hosts) -> None:
    """Every rank passed the battery, and its topology report shows shm within a host
    and TCP between hosts (over the hosts' own addresses)."""
    text = "".join(r.stdout for r in results)
    detail = "\n".join(f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                       for r in results)  # fmt: skip
    assert all(r.returncode == 0 for r in results), detail
    size = HOSTS * PER_HOST
    summary = re.findall(r"rank (\d+): (\d+) checks, (\d+) failures", text)
    assert sorted(int(r) for r, _, _ in summary) == list(range(size)), detail
    assert all(int(n) > 100 and f == "0" for _, n, f in summary), detail
    reports = {}
    for m in re.finditer(r"TOPOLOGY ", text):
        rep = json.JSONDecoder().raw_decode(text, m.end())[0]
        reports[rep["rank"]] = rep
    assert sorted(reports) == list(range(size)), detail
    ids = reports[0]["host_ids"]
    # Ranks k*PER_HOST.. run on host k: equal host ids there, different across hosts.
    assert len(set(ids)) == HOSTS and all(
        ids[r] == ids[(r // PER_HOST) * PER_HOST] for r in range(size)
    ), ids
    for r, rep in reports.items():
        host = r // PER_HOST
        local = list(range(host * PER_HOST, (host + 1) * PER_HOST))
        assert rep["host_ids"] == ids
        assert rep["local_ranks"] == local, rep
        assert rep["local_shm"] and not rep["world_shm"], rep
        assert rep["local_auto"] == "shm", rep
        assert rep["local_sum"] == sum(q + 1 for q in local), rep
        assert rep["world_sum"] == sum(q + 1 for q in range(size)), rep
        # shm moves the data: TCP carries at most a few control frames. Ring over TCP:
        # every rank sends 2 (p-1)/p of the payload.
        assert rep["local_tcp_bytes"] < rep["payload_bytes"] // 100, rep
        assert rep["world_tcp_bytes"] >= 2 * (size - 1) * rep["payload_bytes"] // size, rep
        for peer, addr in rep["peer_addrs"].items():
            assert addr == hosts.addrs[int(peer) // PER_HOST], (r, peer, addr)


# --- pycollective run -------------------------------------------------------------------------


def pycollective_run(hosts, k: int, port: int, *args) -> list:
    return [
        PYTHON, "-m", "pycollective", "run", "--nnodes", HOSTS, "--node-rank", k,
        "--master-addr", hosts.addrs[0], "--master-port", port, "-n", PER_HOST, *args,
    ]  # fmt: skip


@pytest.mark.timeout(120)
def test_pycollective_run_across_hosts(hosts, env):
    port = next(_port)
    cmds = [pycollective_run(hosts, k, port, JOB, "--quick") for k in range(HOSTS)]
    check_job(run_on_hosts(hosts, cmds, env), hosts)


# --- torchrun ---------------------------------------------------------------------------------


@pytest.mark.skipif(not TORCHRUN.exists(), reason=f"torchrun is not installed next to {PYTHON}")
@pytest.mark.timeout(120)
def test_torchrun_across_hosts(hosts, env):
    # Static rendezvous: node 0's agent hosts a torch TCPStore at MASTER_ADDR:MASTER_PORT.
    # The ranks listen on the interface named, rather than the one routing to MASTER_ADDR.
    env["PYCOLLECTIVE_SOCKET_IFNAME"] = "eth0"
    port = next(_port)
    cmds = [
        [TORCHRUN, "--nnodes", HOSTS, "--node-rank", k, "--master-addr", hosts.addrs[0],
         "--master-port", port, "--nproc-per-node", PER_HOST, JOB, "--quick", "--torch"]
        for k in range(HOSTS)
    ]  # fmt: skip
    check_job(run_on_hosts(hosts, cmds, env), hosts)


# --- OpenMPI mpirun ---------------------------------------------------------------------------


def _openmpi() -> str | None:
    path = shutil.which("mpirun")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "Open MPI" in out.stdout else None


MPIRUN = _openmpi()

# mpirun starts its daemon on another host as `<agent> <host> orted ...`, like ssh: the
# agent runs the command in that host's namespaces (with that host's hostname).
AGENT = """#!/bin/sh
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


@pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed (openmpi-bin)")
@pytest.mark.timeout(120)
def test_mpirun_across_hosts(hosts, env):
    with tempfile.TemporaryDirectory() as d:
        agent = Path(d) / "netns-agent"
        agent.write_text(AGENT)
        agent.chmod(0o755)
        hostfile = Path(d) / "hostfile"
        hostfile.write_text("".join(f"{n} slots={PER_HOST}\n" for n in hosts.names))
        subnet = f"{nethosts.SUBNET}.0/24"
        cmd = [MPIRUN, "--allow-run-as-root", "--hostfile", hostfile, "-np", HOSTS * PER_HOST,
               "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", subnet,
               "--mca", "btl_tcp_if_include", subnet,
               # Across hosts the ranks must be told where rank 0 is (no derived port);
               # by name here, which each host's /etc/hosts resolves.
               "-x", f"MASTER_ADDR={hosts.names[0]}", "-x", f"MASTER_PORT={next(_port)}",
               "-x", "PYCOLLECTIVE_SECRET", "-x", "PYCOLLECTIVE_TIMEOUT", "-x", "PYTHONPATH",
               PYTHON, JOB, "--quick"]  # fmt: skip
        env.setdefault("PYTHONPATH", "")
        check_job(run_on_hosts(hosts, [cmd], env), hosts)


# --- a rank dies ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_kill_one_rank_ends_the_job_on_both_hosts(hosts, env):
    env["PYCOLLECTIVE_TIMEOUT"] = "20"
    port = next(_port)
    cmds = [pycollective_run(hosts, k, port, "--grace", 3, JOB, "--loop") for k in range(HOSTS)]
    procs = [
        hosts.popen(k, [str(c) for c in cmd], env=env, cwd=REPO, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        for k, cmd in enumerate(cmds)
    ]  # fmt: skip
    victim = PER_HOST  # the first rank on host 1
    try:
        pid = None
        assert procs[1].stdout is not None
        for line in procs[1].stdout:
            m = re.search(rf"rank {victim} pid (\d+) looping", line)
            if m:
                pid = int(m.group(1))
                break
        assert pid is not None, "rank did not start its loop"
        time.sleep(0.5)  # well inside the loop on every rank
        os.kill(pid, signal.SIGKILL)
    except BaseException:
        for p in procs:
            _killpg(p)
        raise
    results = finish(procs, 60)
    detail = "\n".join(f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                       for r in results)  # fmt: skip
    # Both launchers fail; host 1's names the killed rank.
    assert results[0].returncode != 0 and results[1].returncode != 0, detail
    assert f"rank {victim} was killed by SIGKILL" in results[1].stderr, detail
    # The ranks on host 0 raised (not killed by their launcher), naming the lost rank.
    for r in range(PER_HOST):
        m = re.search(rf"rank {r} raised (\w+) after [\d.]+ s: (.*)", results[0].stdout)
        assert m, detail
        assert m.group(1) in ("TransportError", "CollectiveTimeout", "CollectiveError"), detail
        assert re.search(rf"\brank {victim}\b", m.group(2)), detail


# --- a node with the wrong secret -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_node_with_another_secret_is_refused_and_the_job_fails(hosts, env):
    env["PYCOLLECTIVE_TIMEOUT"] = "5"
    port = next(_port)
    procs = []
    for k in range(HOSTS):
        node_env = dict(env, PYCOLLECTIVE_SECRET=secrets.token_hex(16))  # differ per node
        cmd = pycollective_run(hosts, k, port, "--grace", 2, JOB, "--loop")
        procs.append(
            hosts.popen(k, [str(c) for c in cmd], env=node_env, cwd=REPO, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        )  # fmt: skip
    results = finish(procs, 60)
    detail = "\n".join(f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                       for r in results)  # fmt: skip
    assert all(r.returncode != 0 for r in results), detail
    assert "looping" not in results[0].stdout + results[1].stdout, detail
    # Node 1's ranks are refused by node 0's store; node 0's ranks wait for them in vain.
    assert "AuthenticationError" in results[1].stderr, detail
    assert "key differs" in results[1].stderr and "PYCOLLECTIVE_SECRET" in results[1].stderr, detail
    assert re.search(r"CollectiveTimeout|StoreError|timed out", results[0].stderr), detail


# --- tcp:// with no MASTER_ADDR (Ray Train's init_method="tcp") --------------------------------


TCP_JOB = REPO / "tests" / "multihost" / "_tcp_job.py"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["torch", "pycollective"])
def test_tcp_init_method_across_hosts_advertises_each_hosts_address(hosts, env, which):
    """One rank a host, told only RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the
    tcp:// address: each rank advertises the interface that reaches the init address (it
    advertised 127.0.0.1 before, and the job hung)."""
    url = f"tcp://{hosts.addrs[0]}:{next(_port)}"
    procs = []
    for k in range(HOSTS):
        rank_env = dict(env, RANK=str(k), WORLD_SIZE=str(HOSTS), LOCAL_RANK="0",
                        LOCAL_WORLD_SIZE="1")  # fmt: skip
        procs.append(
            hosts.popen(k, [PYTHON, TCP_JOB, which, url], env=rank_env, cwd=REPO,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        start_new_session=True)
        )  # fmt: skip
    results = finish(procs, 90)
    detail = "\n".join(f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                       for r in results)  # fmt: skip
    assert all(r.returncode == 0 for r in results), detail
    for k, r in enumerate(results):
        m = re.search(r"TCPJOB (\{.*\})", r.stdout)
        assert m, detail
        rep = json.loads(m.group(1))
        assert rep["rank"] == k and rep["sum"] == sum(range(1, HOSTS + 1)), rep
        others = {str(p): [hosts.addrs[p], False] for p in range(HOSTS) if p != k}
        assert rep["peers"] == others, rep  # the other host's address, not this host
