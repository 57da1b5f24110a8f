"""`pycollective run` when a rank dies: the survivors speak before any signal (the notice
window), the ranks still running get SIGUSR1 (flight recorders dump) before SIGTERM, each
traceback is printed once, and --max-restarts starts every rank again. Real processes.
The 20-run loop of the kill test is `make faults` (tools/faults.py --only launcher)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_lost_rank_worker.py"

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def lost_rank_run(
    nprocs: int, victim: int, at: int, *extra: str, args: tuple[str, ...] = (), env=None
) -> tuple[subprocess.CompletedProcess[str], list[int], float]:
    """Run the worker under the launcher; returns the result, the ranks' pids and the
    launcher's wall time."""
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", str(nprocs), *args,
           sys.executable, str(WORKER), str(victim), str(at), *extra]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=50, env={**os.environ, **(env or {})}
    )
    pids = [int(p) for p in re.findall(r"^\[rank \d+\]: PID (\d+)$", res.stdout, re.M)]
    return res, pids, time.monotonic() - t0


def check_lost_rank(nprocs: int, victim: int, at: int) -> list[str]:
    """One kill run; the problems found (empty: all is well). Shared with tools/faults.py."""
    shm_before = set(os.listdir("/dev/shm"))
    res, pids, _ = lost_rank_run(nprocs, victim, at)
    problems = []
    if res.returncode != 128 + signal.SIGKILL:
        problems.append(f"launcher exit status {res.returncode}, expected {128 + signal.SIGKILL}")
    if f"rank {victim} was killed by SIGKILL (the first rank to fail)" not in res.stderr:
        problems.append("the launcher did not name the killed rank first")
    if len(pids) != nprocs:
        problems.append(f"{len(pids)} of {nprocs} ranks said their pid")
    for r in sorted(set(range(nprocs)) - {victim}):
        # the survivor's own error line, printed by itself, once
        lines = re.findall(
            rf"^\[rank {r}\]: pycollective\._errors\.TransportError: .*$", res.stderr, re.M
        )
        if len(lines) != 1:
            problems.append(f"survivor {r} printed its error line {len(lines)} times")
        if f"[rank {r}]: FINALLY {r}" not in res.stdout:
            problems.append(f"survivor {r}'s finally block did not run")
        if f"rank {r} was killed by SIGTERM" in res.stderr:
            problems.append(f"survivor {r} was killed by SIGTERM")
    if res.stderr.count("Traceback (most recent call last)") != nprocs - 1:
        problems.append("a traceback was printed more or less than once per survivor")
    deadline = time.monotonic() + 3
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    if any(_alive(p) for p in pids):
        problems.append(f"ranks left running: {[p for p in pids if _alive(p)]}")
    left = [n for n in set(os.listdir("/dev/shm")) - shm_before if any(str(p) in n for p in pids)]
    if left:
        problems.append(f"shared memory left: {left}")
    if problems:
        problems.append("stderr: " + res.stderr[-2000:])
    return problems


@pytest.mark.parametrize("nprocs,victim,at", [(3, 2, 30), (4, 1, 5)])
def test_a_killed_rank_lets_every_survivor_print_its_error(nprocs, victim, at):
    assert check_lost_rank(nprocs, victim, at) == []


def test_ranks_not_in_a_collective_get_sigusr1_then_sigterm(tmp_path):
    # rank 1 dies; rank 0 sleeps in Python and never learns of it: after the notice window
    # it gets SIGUSR1 (its flight recorder dumps), then SIGTERM.
    res, pids, elapsed = lost_rank_run(
        2, 1, 3, "sleep", args=("--notice", "0.5", "--grace", "1"),
        env={"PYCOLLECTIVE_FLIGHT_DIR": str(tmp_path)},
    )  # fmt: skip
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert "the other ranks have 0.5 s to exit on their own" in res.stderr
    assert "rank 0 was killed by SIGTERM" in res.stderr
    dumps = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert [d["reason"] for d in dumps] == ["SIGUSR1"], res.stderr
    assert "flight recorder dumps in" in res.stderr
    assert elapsed < 30


def test_max_restarts_starts_every_rank_again_with_the_count(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    code = textwrap.dedent(
        f"""
        import json, os, numpy as np, pycollective as dist
        count = int(os.environ["PYCOLLECTIVE_RESTART_COUNT"])
        assert os.environ["TORCHELASTIC_RESTART_COUNT"] == str(count)
        dist.init_process_group()
        rank = dist.get_rank()
        ckpt = {str(ckpt)!r}
        start = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
        x = np.zeros(1)
        for step in range(start, 8):
            x[0] = step
            dist.all_reduce(x)
            if rank == 0:
                with open(ckpt + ".tmp", "w") as f:
                    json.dump({{"step": step + 1}}, f)
                os.replace(ckpt + ".tmp", ckpt)
            if count == 0 and step == 4 and rank == 1:
                raise SystemExit(5)
            dist.barrier()
        print(f"done restart={{count}} from={{start}} sum={{x[0]:g}}", flush=True)
        """
    )
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", "--max-restarts", "1",
         "--notice", "1", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "rank 1 exited with status 5" in res.stderr
    assert "restarting every rank (restart 1 of 1)" in res.stderr
    done = re.findall(r"^\[rank (\d)\]: done restart=1 from=(\d) sum=14$", res.stdout, re.M)
    assert sorted(r for r, _ in done) == ["0", "1"], res.stdout
    assert {f for _, f in done} == {"5"}  # resumed from the checkpoint, not from 0


def test_max_restarts_gives_up_after_k(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", "--max-restarts", "2",
         sys.executable, "-c",
         "import os, sys; print('attempt', os.environ['PYCOLLECTIVE_RESTART_COUNT']);"
         " sys.exit(4 if os.environ['RANK'] == '0' else 0)"],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert res.returncode == 4
    assert res.stdout.count("[rank 0]: attempt") == 3
    assert "no restarts left (--max-restarts 2)" in res.stderr


def test_elastic_goes_on_without_a_lost_rank_and_starts_a_replacement():
    code = (
        "import os, sys, time\n"
        "print('elastic', os.environ['PYCOLLECTIVE_ELASTIC'], 'local', os.environ['LOCAL_RANK'])\n"
        "if os.environ['RANK'] == '1': os.kill(os.getpid(), 9)\n"
        "time.sleep(1.5)\n"
        "if os.environ['RANK'] == '2' and len(sys.argv) > 1: sys.exit(4)\n"
    )
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", "3", "--elastic", "2:3",
           "--max-restarts", "1", "--notice", "0.5", sys.executable, "-c", code]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stderr
    assert "rank 1 was killed by SIGKILL; 2 ranks go on and rank 3 starts to replace it" in (
        res.stderr
    )
    assert "[rank 3]: elastic 2:3 local 1" in res.stdout  # the lost rank's slot
    assert "elastic: the job went on without rank 1 (was killed by SIGKILL)" in res.stderr
    assert "SIGTERM" not in res.stderr
    # a rank that exits with an error (not a lost worker: an exception) ends the job
    res = subprocess.run([*cmd, "fail"], capture_output=True, text=True, timeout=50)
    assert res.returncode == 4, res.stderr
    assert "rank 2 exited with status 4 (the first rank to fail)" in res.stderr
