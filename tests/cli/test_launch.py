"""`pycollective run` with real processes: env contract, output, failures, signals, cleanup."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pycollective.__main__ import main
from pycollective.cli.run import describe_exit, launch

pytestmark = pytest.mark.timeout(30)


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie waiting to be reaped does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids still alive after `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def run_cli(
    args: list[str], code: str | None = None, timeout: float = 30, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m pycollective run ARGS [python -c CODE]`, captured."""
    cmd = [sys.executable, "-m", "pycollective", "run", *args]
    if code is not None:
        cmd += [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


@pytest.fixture
def cli():
    return run_cli


CONTRACT = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "PYCOLLECTIVE_SECRET", "PYCOLLECTIVE_STORE_HOSTED",
    "PYTHONUNBUFFERED",
]  # fmt: skip


def _by_rank(text: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\[rank (\d+)\]: (.*)$", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def _failed_at(stdout: str, rank: int) -> float:
    """The time.monotonic() a rank printed as "failing at T" just before it exited."""
    (line,) = [x for x in _by_rank(stdout)[rank] if x.startswith("failing at ")]
    return float(line.split()[-1])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_env_contract(cli, n):
    code = f"""
        import json, os
        print(json.dumps({{k: os.environ.get(k) for k in {CONTRACT!r}}}))
    """
    res = cli(["-n", str(n)], code)
    assert res.returncode == 0, res.stderr
    lines = _by_rank(res.stdout)
    assert sorted(lines) == list(range(n))
    envs = {r: json.loads(lines[r][0]) for r in lines}
    for r, env in envs.items():
        assert env["RANK"] == str(r) and env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(n)
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert int(env["MASTER_PORT"]) > 0
        assert env["PYCOLLECTIVE_STORE_HOSTED"] == "1" and env["PYTHONUNBUFFERED"] == "1"
        assert len(env["PYCOLLECTIVE_SECRET"]) >= 32
    # one job, one store, one secret
    assert len({(e["MASTER_PORT"], e["PYCOLLECTIVE_SECRET"]) for e in envs.values()}) == 1


def test_multi_node_ranks_and_user_secret(cli):
    code = """
        import os
        print(os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["NODE_RANK"],
              os.environ["MASTER_PORT"], os.environ["PYCOLLECTIVE_SECRET"])
    """
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # node 1 of 2: no store hosted here, global ranks 2 and 3
    res = cli(
        ["-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
         "--master-port", str(port)],
        code, PYCOLLECTIVE_SECRET="shared-by-user",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = sorted(v[0] for v in _by_rank(res.stdout).values())
    assert got == [f"2 4 1 {port} shared-by-user", f"3 4 1 {port} shared-by-user"]


def test_ranks_use_the_hosted_store(cli):
    code = """
        import os
        from pycollective._errors import AuthenticationError
        from pycollective.store import TCPStore
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        s = TCPStore(addr, port, timeout=10)  # the secret comes from the environment
        s.add("arrived", 1)
        s.set(f"r{rank}", str(rank))
        s.wait([f"r{r}" for r in range(n)])
        try:
            TCPStore(addr, port, b"not-the-secret", timeout=5)
            print("INTRUDER ADMITTED")
        except AuthenticationError:
            print("intruder refused")
        s.close()
    """
    res = cli(["-n", "3"], code)
    assert res.returncode == 0, res.stderr
    assert all(v == ["intruder refused"] for v in _by_rank(res.stdout).values())
    assert len(_by_rank(res.stdout)) == 3


def test_output_is_prefixed_per_stream(cli):
    code = """
        import os, sys
        r = os.environ["RANK"]
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
        sys.stdout.write("no newline at the end")
    """
    res = cli(["-n", "2"], code)
    assert res.returncode == 0, res.stderr
    for r in (0, 1):
        assert f"[rank {r}]: out {r}\n" in res.stdout
        assert f"[rank {r}]: no newline at the end\n" in res.stdout
        assert f"[rank {r}]: err {r}\n" in res.stderr
        assert f"err {r}" not in res.stdout
    plain = cli(["-n", "2", "--no-prefix"], code)
    assert plain.returncode == 0
    assert "[rank" not in plain.stdout and "out 0\n" in plain.stdout and "out 1\n" in plain.stdout


def test_failing_rank_stops_the_others_within_the_grace_period(cli):
    code = """
        import os, sys, time
        print(os.getpid(), flush=True)
        if os.environ["RANK"] == "2":
            time.sleep(0.5)
            print("failing at", time.monotonic(), flush=True)
            print("rank two is failing: boom", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """
    res = cli(["-n", "4", "--grace", "2"], code)
    # From the failure, not from the start: starting 5 interpreters on a loaded machine
    # takes seconds of its own. A rank not stopped would sleep its 60 s (CLOCK_MONOTONIC
    # is one clock for every process of the machine).
    elapsed = time.monotonic() - _failed_at(res.stdout, 2)
    assert res.returncode == 3
    assert elapsed < 8, elapsed
    # named once, with the last line of its stderr; its stderr was forwarded only once
    assert "rank 2 exited with status 3 (the first rank to fail): rank two is failing: boom" in (
        res.stderr
    )
    assert res.stderr.count("rank two is failing: boom") == 2  # forwarded, then named
    pids = [int(v[0]) for v in _by_rank(res.stdout).values()]
    assert len(pids) == 4 and wait_dead(pids, 2) == []


def test_rank_ignoring_sigterm_is_killed_after_grace(cli):
    code = """
        import os, signal, sys, time
        print(os.getpid(), flush=True)
        if os.environ["RANK"] == "1":
            time.sleep(0.3)
            print("failing at", time.monotonic(), flush=True)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    """
    res = cli(["-n", "2", "--grace", "1"], code)
    # the grace (1 s) counts from the failure: measured from it, the lower bound has teeth
    elapsed = time.monotonic() - _failed_at(res.stdout, 1)
    assert res.returncode == 1
    assert 1.0 <= elapsed < 8, elapsed
    assert "rank 1 exited with status 1 (the first rank to fail)" in res.stderr
    assert "rank 0 was killed by SIGKILL" in res.stderr
    pids = [int(v[0]) for v in _by_rank(res.stdout).values()]
    assert wait_dead(pids, 2) == []


def test_rank_killed_by_a_signal(cli):
    code = """
        import os, signal, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """
    res = cli(["-n", "3", "--grace", "1"], code)
    assert res.returncode == 128 + signal.SIGKILL
    assert "rank 1 was killed by SIGKILL (the first rank to fail)" in res.stderr


def test_sigint_to_the_launcher_ends_ranks_and_grandchildren():
    code = textwrap.dedent(
        """
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(os.getpid(), child.pid, flush=True)
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pycollective", "run", "-n", "3", "--grace", "2",
         sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids: list[int] = []
        for _ in range(3):
            line = launcher.stdout.readline()
            pids += [int(p) for p in line.split(": ", 1)[1].split()]
        assert all(alive(p) for p in pids)
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
        assert launcher.returncode == 128 + signal.SIGINT
        assert "stopped by SIGINT" in err
        assert wait_dead(pids, 3) == []
    finally:
        launcher.kill()
        launcher.communicate()


def test_success_leaves_nothing_behind(cli):
    code = """
        import os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid)
    """
    res = cli(["-n", "2"], code)
    assert res.returncode == 0, res.stderr
    pids = [int(v[0]) for v in _by_rank(res.stdout).values()]
    assert len(pids) == 2 and wait_dead(pids, 3) == []


def test_python_api_and_script_shortcut(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    out, err = io.BytesIO(), io.BytesIO()
    rc = launch(2, [str(script)], stdout=out, stderr=err, env=dict(os.environ))
    assert rc == 0, err.getvalue()
    text = out.getvalue().decode()
    assert "[rank 0]: hello from 0" in text and "[rank 1]: hello from 1" in text
    assert launch(1, [sys.executable, "-c", "raise SystemExit(7)"], stderr=err) == 7


def test_cli_usage_errors(capsys):
    assert main(["run", "-n", "2"]) == 2  # no command
    assert "no command" in capsys.readouterr().err
    assert main(["run", "-n", "0", "true"]) == 2
    assert main(["run", "-n", "1", "--nnodes", "2", "true"]) == 2
    assert main([]) == 2
    assert main(["run", "-n", "1", "/nonexistent/program"]) == 127
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(2) == "exited with status 2"
