"""Elastic jobs across network-namespace hosts that meet in a 3-member etcd cluster
(tests/multihost/test_elastic_etcd.py, tools/faults.py): every host runs

    pycollective run --rdzv-backend etcd --rdzv-endpoint 10.77.0.1:2379,10.77.0.2:2379,...
                     --rdzv-id JOB --elastic MIN:MAX --nnodes H --node-rank k -n P worker.py

and the faults are a host's: every process on it killed at once (kill -9: its launcher,
its ranks, its etcd member), its link cut first (`ip link set eth0 down` inside it: no FIN
or RST reaches anyone) and then its processes killed, an etcd member alone, two members
(the quorum). A replacement host is the same namespace brought back: its etcd member
restarted from its data directory, a new launcher for the job. What each member prints
is tests/elastic/_worker.py's; the judgement is tests/elastic/_harness.py's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence

from tests._etcd import EtcdCluster
from tests.elastic._harness import _LINE, REPO, WORKER, Job, Kill, Member, Outcome

PYTHON = sys.executable


class HostsJob(Job):
    """An elastic job with `per_host[k]` members on namespace host k (a launcher each)."""

    def __init__(
        self,
        hosts,
        etcd: EtcdCluster,
        per_host: Sequence[int],
        *,
        elastic: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        base = {"EL_STEPS": "1000000", "EL_SLEEP": "0.02", "PYCOLLECTIVE_TIMEOUT": "30"}
        super().__init__(0, launcher=False, env={**base, **(env or {})})
        for k in ("MASTER_ADDR", "MASTER_PORT", "PYCOLLECTIVE_SECRET_FILE", "RANK", "WORLD_SIZE"):
            self.env.pop(k, None)
        self.env.setdefault("PYCOLLECTIVE_SECRET", uuid.uuid4().hex)
        self.hosts = hosts
        self.etcd = etcd
        self.per_host = list(per_host)
        total = sum(self.per_host)
        self.elastic = elastic or f"{max(1, total // 2)}:{total}"
        self.rdzv_id = f"job-{self.tag[:10]}"
        self.launchers: dict[int, subprocess.Popen] = {}  # host -> its launcher now
        self.host_of: dict[int, int] = {}  # member id -> host
        self._next_offset = 0
        for k in range(len(self.per_host)):
            self.start_host(k)

    def start_host(self, k: int) -> None:
        """A launcher for the job on host k (at the start, or as a replacement host)."""
        n = self.per_host[k]
        cmd = [PYTHON, "-m", "pycollective", "run", "--rdzv-backend", "etcd",
               "--rdzv-endpoint", self.etcd.endpoints, "--rdzv-id", self.rdzv_id,
               "--elastic", self.elastic, "--nnodes", str(len(self.per_host)),
               "--node-rank", str(k), "-n", str(n), PYTHON, str(WORKER)]  # fmt: skip
        offset = self._next_offset
        self._next_offset += 100  # member ids: 100 per launcher, never reused
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        proc = self.hosts.popen(k, cmd, env=self.env, cwd=REPO, text=True,
                                start_new_session=True, **pipes)  # fmt: skip
        self.procs.append(proc)
        self.launchers[k] = proc
        for stream, fn in ((proc.stdout, self._read_host_out), (proc.stderr, self._read_err)):
            threading.Thread(target=fn, args=(stream, offset, k), daemon=True).start()

    def _read_host_out(self, stream, offset: int, host: int) -> None:
        for line in stream:
            m = _LINE.match(line.strip())
            if not m or m[1] is None:
                continue
            r = offset + int(m[1]) % 100
            data = json.loads(m[3])
            with self._cv:
                mem = self.members.setdefault(r, Member(r))
                self.host_of[r] = host
                mem.take(m[2], data)
                self._cv.notify_all()

    def _read_err(self, stream, offset, host=None) -> None:
        for line in stream:
            with self._cv:
                self.stderr.append(line if host is None else f"[host {host}] {line}")
                self._cv.notify_all()

    def on_host(self, k: int) -> list[int]:
        with self._cv:
            return [m.id for m in self.members.values() if self.host_of.get(m.id) == k
                    and m.killed_at is None and m.done is None]  # fmt: skip

    def _kill_namespace(self, k: int) -> None:
        ns = self.hosts.names[k]
        for _ in range(20):
            res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            pids = [int(p) for p in res.stdout.split() if p.isdigit()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        proc = self.launchers.pop(k, None)
        if proc is not None:
            proc.wait()
        for i, host in enumerate(self.etcd.on):
            if host == k and self.etcd.procs[i] is not None:
                self.etcd.procs[i].wait()
                self.etcd.procs[i] = None

    def kill_host(self, k: int, kind: str = "host") -> Kill:
        """kill -9 every process of host k at once (launcher, ranks, etcd member)."""
        victims = self.on_host(k)
        with self._cv:
            before = self._committed_before(victims)
            at = time.time()
            for v in victims:
                self.members[v].killed_at = at
        self._kill_namespace(k)
        return Kill(kind, victims, at, before)

    def cut_host(self, k: int, then_kill_after: float = 0.5) -> Kill:
        """The host vanishes: its link goes down (nothing reaches anyone, no FIN, no RST),
        then its processes are killed; the link is brought back for the replacement."""
        victims = self.on_host(k)
        with self._cv:
            before = self._committed_before(victims)
        at = time.time()
        subprocess.run(["ip", "-n", self.hosts.names[k], "link", "set", "eth0", "down"],
                       check=True)  # fmt: skip
        with self._cv:
            for v in victims:
                self.members[v].killed_at = at
        time.sleep(then_kill_after)
        self._kill_namespace(k)
        subprocess.run(["ip", "-n", self.hosts.names[k], "link", "set", "eth0", "up"],
                       check=True)  # fmt: skip
        return Kill("cut", victims, at, before)

    def _committed_before(self, victims: list[int]) -> int:
        return max((s["step"] for m in self.members.values()
                    if m.killed_at is None and m.id not in victims
                    for s in m.steps if s["ok"]), default=0)  # fmt: skip

    def replace_host(self, k: int) -> None:
        """Host k comes back: its etcd member (from its data) and a launcher for the job."""
        for i, host in enumerate(self.etcd.on):
            if host == k and self.etcd.procs[i] is None:
                self.etcd.start_member(i, "existing")
        self.start_host(k)

    def etcd_host_of_leader(self) -> int | None:
        i = self.etcd.leader()
        return None if i is None else self.etcd.on[i]

    def step_times(self, since: float) -> list[float]:
        """Times of the committed steps of the leader (rank 0) after `since`."""
        with self._cv:
            return sorted(s["t"] for m in self.members.values() for s in m.steps
                          if s["ok"] and s["rank"] == 0 and s["t"] >= since)  # fmt: skip

    def finish_hosts(self, timeout: float) -> int | None:
        """Wait for the launchers still running; the status of the worst."""
        rc = 0
        deadline = time.monotonic() + timeout
        for proc in list(self.launchers.values()):
            try:
                one = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                one = -9
            rc = rc if one == 0 else one
        time.sleep(0.2)
        return rc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()


def host_losses(
    hosts,
    etcd: EtcdCluster,
    kills: int,
    seed: int,
    *,
    per_host: Sequence[int] = (1, 1, 1, 1),
    cuts: int = 0,
    member_losses: int = 0,
    log=None,
    stderr_to: str | None = None,
    then_quorum: bool = False,
) -> tuple[Outcome, dict]:
    """One job across the hosts; `member_losses` etcd members killed alone (the leader's
    among them) with the pause they cause measured, then `kills` hosts killed (kill -9 of
    every process) and `cuts` hosts cut off then killed, in a random order of hosts that
    includes host 0 (whose launcher was first) and the etcd leader's host; a replacement
    host after each. Then stop and judge."""
    rng = random.Random(seed)
    job = HostsJob(hosts, etcd, per_host)
    done: list[Kill] = []
    problems: list[str] = []
    extra: dict = {"member_pauses": [], "step_s": None, "events": []}
    total = sum(per_host)
    stop = 0
    try:
        if not job.wait(lambda j: j.stepping(total), 120):
            problems.append("the job did not start on every host")
            raise _Stop
        for n in range(member_losses):
            # an etcd member alone (no rank lost): the leader's the first time
            i = etcd.leader() if n == 0 else rng.choice(etcd.running())
            if i is None:
                problems.append("no etcd leader")
                raise _Stop
            time.sleep(1.0)
            t0 = time.time()
            etcd.kill(i)
            time.sleep(5.0)
            times = job.step_times(t0 - 2.0)
            before = [b - a for a, b in zip(times, times[1:], strict=False) if b < t0]
            gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > t0]
            pause = max(gaps, default=float("inf"))
            extra["member_pauses"].append(round(pause, 3))
            extra["step_s"] = sorted(before)[len(before) // 2] if before else None
            if log:
                log(f"  etcd member {i} killed (leader: {n == 0}): longest gap between "
                    f"committed steps {pause:.3f} s")  # fmt: skip
            etcd.start_member(i, "existing")
            etcd.wait_healthy(60)
        plan = ["kill"] * kills + ["cut"] * cuts
        rng.shuffle(plan)
        must = [0]  # host 0, whose launcher is node 0; the etcd leader's host when asked
        for count, kind in enumerate(plan):
            if not job.wait(lambda j: j.stepping(total), 120):
                problems.append(f"the job did not get back to {total} members ({count})")
                break
            etcd.wait_healthy(60)
            time.sleep(rng.uniform(0.3, 1.5))
            leader_host = job.etcd_host_of_leader()
            if count == 1 and leader_host is not None:
                must.append(leader_host)
            k = must.pop(0) if must else rng.randrange(len(per_host))
            why = f"host {k}" + (" (the etcd leader's)" if k == leader_host else "")
            kill = job.cut_host(k) if kind == "cut" else job.kill_host(k)
            kill.kind = kind
            done.append(kill)
            if log:
                log(f"  {count + 1}/{len(plan)}: {kind} {why}: members {kill.victims}")
            extra["events"].append({"kind": kind, "host": k, "leader_host": leader_host,
                                    "victims": kill.victims, "at": kill.at})  # fmt: skip
            left = total - len(kill.victims)
            if not job.wait(lambda j, n=left: j.stepping(n), 60):
                problems.append(f"the survivors did not train again after {kind} of host {k}")
                break
            job.replace_host(k)
        job.wait(lambda j: j.stepping(total), 120)
        if then_quorum:
            # the same job ends by losing the etcd quorum: judged apart (extra["quorum"])
            stop = job.max_step()
            with job._cv:
                digests = {m.id: m.steps[-1]["step"] for m in job.live() if m.steps}
            extra["quorum"] = lose_the_quorum(job, total, log)
            extra["steps_at_quorum_loss"] = digests
            for i in range(etcd.n):  # the cluster back, for whoever uses it next
                if etcd.procs[i] is None:
                    etcd.start_member(i, "existing")
            etcd.wait_healthy(60)
            rc = 0
        else:
            stop = job.max_step() + 40
            job.stop_at(stop)
            rc = job.finish_hosts(120)
    except _Stop:
        rc = None
    finally:
        job.close()
        if stderr_to:  # every line the launchers and members wrote, for a post-mortem
            with open(stderr_to, "w") as f:
                f.write("".join(job.stderr))
    out = job.judge(rc, done, stop) if not then_quorum else _judge_kills(job, done)
    out.problems[:0] = problems
    out.problems += job.leftovers()
    return out, extra


def quorum_loss(hosts, etcd: EtcdCluster, *, per_host: Sequence[int] = (1, 1, 1, 1),
                log=None) -> dict:  # fmt: skip
    """Two of the three etcd members killed (no rank lost): every member must raise an
    error naming the lost quorum, within a bound, and every launcher exit non-zero."""
    job = HostsJob(hosts, etcd, per_host)
    total = sum(per_host)
    out: dict = {"problems": []}
    try:
        if not job.wait(lambda j: j.stepping(total), 120):
            out["problems"].append("the job did not start")
            return out
        out = lose_the_quorum(job, total, log)
    finally:
        job.close()
        for i in range(etcd.n):
            if etcd.procs[i] is None:
                etcd.start_member(i, "existing")
        etcd.wait_healthy(60)
        out["problems"] += job.leftovers()
    return out


def lose_the_quorum(job: HostsJob, total: int, log=None) -> dict:
    """On a job whose `total` members train: kill two of its three etcd members and judge
    that every member named the lost quorum and every launcher exited non-zero."""
    etcd = job.etcd
    out: dict = {"problems": []}
    victims = [i for i in etcd.running() if i != etcd.leader()][:1] + [etcd.leader()]
    t0 = time.monotonic()
    for i in victims:
        etcd.kill(i)
    ended = job.wait(lambda j: all(p.poll() is not None for p in j.launchers.values()), 90)
    out["seconds"] = round(time.monotonic() - t0, 2)
    rcs = [p.poll() for p in job.launchers.values()]
    err = "".join(job.stderr)
    named = [ln for ln in job.stderr if "[rank" in ln and "quorum" in ln]
    out.update(rcs=rcs, named_lines=len(named))
    if not ended:
        out["problems"].append("a launcher was still running 90 s after the quorum loss")
    if any(rc == 0 for rc in rcs):
        out["problems"].append(f"launcher exit statuses {rcs}")
    raised = {ln.split("]:")[0] for ln in named}
    if len(raised) < total:
        out["problems"].append(f"only {sorted(raised)} named the lost quorum: {err[-3000:]}")
    if log:
        log(f"  quorum lost: every launcher exited ({rcs}) {out['seconds']} s later; "
            f"{len(raised)} ranks named it")  # fmt: skip
    return out


def _judge_kills(job: HostsJob, kills: list[Kill]) -> Outcome:
    """The recovery of each failure, for a job that ended by losing its quorum (so no
    member finished: the final digests are not asked for)."""
    out = job.judge(0, kills, 0)
    out.problems = [p for p in out.problems
                    if not p.startswith(("members without DONE", "final steps"))]  # fmt: skip
    return out


class _Stop(Exception):
    pass
