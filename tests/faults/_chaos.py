"""Kill -9 and SIGINT runs of a real job under `pycollective run`, shared by the tests
(tests/faults/test_chaos.py) and the fault-injection driver (tools/faults.py).

Each run starts the launcher on tests/faults/_chaos_worker.py, waits until every rank is
in its loop of mixed collectives, then either kills one rank with SIGKILL at a random
moment or sends SIGINT to the launcher, and checks what the issue asks: every survivor
raises a CollectiveError subclass within the bound, the launcher exits non-zero naming
the rank, and no process or shared-memory segment of the job is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
WORKER = REPO / "tests" / "faults" / "_chaos_worker.py"
_LINE = re.compile(r"^\[rank (\d+)\]: (\w+) (\{.*\})$")


@dataclass
class RunResult:
    kind: str
    nprocs: int
    victim: int | None = None
    launcher_rc: int | None = None
    raise_seconds: dict[int, float] = field(default_factory=dict)  # survivor -> after kill
    errors: dict[int, str] = field(default_factory=dict)
    exit_seconds: float | None = None  # SIGINT: until the launcher (and every rank) was gone
    problems: list[str] = field(default_factory=list)
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def job_pids(tag: str) -> list[int]:
    """Live processes whose environment carries this run's tag (ranks and their children)."""
    found = []
    needle = f"CHAOS_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


class _Job:
    def __init__(self, nprocs: int, seed: int, env: dict[str, str] | None, grace: float) -> None:
        self.tag = uuid.uuid4().hex
        self.nprocs = nprocs
        child_env = dict(os.environ)
        child_env.update(
            CHAOS_TAG=self.tag, CHAOS_SEED=str(seed), PYCOLLECTIVE_TIMEOUT="60",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO),
                                                     os.environ.get("PYTHONPATH")])),
        )  # fmt: skip
        self.flight_dir = tempfile.mkdtemp(prefix="chaos-flight-")
        child_env["PYCOLLECTIVE_FLIGHT_DIR"] = self.flight_dir
        child_env.update(env or {})
        self.shm_before = shm_names()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pycollective", "run", "-n", str(nprocs), "--grace",
             str(grace), sys.executable, str(WORKER)],
            env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.events: list[tuple[int, str, dict]] = []
        self.stderr: list[str] = []
        self._cv = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = _LINE.match(line.strip())
            if m:
                with self._cv:
                    self.events.append((int(m[1]), m[2], json.loads(m[3])))
                    self._cv.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait_for(self, tag: str, count: int, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(
                lambda: sum(1 for _, t, _ in self.events if t == tag) >= count, timeout
            )

    def of(self, tag: str) -> dict[int, dict]:
        with self._cv:
            return {r: d for r, t, d in self.events if t == tag}

    def finish(self, timeout: float) -> int | None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for t in self._threads:
            t.join(5)
        shutil.rmtree(self.flight_dir, ignore_errors=True)
        return rc

    def leftovers(self, result: RunResult) -> None:
        """Nothing of the job may outlive the launcher: processes, segments."""
        deadline = time.monotonic() + 2.0
        pids = job_pids(self.tag)
        while pids and time.monotonic() < deadline:  # the kernel may still be reaping
            time.sleep(0.05)
            pids = job_pids(self.tag)
        if pids:
            result.problems.append(f"processes left behind: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        ours = {str(d["pid"]) for d in self.of("PID").values()}
        new = [n for n in shm_names() - self.shm_before if any(p in n for p in ours)]
        if new:
            result.problems.append(f"shared-memory segments left behind: {new}")
        shutil.rmtree(self.flight_dir, ignore_errors=True)  # once nothing can write there


def kill_run(
    nprocs: int,
    seed: int,
    delay: float,
    victim: int,
    env: dict[str, str] | None = None,
    bound: float = 5.0,
) -> RunResult:
    """Kill rank `victim` with SIGKILL `delay` seconds after every rank is in its loop."""
    res = RunResult("kill", nprocs, victim)
    job = _Job(nprocs, seed, env, grace=10.0)
    if not job.wait_for("READY", nprocs, 60):
        res.problems.append("the job never got going")
    else:
        time.sleep(delay)
        pid = job.of("PID")[victim]["pid"]
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        job.wait_for("RAISED", nprocs - 1, bound + 10)
        res.launcher_rc = job.finish(40)
        raised = job.of("RAISED")
        for r in range(nprocs):
            if r == victim:
                continue
            d = raised.get(r)
            if d is None:
                res.problems.append(f"survivor rank {r} never raised")
                continue
            res.raise_seconds[r] = d["at"] - t_kill
            res.errors[r] = f"{d['error']}: {d['msg'][:160]}"
            if "CollectiveError" not in d["bases"]:
                res.problems.append(f"rank {r} raised {d['error']}, not a CollectiveError")
            if res.raise_seconds[r] > bound:
                res.problems.append(f"rank {r} raised {res.raise_seconds[r]:.2f} s after the kill")
        err = "".join(job.stderr)
        res.stderr_tail = err[-1500:]
        if not res.launcher_rc:
            res.problems.append(f"launcher exit status {res.launcher_rc}, expected non-zero")
        if f"rank {victim} was killed by SIGKILL (the first rank to fail)" not in err:
            res.problems.append("the launcher did not name the killed rank as the first to fail")
    if res.launcher_rc is None and job.proc.poll() is None:
        res.launcher_rc = job.finish(40)
    job.leftovers(res)
    return res


def sigint_run(nprocs: int, seed: int, delay: float, bound: float = 5.0) -> RunResult:
    """SIGINT to the launcher mid-loop: every rank gone within `bound`, nothing left."""
    res = RunResult("sigint", nprocs)
    job = _Job(nprocs, seed, None, grace=5.0)
    if not job.wait_for("READY", nprocs, 60):
        res.problems.append("the job never got going")
        job.proc.send_signal(signal.SIGKILL)
    else:
        time.sleep(delay)
        t0 = time.monotonic()
        job.proc.send_signal(signal.SIGINT)
        res.launcher_rc = job.finish(bound + 10)
        res.exit_seconds = time.monotonic() - t0
        if res.exit_seconds > bound:
            res.problems.append(f"the job took {res.exit_seconds:.2f} s to end after SIGINT")
        if res.launcher_rc != 128 + signal.SIGINT:
            res.problems.append(f"launcher exit status {res.launcher_rc}, expected 130")
        interrupted = job.of("INTERRUPTED")
        destroyed = job.of("DESTROYED")
        for r in range(nprocs):
            if r not in interrupted:
                res.problems.append(f"rank {r} did not report the interrupt")
            elif r not in destroyed:
                res.problems.append(f"rank {r} did not finish destroy_process_group")
        res.stderr_tail = "".join(job.stderr)[-1500:]
    job.finish(10)
    job.leftovers(res)
    return res
