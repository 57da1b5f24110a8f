"""Start real ranks for tests: N processes with the torchrun environment contract."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pycollective._netutil import free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def run_ranks(
    script: str | Path,
    nprocs: int,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    per_rank_env: dict[int, dict[str, str]] | None = None,
) -> list[RankResult]:
    """Run `script` as `nprocs` ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, as
    torchrun does) and return every rank's outcome. Kills everything at the timeout."""
    port = free_port()
    procs = []
    marks = tempfile.mkdtemp(prefix="marks-")  # _workerlib.mark/wait_for: the ranks' hand-shakes
    for rank in range(nprocs):
        child_env = dict(os.environ)
        child_env.update(
            TEST_MARKS=marks,
            RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
            PYCOLLECTIVE_TIMEOUT="60",
        )
        for k in ("PYCOLLECTIVE_STORE_HOSTED", "TORCHELASTIC_USE_AGENT_STORE"):
            child_env.pop(k, None)
        child_env.update(env or {})
        child_env.update((per_rank_env or {}).get(rank, {}))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=child_env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for rank, proc in enumerate(procs):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                out, err = proc.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                out, err = proc.communicate()
                err += f"\n[test harness] rank {rank} killed after {timeout} s"
            results.append(RankResult(rank, proc.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(marks, ignore_errors=True)
    return results


def assert_all_ok(results: list[RankResult]) -> None:
    bad = [r for r in results if r.returncode != 0]
    if bad:
        text = "\n".join(
            f"--- rank {r.rank} exit {r.returncode}\n"
            f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
            for r in bad
        )
        raise AssertionError(f"{len(bad)} rank(s) failed:\n{text}")


def steps_of(r: RankResult) -> dict[str, dict]:
    """The `RESULT {json}` lines a worker printed, by their "step" field."""
    steps = {}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[len("RESULT ") :])
            steps[d["step"]] = d
    return steps


def tagged(r: RankResult, tag: str) -> list:
    """The `TAG {json}` lines a worker printed, parsed, in order (`DIGEST hex`: the hex)."""
    return [json.loads(x[len(tag) + 1 :]) if tag != "DIGEST" else x.split()[1]
            for x in r.stdout.splitlines() if x.startswith(tag + " ")]  # fmt: skip


def describe(r: RankResult) -> str:
    """A rank's exit and the tail of its output, for assertion messages."""
    return (
        f"rank {r.rank} (exit {r.returncode})\n"
        f"stdout:\n{r.stdout[-2500:]}\nstderr:\n{r.stderr[-2500:]}"
    )


def within(seconds: float) -> float:
    """A latency bound of a test, stretched by SANITIZE_TIME_SCALE: `make sanitize`
    (tools/sanitize/run.py) runs the same tests on a build several times slower."""
    return seconds * float(os.environ.get("SANITIZE_TIME_SCALE", "1"))


def run_bounded(
    cmd: list[str], *, cpu_seconds: float, wall_seconds: float = 120.0, **kwargs
) -> subprocess.CompletedProcess[str]:
    """Run a short command to the end, captured as text, with a bound that fails on a hang
    and not on a busy machine: the child's own CPU time is capped at `cpu_seconds`
    (RLIMIT_CPU: a busy loop dies of SIGXCPU there, however loaded the machine), and a
    child blocked on something is killed at `wall_seconds` (generous: the start of an
    interpreter alone takes seconds at load 15). Raises on either, saying which."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)  # fmt: skip
    limit = max(1, round(cpu_seconds))
    try:
        try:
            resource.prlimit(proc.pid, resource.RLIMIT_CPU, (limit, limit + 1))
        except ProcessLookupError:  # already gone: nothing left to bound
            pass
        out, err = proc.communicate(timeout=wall_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{cmd} still ran after {wall_seconds} s: {err[-2000:]}") from None
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode == -signal.SIGXCPU:
        raise AssertionError(f"{cmd} used more than {limit} s of CPU: {err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
