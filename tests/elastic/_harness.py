"""Real elastic jobs for the tests and tools/faults.py: start members (under `pycollective
run --elastic`, or by hand with a store of their own), watch what each prints
(tests/elastic/_worker.py), kill some at chosen moments, and judge the outcome: the
survivors finish, lose at most the step in flight, end bit for bit identical (replacements
too), recover within the bound, and leave nothing running or in /dev/shm."""

from __future__ import annotations

import json
import os
import random
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

from pycollective._netutil import free_port

REPO = Path(__file__).resolve().parent.parent.parent
WORKER = REPO / "tests" / "elastic" / "_worker.py"
_LINE = re.compile(r"^(?:\[rank (\d+)\]: )?(PID|STEP|ROUND|DONE) (\{.*\})$")


@dataclass
class Member:
    id: int  # the launcher's RANK (a replacement gets a new one)
    pid: int = 0
    uid: str = ""
    started: float = 0.0
    steps: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    done: dict | None = None
    killed_at: float | None = None

    def take(self, kind: str, data: dict) -> None:
        """One line a member printed: PID (who it is), STEP, ROUND, or its last (DONE)."""
        if kind == "PID":
            self.pid, self.uid, self.started = data["pid"], data["uid"], data["started"]
        elif kind == "STEP":
            self.steps.append(data)
        elif kind == "ROUND":
            self.rounds.append(data)
        else:
            self.done = data


@dataclass
class Kill:
    kind: str  # "step" (a random moment), "collective" (the others wait in the all_reduce
    # for it), "recovery" (during the round after another kill), "joining", "double",
    # "donor" (the leader, while a replacement joins and receives its state)
    victims: list[int]
    at: float
    committed_before: int = 0  # the highest step committed by a survivor before the kill
    resumed_step: int | None = None  # committed steps of the round after it
    recovery_s: float | None = None  # kill -> every survivor committed a step again


@dataclass
class Outcome:
    rc: int | None
    members: dict[int, Member]
    kills: list[Kill]
    stderr: str
    problems: list[str] = field(default_factory=list)
    joining_kills: int = 0  # replacements killed while joining (not judged as failures)

    def replacement_seconds(self) -> list[float]:
        """For each replacement that got in (even if a later kill took it): its process
        start -> its first committed step."""
        out = []
        for m in self.members.values():
            if m.rounds and m.rounds[0]["round"] > 0:
                ok = [s for s in m.steps if s["ok"]]
                if ok:
                    out.append(ok[0]["t"] - m.started)
        return out


class Job:
    def __init__(
        self,
        nprocs: int = 4,
        *,
        elastic: str = "2:4",
        restarts: int = 0,
        launcher: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.nprocs = nprocs
        self.tag = uuid.uuid4().hex
        self.tmp = tempfile.mkdtemp(prefix="elastic-job-")
        self.stop_file = os.path.join(self.tmp, "stop")
        self.members: dict[int, Member] = {}
        self.stderr: list[str] = []
        self._cv = threading.Condition()
        self.shm_before = set(os.listdir("/dev/shm"))
        base = dict(os.environ)
        base.update(
            EL_TAG=self.tag, EL_STOP_FILE=self.stop_file, PYCOLLECTIVE_FLIGHT_DIR=self.tmp,
            EL_KILL_DIR=self.tmp,
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO),
                                                     os.environ.get("PYTHONPATH")])),
        )  # fmt: skip
        base.update(env or {})
        self.env = base
        self.procs: list[subprocess.Popen[str]] = []
        self.port = free_port()
        if launcher:
            cmd = [sys.executable, "-m", "pycollective", "run", "-n", str(nprocs),
                   "--elastic", elastic, "--max-restarts", str(restarts),
                   sys.executable, str(WORKER)]  # fmt: skip
            self._start(cmd, base, None)
        else:
            for r in range(nprocs):
                self.start_member(r)

    def start_member(self, rank: int) -> None:
        """A member started by hand (no launcher): RANK, WORLD_SIZE, MASTER_ADDR/PORT."""
        env = dict(self.env)
        for k in ("PYCOLLECTIVE_STORE_HOSTED", "PYCOLLECTIVE_ELASTIC"):
            env.pop(k, None)
        env.update(RANK=str(rank), WORLD_SIZE=str(self.nprocs), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(self.port), PYTHONUNBUFFERED="1")  # fmt: skip
        self._start([sys.executable, str(WORKER)], env, rank)

    def _start(self, cmd: list[str], env: dict[str, str], rank: int | None) -> None:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        for stream, fn in ((proc.stdout, self._read_out), (proc.stderr, self._read_err)):
            threading.Thread(target=fn, args=(stream, rank), daemon=True).start()

    def _read_out(self, stream, rank: int | None) -> None:
        for line in stream:
            m = _LINE.match(line.strip())
            if not m:
                continue
            r = int(m[1]) if m[1] is not None else rank
            data = json.loads(m[3])
            with self._cv:
                mem = self.members.setdefault(r, Member(r))
                mem.take(m[2], data)
                self._cv.notify_all()

    def _read_err(self, stream, rank: int | None) -> None:
        for line in stream:
            with self._cv:
                self.stderr.append(line if rank is None else f"[member {rank}]: {line}")
                self._cv.notify_all()

    def wait(self, pred, timeout: float) -> bool:
        """Until pred(job), re-checked at every line and every 0.1 s (processes exit
        without a line)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not pred(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(0.1, left))
            return True

    def live(self) -> list[Member]:
        with self._cv:
            return [m for m in self.members.values() if m.killed_at is None and m.done is None]

    def max_step(self, exclude: set[int] = frozenset()) -> int:
        with self._cv:
            return max((s["step"] for m in self.members.values() if m.id not in exclude
                        for s in m.steps if s["ok"]), default=0)  # fmt: skip

    def stepping(self, n: int) -> bool:
        """n live members, all in one round and each committed a step in it."""
        live = self.live()
        if len(live) != n:
            return False
        rounds = {m.rounds[-1]["round"] if m.rounds else None for m in live}
        if len(rounds) != 1 or None in rounds:
            return False
        r = rounds.pop()
        return all(any(s["ok"] and s["round"] == r for s in m.steps) for m in live)

    def kill(self, ids: list[int], kind: str) -> Kill:
        with self._cv:
            survivors = [m for m in self.members.values()
                         if m.killed_at is None and m.id not in ids]  # fmt: skip
            before = max((s["step"] for m in survivors for s in m.steps if s["ok"]), default=0)
            at = time.time()
            for i in ids:
                os.kill(self.members[i].pid, signal.SIGKILL)
                self.members[i].killed_at = at
        return Kill(kind, ids, at, before)

    def kill_in_collective(self, victim: int) -> Kill:
        """The victim SIGKILLs itself just before its next all_reduce, while the others
        wait in it (tests/elastic/_worker.py checks for a file named after its pid)."""
        with self._cv:
            m = self.members[victim]
            survivors = [x for x in self.members.values()
                         if x.killed_at is None and x.id != victim]  # fmt: skip
            before = max((s["step"] for x in survivors for s in x.steps if s["ok"]), default=0)
            at = time.time()
            open(os.path.join(self.tmp, str(m.pid)), "w").close()
            m.killed_at = at
        deadline = time.monotonic() + 10
        while _alive(m.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        return Kill("collective", [victim], at, before)

    def stop_at(self, step: int) -> None:
        with open(self.stop_file + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(self.stop_file + ".tmp", self.stop_file)

    def finish(self, timeout: float) -> int | None:
        rc = None
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                rc_one = proc.wait(max(0.1, deadline - time.monotonic()))
                rc = rc_one if rc is None or rc == 0 else rc
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = -9
        time.sleep(0.2)  # the readers drain
        shutil.rmtree(self.tmp, ignore_errors=True)  # every member is gone: nothing writes
        return rc

    def leftovers(self, also: list[int] = ()) -> list[str]:
        problems = []
        deadline = time.monotonic() + 3.0
        pids = _tagged(self.tag)
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _tagged(self.tag)
        if pids:
            problems.append(f"processes left behind: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        ours = {str(m.pid) for m in self.members.values()}
        left = [n for n in set(os.listdir("/dev/shm")) - self.shm_before
                if any(f"-{p}-" in n for p in ours)]  # fmt: skip
        if left:
            problems.append(f"shared memory left behind: {left}")
        shutil.rmtree(self.tmp, ignore_errors=True)  # flight dumps, stop file: nothing writes now
        return problems

    def judge(self, rc: int | None, kills: list[Kill], steps: int) -> Outcome:
        out = Outcome(rc, dict(self.members), kills, "".join(self.stderr))
        if rc != 0:
            out.problems.append(f"exit status {rc}")
        finished = [m for m in self.members.values() if m.killed_at is None]
        digests = {m.done["digest"] for m in finished if m.done}
        if not finished or any(m.done is None for m in finished):
            out.problems.append(
                f"members without DONE: {[m.id for m in finished if m.done is None]}"
            )
        if len(digests) > 1:
            out.problems.append(f"the members diverged: {len(digests)} different final states")
        if any(m.done and m.done["step"] != steps for m in finished):
            out.problems.append(f"final steps {[m.done['step'] for m in finished if m.done]}")
        for k in kills:
            # the members training when it happened (not a replacement starting), even if a
            # later kill took them
            survivors = [
                m for m in self.members.values()
                if (m.killed_at is None or m.killed_at > k.at)
                and any(s["ok"] and s["t"] < k.at for s in m.steps)
            ]  # fmt: skip
            # a round that ended after the kill and left a victim out; it may have begun
            # before it (a second loss while the round after a first one forms is taken
            # into that same recovery)
            after = [r for m in survivors for r in m.rounds
                     if r["started"] + r["seconds"] >= k.at - 0.05
                     and set(r["lost"]) & {self.members[v].uid for v in k.victims}]  # fmt: skip
            if not after:
                out.problems.append(f"no survivor went through a round after kill {k}")
                continue
            k.resumed_step = min(r["step"] for r in after)
            if k.committed_before - k.resumed_step > 1:
                out.problems.append(
                    f"kill at {k.at:.3f}: committed step {k.committed_before} before, "
                    f"the new round resumed at {k.resumed_step}"
                )
            firsts = []
            for m in survivors:
                later = [s for s in m.steps if s["ok"] and s["t"] > k.at]
                if later:
                    firsts.append(later[0]["t"] - k.at)
            k.recovery_s = max(firsts) if firsts else None
        return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _tagged(tag: str) -> list[int]:
    found = []
    needle = f"EL_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def kills_in_a_row(
    kills: int, seed: int, *, env: dict[str, str] | None = None, log=None
) -> Outcome:
    """One job of 4 members under `pycollective run --elastic 2:4`; kill -9 `kills` times,
    at random moments: mid-step (in a collective or computing), a second member while the
    round after a first kill forms (mid-recovery), a replacement as it joins, and two at
    once; the launcher starts a replacement after each loss. Then stop and judge."""
    rng = random.Random(seed)
    plan = ["step", "collective", "double", "recovery", "joining", "step", "donor",
            "collective", "recovery", "step"]  # fmt: skip
    job = Job(4, elastic="2:4", restarts=2 * kills + 2,
              env={"EL_STEPS": "1000000", "EL_SLEEP": "0.02", **(env or {})})  # fmt: skip
    done: list[Kill] = []
    problems: list[str] = []
    try:
        count = 0
        i = 0
        while count < kills:
            kind = plan[i % len(plan)]
            if kills - count < (2 if kind in ("double", "recovery", "joining", "donor") else 1):
                kind = "step"  # one kill left
            i += 1
            if not job.wait(lambda j: j.stepping(4), 90):
                problems.append(f"the job did not get back to 4 stepping members (kill {count})")
                break
            time.sleep(rng.uniform(0.05, 0.8))
            live = sorted(m.id for m in job.live())
            if kind == "double":
                done.append(job.kill(rng.sample(live, 2), kind))
                count += 2
            elif kind == "recovery":
                first = job.kill([rng.choice(live)], "step")
                done.append(first)
                time.sleep(rng.uniform(0.0, 0.06))
                rest = [x for x in live if x not in first.victims]
                done.append(job.kill([rng.choice(rest)], "recovery"))
                count += 2
            elif kind == "donor":
                # a loss, then the leader (the donor of the state) while the replacement
                # starts, registers or receives the state
                newest = max(live)
                done.append(job.kill([rng.choice([x for x in live if x != newest])], "step"))
                count += 1
                if not job.wait(lambda j, n=newest: max(j.members) > n, 60):
                    problems.append("no replacement started")
                    break
                time.sleep(rng.uniform(0.3, 1.5))
                leaders = [m.id for m in job.live() if m.steps and m.steps[-1]["rank"] == 0]
                if leaders:
                    done.append(job.kill(leaders[:1], "donor"))
                    count += 1
            elif kind == "collective":
                done.append(job.kill_in_collective(rng.choice(live)))
                count += 1
            elif kind == "joining":
                newest = max(live)
                job.kill([rng.choice([x for x in live if x != newest])], "step")
                count += 1
                # the replacement: kill it once it has registered, before it is in step
                if not job.wait(lambda j, n=newest: max(j.members) > n, 60):
                    problems.append("no replacement started")
                    break
                time.sleep(rng.uniform(0.3, 1.2))  # while it imports, registers or joins
                done.append(job.kill([max(job.members)], "joining"))
                count += 1
            else:
                done.append(job.kill([rng.choice(live)], kind))
                count += 1
            if log:
                log(f"kill {count}: {done[-1].kind} {done[-1].victims}")
        job.wait(lambda j: j.stepping(4), 90)
        stop = job.max_step() + 40
        job.stop_at(stop)
        rc = job.finish(120)
    except BaseException:
        job.finish(5)
        raise
    out = job.judge(rc, [k for k in done if k.kind != "joining"], stop)
    out.joining_kills = sum(1 for k in done if k.kind == "joining")
    out.problems[:0] = problems
    out.problems += job.leftovers()
    return out
