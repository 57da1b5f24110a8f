"""`pycollective run` accepts what torchrun and mpirun users type: real jobs for each
spelling, parser-only checks for the refusals."""

from __future__ import annotations

import argparse
import os
import re
import socket
import stat
import subprocess
import sys

import pytest

from pycollective.__main__ import main
from pycollective._errors import UsageError
from pycollective.cli import run

pytestmark = pytest.mark.timeout(60)

# Each rank prints what it was given; the env is checked against torchrun's contract.
SHOW = (
    "import os; print('ENV', os.environ['RANK'], os.environ['WORLD_SIZE'], "
    "os.environ['LOCAL_WORLD_SIZE'], os.environ['MASTER_PORT'], "
    "os.environ.get('OMP_NUM_THREADS'), os.environ['GROUP_WORLD_SIZE'])"
)


def pyrun(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pycollective", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=50, env={**os.environ, **env}
    )


def envs(res: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert res.returncode == 0, res.stderr
    rows = [line.split("ENV ", 1)[1].split() for line in res.stdout.splitlines() if "ENV " in line]
    return sorted(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "spelling",
    [
        ["--nproc_per_node", "2"],
        ["--nproc-per-node=2", "--standalone"],
        ["-np", "2"],
        ["--np", "2", "--nnodes", "1:1", "--rdzv_backend", "c10d"],
    ],
    ids=["torchrun-underscore", "torchrun-standalone", "mpirun-np", "np-nnodes-range"],
)
def test_torchrun_and_mpirun_spellings_launch_a_job(spelling):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", *spelling, sys.executable, "-c", SHOW],
        capture_output=True, text=True, timeout=50, env=env,
    )  # fmt: skip
    rows = envs(res)
    assert [r[:3] for r in rows] == [["0", "2", "2"], ["1", "2", "2"]]
    assert {r[4] for r in rows} == {"1"}  # OMP_NUM_THREADS, as torchrun sets it
    assert {r[5] for r in rows} == {"1"}  # GROUP_WORLD_SIZE = nnodes
    # said once by the launcher, not by each rank
    assert res.stderr.count("setting OMP_NUM_THREADS=1") == 1, res.stderr


def test_default_is_one_rank_and_a_users_omp_setting_is_kept():
    res = pyrun("run", sys.executable, "-c", SHOW, OMP_NUM_THREADS="3")
    rows = envs(res)
    assert len(rows) == 1 and rows[0][1] == "1" and rows[0][4] == "3"
    assert "OMP_NUM_THREADS" not in res.stderr


def test_rdzv_endpoint_and_underscore_master_options():
    port = free_port()
    rows = envs(pyrun("run", "--nproc_per_node", "2", "--rdzv_endpoint", f"127.0.0.1:{port}",
                      sys.executable, "-c", SHOW))  # fmt: skip
    assert {r[3] for r in rows} == {str(port)}
    # node 1 of 2 (node 0 is not started: nothing connects to the store here)
    port = free_port()
    rows = envs(pyrun("run", "--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1",
                      "--master_addr", "127.0.0.1", "--master_port", str(port),
                      sys.executable, "-c", SHOW, PYCOLLECTIVE_SECRET="s"))  # fmt: skip
    assert [r[:2] for r in rows] == [["2", "4"], ["3", "4"]]
    assert {r[3] for r in rows} == {str(port)} and {r[5] for r in rows} == {"2"}


def test_module_and_no_python(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        "import sys, os\nprint('MOD', os.environ['RANK'], sys.argv[1:])\n"
    )
    res = pyrun("run", "-n", "2", "-m", "mypkg.train", "--lr", "0.1", PYTHONPATH=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert sorted(line for line in res.stdout.splitlines() if "MOD" in line) == [
        "[rank 0]: MOD 0 ['--lr', '0.1']",
        "[rank 1]: MOD 1 ['--lr', '0.1']",
    ]
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\necho "SH $RANK $WORLD_SIZE"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    res = pyrun("run", "-n", "2", "--no_python", str(script))
    assert res.returncode == 0, res.stderr
    assert sorted(line for line in res.stdout.splitlines() if "SH" in line) == [
        "[rank 0]: SH 0 2",
        "[rank 1]: SH 1 2",
    ]


def test_version_and_errors_from_runs_own_parser():
    res = pyrun("--version")
    assert res.returncode == 0 and res.stdout.startswith("pycollective 0.")
    res = pyrun("run", "--bogus", "x", "train.py")
    assert res.returncode == 2
    assert "usage: pycollective run" in res.stderr and "unrecognized arguments" in res.stderr


def test_a_missing_script_is_named_once(tmp_path):
    for cmd in (["missing.py"], [sys.executable, "missing.py"]):
        res = subprocess.run(
            [sys.executable, "-m", "pycollective", "run", "-n", "2", *cmd],
            capture_output=True, text=True, timeout=30, cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 2
        assert res.stderr.strip() == "pycollective run: no such script: missing.py"
        assert res.stdout == ""


def _options(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    return run.resolve_options(parser.parse_args([*argv, "true"]))


def test_spellings_map_to_the_same_options():
    base = _options("-n", "2")
    for spelling in (["--nproc_per_node", "2"], ["-np", "2"], ["--nproc-per-node", "2"]):
        assert _options(*spelling) == base
    assert _options("--nproc_per_node", "cpu")["nprocs"] == (os.cpu_count() or 1)
    assert _options()["nprocs"] == 1
    got = _options("--rdzv-endpoint", "node0", "--nnodes", "2", "--node-rank", "1")
    assert (got["master_addr"], got["master_port"], got["nnodes"]) == ("node0", 29400, 2)
    assert _options("--rdzv-endpoint", "[::1]:1234")["master_port"] == 1234


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--nnodes", "1:4"], "elastic"),
        (["--rdzv-backend", "zookeeper"], "c10d, static"),
        (["--rdzv-backend", "etcd"], "needs --rdzv-endpoint"),
        (["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h:1"], "v3"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "h:x"], "bad port"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "h", "--master-port", "2"], "drop"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "h", "--nnodes", "2"], "--node-rank"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "h", "--rdzv-conf", "x=1"], "cacert="),
        (["--standalone", "--nnodes", "2"], "single-node"),
        (["--standalone", "--master-port", "5"], "free local port"),
        (["--nproc_per_node", "gpu"], "CPUs"),
        (["-n", "two"], "must be a number"),
        (["--rdzv-endpoint", "h:1", "--nnodes", "2"], "--node-rank"),
        (["--rdzv-endpoint", "h:1", "--master-port", "2"], "disagree"),
        (["-m", "--no-python"], "cannot be used together"),
    ],
)
def test_refusals_say_what_to_do(argv, says):
    with pytest.raises(UsageError, match=says):
        _options(*argv)


def test_refusals_exit_2_with_the_message(capsys):
    assert main(["run", "--nnodes", "1:4", "true"]) == 2
    assert "pycollective run: --nnodes 1:4" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--log-dir", "logs"], "--log-dir (torchrun's) is not supported: every line"),
        (["--log_dir", "logs"], "redirect those"),
        (["-r", "3"], "--redirects (torchrun's) is not supported"),
        (["--tee", "3"], "--no-prefix drops it"),
        (["--local_ranks_filter", "0"], "grep"),
        (["--local-addr", "10.0.0.1"], "PYCOLLECTIVE_SOCKET_IFNAME"),
    ],
)
def test_torchrun_options_without_a_counterpart_say_what_to_do(argv, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        _options(*argv)


def test_torchrun_agent_options_are_ignored_with_a_note(capsys):
    got = _options("--monitor_interval", "1", "--start-method", "spawn", "-n", "2")
    assert got["nprocs"] == 2
    err = capsys.readouterr().err
    assert "--monitor-interval (torchrun's) is ignored" in err
    assert "--start-method (torchrun's) is ignored" in err


def test_the_etcd_rendezvous_spellings():
    got = _options("--rdzv-backend", "etcd", "--rdzv-endpoint", "h1:2379,h2,h3:2381",
                   "--rdzv-id", "job7", "--rdzv-conf", "cacert=/ca.pem,user=u,protocol=https",
                   "--elastic", "2:8", "--nnodes", "4", "-n", "2")  # fmt: skip
    assert got["etcd"] == ("h1:2379,h2,h3:2381", "job7")
    assert got["etcd_env"] == {"PYCOLLECTIVE_ETCD_CACERT": "/ca.pem", "PYCOLLECTIVE_ETCD_USER": "u"}
    assert (got["nnodes"], got["elastic"], got["master_addr"]) == (4, (2, 8), None)
    assert _options("--rdzv_backend", "etcd", "--rdzv_endpoint", "h")["etcd"] == ("h", "default")
