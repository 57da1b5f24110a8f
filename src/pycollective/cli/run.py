"""`pycollective run`: start the ranks of a job on this node and watch over them.

Each rank gets torchrun's environment contract:

    RANK, WORLD_SIZE (= nprocs * nnodes), LOCAL_RANK, LOCAL_WORLD_SIZE,
    GROUP_RANK and NODE_RANK (= node rank), GROUP_WORLD_SIZE (= nnodes), ROLE_RANK,
    ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS=1 (unless set; as torchrun),

plus PYCOLLECTIVE_SECRET (the job's shared secret), PYCOLLECTIVE_STORE_HOSTED=1 (the
launcher of node 0 hosts the TCP store at MASTER_ADDR:MASTER_PORT, so ranks must connect
to it rather than start one) and PYTHONUNBUFFERED=1 (so output streams line by line).

Each rank runs in its own process group, with stdin from /dev/null, and its stdout and
stderr are forwarded line by line with a "[rank N]: " prefix. SIGINT/SIGTERM sent to the
launcher are forwarded to every rank. When a rank fails (non-zero status or a signal), the
others first get a notice window (`--notice`, 2 s) with no signal: ranks in a collective
learn of the loss through their connections and raise, print and exit on their own within
a fraction of a second. Then the ranks still running get SIGUSR1 (when they handle it: the
flight recorder dumps, so `diagnose` sees both sides), SIGTERM, and `--grace` seconds
before their process groups are SIGKILLed. The launcher then names the rank that failed
first, with the last line of its stderr (the traceback itself was forwarded once, as it
was written). `--max-restarts K` starts every rank again after a failure, up to K times,
as torchrun does; `--elastic MIN:MAX` lets the job go on without a lost rank
(pycollective.elastic) and starts replacements. Nothing the ranks started outlives the
launcher: every process group is killed at the end, and on Linux a rank also dies if the
launcher itself is killed.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import BinaryIO

from .. import _auth, _config
from .._errors import CollectiveError, UsageError
from ..observe import diagnose
from ..observe import timeline as _timeline
from ..store import TCPStoreServer
from ..store._etcd_client import parse_endpoints
from ._args import seconds

logger = logging.getLogger("pycollective.launch")

HELP = "start N ranks of a program with the torchrun environment"
_STDERR_TAIL = 20  # lines of the failing rank's stderr kept for the report
_POLL = 0.02
_DUMP_WAIT = 0.5  # seconds between SIGUSR1 (flight recorders dump) and SIGTERM


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int) -> str:
    """'exited with status 3' / 'was killed by SIGKILL', from a Popen return code."""
    if returncode < 0:
        return f"was killed by {_signal_name(-returncode)}"
    return f"exited with status {returncode}"


def _exit_code(returncode: int) -> int:
    # Shell convention: a death by signal N reads as 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that makes the child die with the launcher (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Output:
    """Writes whole lines to one of the launcher's streams, prefixing them, one at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    def write(self, prefix: bytes, line: bytes) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(prefix + line)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                # Our reader went away (e.g. `| head`): keep draining the ranks' pipes
                # so they never block on a full pipe, but stop writing.
                self._broken = True


def _pump(
    pipe: BinaryIO, out: _Output, prefix: bytes, tail: collections.deque[bytes] | None
) -> None:
    with pipe:
        # readline with a limit, so a rank printing one endless line cannot exhaust memory.
        for line in iter(lambda: pipe.readline(65536), b""):
            out.write(prefix, line)
            if tail is not None:
                tail.append(line)


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes], local_rank: int = 0) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.proc = proc
        self.returncode: int | None = None
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=_STDERR_TAIL)
        self.readers: list[threading.Thread] = []


def launch(
    nprocs: int,
    cmd: Sequence[str],
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int = 0,
    prefix: bool = True,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    servers: int = 0,
    module: bool = False,
    no_python: bool = False,
    notice: float = 2.0,
    max_restarts: int = 0,
    elastic: tuple[int, int] | None = None,
    tls: bool = False,
    etcd: tuple[str, str] | None = None,
    etcd_env: Mapping[str, str] | None = None,
) -> int:
    """Run `cmd` as `nprocs` ranks on this node (node `node_rank` of `nnodes`).

    With `etcd` (endpoints, job name) the ranks meet in that etcd cluster
    (PYCOLLECTIVE_STORE=etcd://endpoints/job, and `etcd_env`: its TLS/auth settings);
    no launcher hosts a store, so none is special, and `elastic` may span nodes (each
    launcher then starts replacements for its own ranks; the elastic manager enforces
    MIN and MAX over the whole job).

    When a rank fails, the others get `notice` seconds to exit on their own, then SIGUSR1
    (flight recorders dump), SIGTERM and `grace` seconds before SIGKILL. With
    `max_restarts` K, a failed job is started again, every rank of it, up to K times
    (TORCHELASTIC_RESTART_COUNT and PYCOLLECTIVE_RESTART_COUNT say which attempt this is;
    each attempt meets in a store round of its own). With `elastic` (MIN, MAX), a failure
    that leaves at least MIN ranks running stops nobody: the ranks (pycollective.elastic)
    go on without it, and up to `max_restarts` replacements are started.

    With `servers` > 0 (single node), `servers` more ranks run the same command after the
    workers, as parameter servers: every rank gets PYCOLLECTIVE_NUM_SERVERS and
    PYCOLLECTIVE_ROLE (worker or server); see pycollective.ps.

    Returns 0 if every rank exited 0; otherwise the first failing rank's exit status
    (128 + N if it died of signal N), or 128 + N if the launcher itself got signal N.
    Every connection of the job proves the job's key: on one node a key made for this job
    (unless PYCOLLECTIVE_SECRET or PYCOLLECTIVE_SECRET_FILE names one), on several nodes
    the user's (the per-user key file of a shared home, or one of those variables on every
    node). With `tls`, the job's connections also run TLS 1.3 (PYCOLLECTIVE_TLS=1).
    `env` replaces os.environ as the base of the ranks' environment; `stdout`/`stderr`
    are binary streams (default: the launcher's own). SIGINT/SIGTERM are forwarded only
    when called from the main thread (where Python lets us catch them).
    """
    if nprocs < 1:
        raise UsageError(f"nprocs must be >= 1, got {nprocs}")
    if servers < 0 or (servers and nnodes > 1):
        raise UsageError(f"--servers must be >= 0 and needs a single node, got {servers}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"node rank {node_rank} is not in 0..{nnodes - 1}")
    if not 0 <= grace < math.inf:  # NaN fails this too
        raise UsageError(f"grace must be a finite number of seconds >= 0, got {grace}")
    if not 0 <= notice < math.inf:
        raise UsageError(f"notice must be a finite number of seconds >= 0, got {notice}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    if elastic is not None:
        lo, hi = elastic
        if etcd is not None:
            if not 1 <= lo <= hi or nprocs > hi or servers:
                raise UsageError(
                    f"--elastic {lo}:{hi} needs 1 <= MIN <= MAX and at most MAX ranks here "
                    f"(-n {nprocs}), without --servers"
                )
        elif not 1 <= lo <= hi or not lo <= nprocs <= hi or nnodes > 1 or servers:
            raise UsageError(
                f"--elastic {lo}:{hi} needs 1 <= MIN <= N <= MAX (N = {nprocs} ranks) on a "
                "single node without --servers (across nodes: --rdzv-backend etcd)"
            )
    if not 0 <= master_port < 65536:
        raise UsageError(f"master port must be in 0..65535, got {master_port}")
    if nnodes > 1 and etcd is None and (master_addr is None or master_port == 0):
        raise UsageError("a multi-node job needs --master-addr and a non-zero --master-port")
    command = command_line(cmd, module=module, no_python=no_python)
    base_env = dict(os.environ if env is None else env)
    out = _Output(stdout if stdout is not None else sys.stdout.buffer)
    err = _Output(stderr if stderr is not None else sys.stderr.buffer)
    # A single-node job listens on loopback only, unless told an address to be reached at.
    bind = "" if nnodes > 1 else (master_addr or "127.0.0.1")
    master_addr = master_addr or "127.0.0.1"

    # What the ranks' environment gets besides torchrun's contract.
    job_vars: dict[str, str] = {}
    if tls:
        job_vars["PYCOLLECTIVE_TLS"] = "1"
    if (
        nnodes == 1
        and not _config.is_set("PYCOLLECTIVE_SECRET", base_env)
        and not _config.is_set("PYCOLLECTIVE_SECRET_FILE", base_env)
        and _config.get("PYCOLLECTIVE_INSECURE", base_env) != "1"
    ):
        # One node: a key of this job's own, which no other job of this user shares. Nodes
        # cannot agree on an invented one: there the ranks (and this launcher) read the
        # user's (the per-user key file of a shared home, or what the user set).
        job_vars["PYCOLLECTIVE_SECRET"] = secrets.token_hex(32)
    creds = _auth.credentials(None, {**base_env, **job_vars})

    server: TCPStoreServer | None = None
    if etcd is not None:
        # The ranks meet in etcd; MASTER_ADDR only tells them which interface to listen
        # on (the one towards the first endpoint).
        endpoints, job = etcd
        parsed = parse_endpoints(endpoints)
        master_addr, master_port = parsed[0].host, parsed[0].port
        etcd_tls = any(e.scheme == "https" for e in parsed) or bool(
            (etcd_env or {}).get("PYCOLLECTIVE_ETCD_CACERT"))  # fmt: skip
        hosts = ",".join(str(e) for e in parsed)
        job_vars["PYCOLLECTIVE_STORE"] = f"{'etcds' if etcd_tls else 'etcd'}://{hosts}/{job}"
        job_vars.update(etcd_env or {})
    elif node_rank == 0:
        server = TCPStoreServer(bind, master_port, creds).start()
        master_port = server.port
    # Flight-recorder dumps of this job go to a directory of its own (unless the user
    # chose one), so that a failure can be diagnosed from exactly this job's files.
    flight_dir = None
    if not base_env.get("PYCOLLECTIVE_FLIGHT_DIR"):
        flight_dir = tempfile.mkdtemp(prefix="pycollective-flight-")
        job_vars["PYCOLLECTIVE_FLIGHT_DIR"] = flight_dir
    omp, note = rank_environment(base_env, nprocs + servers)
    job_vars.update(omp)
    if note:
        err.write(b"", note.encode())
    job_vars.setdefault("PYCOLLECTIVE_JOB_ID", f"{os.getpid()}-{secrets.token_hex(4)}")
    try:
        status = _run(
            nprocs, command, nnodes, node_rank, master_addr, master_port,
            prefix, grace, base_env, job_vars, out, err, servers,
            notice, max_restarts, elastic, etcd is not None,
        )  # fmt: skip
    finally:
        if server is not None:
            server.close()
    _report_flight(
        flight_dir or base_env["PYCOLLECTIVE_FLIGHT_DIR"],
        status,
        err,
        remove_if_empty=flight_dir is not None,
    )
    if base_env.get("PYCOLLECTIVE_TIMELINE", "").strip() and nnodes == 1:
        _merge_timeline(
            base_env["PYCOLLECTIVE_TIMELINE"].strip(), job_vars["PYCOLLECTIVE_JOB_ID"], err
        )
    return status


def _merge_timeline(template: str, job: str, err: _Output) -> None:
    """PYCOLLECTIVE_TIMELINE=FILE: merge this job's per-rank files into FILE."""
    try:
        out = _timeline.write_merged(template, job=job)
    except (OSError, ValueError, KeyError) as exc:  # a damaged file must not fail the job
        err.write(b"", f"pycollective run: could not merge the timeline: {exc}".encode())
        return
    if out is not None:
        err.write(b"", f"pycollective run: timeline in {out} (Chrome trace format)".encode())


def _report_flight(directory: str, status: int, err: _Output, remove_if_empty: bool) -> None:
    """After a failed job, say what the flight-recorder dumps show; leave no empty dir."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return
    if not names:
        if remove_if_empty:
            shutil.rmtree(directory, ignore_errors=True)
        return
    if status == 0:  # e.g. an elastic job that went on after failures
        err.write(b"", f"pycollective run: flight recorder dumps of the failures the job "
                       f"went on from in {directory}".encode())  # fmt: skip
        return
    lines = [
        f"pycollective run: flight recorder dumps in {directory} "
        f"(pycollective diagnose {directory}):"
    ]
    try:
        for findings in diagnose.analyze(diagnose.load([directory])).values():
            lines.extend(f"    {f.text}" for f in findings)
    except (KeyError, TypeError, ValueError) as exc:  # a damaged dump must not hide the rest
        lines.append(f"    (could not analyze the dumps: {exc})")
    err.write(b"", "\n".join(lines).encode())


def _caught(pid: int, sig: int) -> bool:
    """True if process `pid` has a handler for `sig` (Linux: SigCgt in /proc/PID/status).
    A rank without one would die of SIGUSR1's default action instead of dumping."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


class _Job:
    """The ranks of one attempt and how they are stopped.

    After the first failure the others get `notice` seconds with no signal at all (a rank
    in a collective learns of the loss through its connections and raises, prints and
    exits on its own; Python's default SIGTERM would end it before its except and finally
    blocks run); then SIGUSR1 to those still running that handle it (pycollective's flight
    recorder dumps), then SIGTERM, `grace` seconds, SIGKILL. In elastic mode a rank killed
    by a signal, when at least `elastic_min` ranks still run, stops nobody: the job goes on
    with them, and a replacement is started while `replacements` allows (a rank that
    exits with an error status still ends the job).
    """

    def __init__(
        self,
        spawn: Callable[[int, int], _Rank],
        ranks: list[_Rank],
        notice: float,
        grace: float,
        received: list[int],
        err: _Output,
        elastic_min: int | None = None,
        replacements: int = 0,
        next_id: int = 0,
    ) -> None:
        self.spawn = spawn
        self.ranks = ranks
        self.notice = notice
        self.grace = grace
        self.received = received
        self.err = err
        self.elastic_min = elastic_min
        self.replacements = replacements
        self.next_id = next_id
        self.first: _Rank | None = None  # the first failure that stopped the job
        self.tolerated: list[_Rank] = []  # elastic: failures the job went on without
        self.launcher_signal: int | None = None
        self.replaced = 0

    def say(self, text: str) -> None:
        self.err.write(b"", f"pycollective run: {text}".encode())

    def supervise(self) -> int:
        phase = "run"  # run -> notice -> dump -> term (-> SIGKILL at `until`)
        until = 0.0
        handled = 0
        while True:
            running, failed_now = [], []
            for r in list(self.ranks):
                if r.returncode is None:
                    r.returncode = r.proc.poll()
                    if r.returncode is None:
                        running.append(r)
                    elif r.returncode != 0:
                        failed_now.append(r)
            now = time.monotonic()
            if failed_now and phase == "run":
                # Several found dead in one look: a rank killed by a signal is likelier the
                # cause than one that exited with an error (often the others' reaction to it).
                failed_now.sort(key=lambda x: ((x.returncode or 0) >= 0, x.rank))
                # Elastic: a rank killed by a signal is a lost worker the others go on
                # without; one that exits with an error (an exception in the script, or
                # the elastic manager saying the job cannot go on) ends the job.
                lost = all((x.returncode or 0) < 0 for x in failed_now)
                if self.elastic_min is not None and lost and len(running) >= self.elastic_min:
                    self._go_on(failed_now, running)
                    continue
                self.first = failed_now[0]
                if running:
                    self.say(
                        f"rank {self.first.rank} {describe_exit(self.first.returncode or 0)}; "
                        f"the other ranks have {self.notice:g} s to exit on their own, then "
                        f"SIGTERM and {self.grace:g} s more"
                    )
                phase, until = "notice", now + self.notice
            while handled < len(self.received):
                sig = self.received[handled]
                handled += 1
                if self.launcher_signal is None:
                    self.launcher_signal = sig
                    for r in running:
                        _killpg(r.proc.pid, sig)
                    phase, until = "term", now + self.grace
                else:  # a second signal: the user does not want to wait
                    until = now
            if not running:
                return self._report()
            if phase != "run" and now >= until:
                if phase == "notice":
                    dumping = [r for r in running if _caught(r.proc.pid, signal.SIGUSR1)]
                    for r in dumping:
                        _killpg(r.proc.pid, signal.SIGUSR1)
                    phase, until = "dump", now + (_DUMP_WAIT if dumping else 0.0)
                elif phase == "dump":
                    for r in running:
                        _killpg(r.proc.pid, signal.SIGTERM)
                    phase, until = "term", now + self.grace
                elif phase == "term":
                    for r in running:
                        _killpg(r.proc.pid, signal.SIGKILL)
                    phase, until = "killed", float("inf")  # SIGKILL cannot be ignored: reap
            time.sleep(_POLL)

    def _go_on(self, failed: list[_Rank], running: list[_Rank]) -> None:
        for r in failed:
            self.tolerated.append(r)
            self.ranks.remove(r)
            _killpg(r.proc.pid, signal.SIGKILL)  # whatever it started goes with it
            n = len(running)
            on = f"{n} rank goes on" if n == 1 else f"{n} ranks go on"
            text = f"rank {r.rank} {describe_exit(r.returncode or 0)}; {on}"
            if self.replaced < self.replacements:
                new = self.spawn(self.next_id, r.local_rank)
                self.next_id += 1
                self.replaced += 1
                self.ranks.append(new)
                running.append(new)
                text += f" and rank {new.rank} starts to replace it"
            self.say(text)

    def _report(self) -> int:
        for r in self.ranks + self.tolerated:
            _killpg(r.proc.pid, signal.SIGKILL)  # what the ranks left running would hold the pipes
        until = time.monotonic() + 2.0
        for r in self.ranks + self.tolerated:
            for t in r.readers:
                t.join(timeout=max(0.0, until - time.monotonic()))  # so the stderr tail is complete
        if self.launcher_signal is not None:
            self.say(f"stopped by {_signal_name(self.launcher_signal)}")
            return 128 + self.launcher_signal
        if self.tolerated:
            lost = ", ".join(
                f"rank {r.rank} ({describe_exit(r.returncode or 0)})" for r in self.tolerated
            )
            self.say(f"elastic: the job went on without {lost}")
        first = self.first
        if first is None:
            return 0
        assert first.returncode is not None
        # The rank's traceback was forwarded as it was written: name it once, with its
        # last line (the exception), rather than print it a second time.
        line = f"rank {first.rank} {describe_exit(first.returncode)} (the first rank to fail)"
        last = _last_line(first.stderr_tail)
        lines = [f"pycollective run: {line}" + (f": {last}" if last else "")]
        others = [
            f"rank {r.rank} {describe_exit(r.returncode)}"
            for r in self.ranks
            if r is not first and r.returncode not in (None, 0)
        ]
        if others:
            lines.append("pycollective run: then " + ", ".join(others))
        self.err.write(b"", "\n".join(lines).encode())
        return _exit_code(first.returncode)


def _last_line(tail: collections.deque[bytes]) -> str:
    for raw in reversed(tail):
        text = raw.decode("utf-8", "replace").strip()
        if text:
            return text
    return ""


def _run(
    nprocs: int,
    command: list[str],
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    prefix: bool,
    grace: float,
    base_env: dict[str, str],
    job_vars: dict[str, str],
    out: _Output,
    err: _Output,
    servers: int = 0,
    notice: float = 2.0,
    max_restarts: int = 0,
    elastic: tuple[int, int] | None = None,
    etcd: bool = False,
) -> int:
    received: list[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    previous: dict[int, object] = {}
    if in_main:  # signal handlers can only be installed from the main thread
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))

    preexec = _parent_death_signal()
    world_size = nprocs * nnodes + servers
    started: list[_Rank] = []
    restart = 0

    def spawn(rank: int, local_rank: int) -> _Rank:
        child_env = dict(base_env)
        child_env.update(job_vars)
        if servers:
            child_env.update(
                PYCOLLECTIVE_NUM_SERVERS=str(servers),
                PYCOLLECTIVE_ROLE="server" if local_rank >= nprocs else "worker",
            )
        if elastic is not None:
            child_env["PYCOLLECTIVE_ELASTIC"] = f"{elastic[0]}:{elastic[1]}"
        if not etcd:
            child_env["PYCOLLECTIVE_STORE_HOSTED"] = "1"  # node 0's launcher serves it
        child_env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(nprocs + servers),
            GROUP_RANK=str(node_rank),
            GROUP_WORLD_SIZE=str(nnodes),
            NODE_RANK=str(node_rank),
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            # torchelastic's names: the attempt, which also names this round's store keys
            TORCHELASTIC_RESTART_COUNT=str(restart),
            TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
            PYCOLLECTIVE_RESTART_COUNT=str(restart),
            PYTHONUNBUFFERED="1",
        )
        proc = subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: a killpg takes grandchildren
            preexec_fn=preexec,
        )
        r = _Rank(rank, proc, local_rank)
        started.append(r)
        tag = f"[rank {rank}]: ".encode() if prefix else b""
        assert proc.stdout is not None and proc.stderr is not None
        for pipe, dest, tail in ((proc.stdout, out, None), (proc.stderr, err, r.stderr_tail)):
            t = threading.Thread(target=_pump, args=(pipe, dest, tag, tail), daemon=True)
            t.start()
            r.readers.append(t)
        return r

    try:
        while True:
            ranks: list[_Rank] = []
            try:
                for local_rank in range(nprocs + servers):
                    ranks.append(spawn(node_rank * nprocs + local_rank, local_rank))
            except OSError as exc:
                err.write(b"", f"pycollective run: cannot start {command[0]!r}: {exc}".encode())
                return 127 if isinstance(exc, FileNotFoundError) else 126
            job = _Job(
                spawn, ranks, notice, grace, received, err,
                # across nodes (etcd) this launcher sees only its own ranks: the manager
                # judges MIN over the whole job, so any rank killed by a signal is a loss
                elastic_min=(0 if etcd else elastic[0]) if elastic else None,
                replacements=max_restarts if elastic else 0,
                next_id=world_size,
            )  # fmt: skip
            status = job.supervise()
            _reap(started)
            if status == 0 or job.launcher_signal is not None or elastic is not None:
                return status
            if restart >= max_restarts:
                if max_restarts:
                    job.say(f"no restarts left (--max-restarts {max_restarts})")
                return status
            restart += 1
            job.say(f"restarting every rank (restart {restart} of {max_restarts})")
    finally:
        _reap(started)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def _reap(ranks: list[_Rank]) -> None:
    """Kill what is left of `ranks` and wait for their output. Also reached when the
    launcher is interrupted by an exception: never leave a rank, or anything it started,
    behind."""
    for r in ranks:
        _killpg(r.proc.pid, signal.SIGKILL)
        if r.proc.poll() is None:
            r.proc.wait()
    until = time.monotonic() + 2.0
    for r in ranks:
        for t in r.readers:
            t.join(timeout=max(0.0, until - time.monotonic()))
    ranks.clear()


def _min_max(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX (two integers), got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return pair


# torchrun's default port for --rdzv-endpoint HOST without one.
_RDZV_DEFAULT_PORT = 29400
_OMP_NOTE = (
    "pycollective run: setting OMP_NUM_THREADS=1 for each rank (as torchrun does) so that "
    "{n} ranks do not overload the cores; export OMP_NUM_THREADS to choose another value"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's spellings (dashes or underscores), mpirun's -np, and our own options."""
    parser.add_argument(
        "-n", "-np", "--np", "--nproc-per-node", "--nproc_per_node", dest="nprocs",
        default="1", metavar="N",
        help="ranks to start on this node: a number, or 'cpu'/'auto' for one per core "
        "(default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--nnodes", default="1", metavar="K",
        help="nodes in the job (default 1; torchrun's K:K is accepted)",
    )  # fmt: skip
    parser.add_argument(
        "--node-rank", "--node_rank", type=int, default=None, metavar="I",
        help="this node's rank, 0..K-1 (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--master-addr", "--master_addr", default=None, metavar="HOST",
        help="address of node 0, where the store runs (default 127.0.0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--master-port", "--master_port", type=int, default=None, metavar="PORT",
        help="store port on node 0 (default: a free port; required with --nnodes > 1)",
    )  # fmt: skip
    parser.add_argument(
        "--standalone", action="store_true",
        help="a single-node job on a free local port (torchrun's flag; also the default)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST[:PORT]",
        help=f"torchrun's rendezvous endpoint: the same as --master-addr HOST --master-port "
        f"PORT (port {_RDZV_DEFAULT_PORT} if omitted); with --rdzv-backend etcd, the etcd "
        "members HOST:PORT,HOST:PORT,... (tried in turn; port 2379 if omitted)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-backend", "--rdzv_backend", default=None, metavar="NAME",
        help="c10d or static (both mean the store node 0's launcher hosts), or etcd: the "
        "ranks meet in the etcd cluster at --rdzv-endpoint, so no host is special",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-id", "--rdzv_id", default=None, metavar="ID",
        help="with --rdzv-backend etcd, the job's name there (the same on every node; "
        "default 'default'); otherwise accepted for torchrun scripts",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-conf", "--rdzv_conf", default=None, metavar="K=V,...",
        help="with --rdzv-backend etcd, etcd's own security, passed through: cacert=, "
        "cert=, key= (TLS), user=, password_file= (etcd auth); otherwise ignored",
    )  # fmt: skip
    parser.add_argument(
        "-m", "--module", action="store_true",
        help="run the program as a Python module, as `python -m` does",
    )  # fmt: skip
    parser.add_argument(
        "--no-python", "--no_python", dest="no_python", action="store_true",
        help="run the program directly, without this Python (e.g. a shell script)",
    )  # fmt: skip
    parser.add_argument(
        "--servers", type=int, default=0, metavar="S",
        help="also start S parameter servers after the N workers (see pycollective.ps)",
    )  # fmt: skip
    parser.add_argument(
        "--notice", type=seconds, default=2.0, metavar="SECONDS",
        help="after a rank fails, seconds the others get to exit on their own before any "
        "signal (default 2)",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=seconds, default=5.0,
        help="seconds between SIGTERM and SIGKILL when the ranks are stopped (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--max-restarts", "--max_restarts", type=int, default=0, metavar="K",
        help="start every rank again after a failure, up to K times (torchrun's meaning); "
        "with --elastic, the number of replacement ranks (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--elastic", type=_min_max, default=None, metavar="MIN:MAX",
        help="in-job recovery (pycollective.elastic): a lost rank does not stop the job "
        "while MIN ranks run; members may be MAX at most",
    )  # fmt: skip
    parser.add_argument(
        "--tls", action="store_true",
        help="encrypt and integrity-check every connection of the job with TLS 1.3 "
        "(PYCOLLECTIVE_TLS=1; certificates from a per-job CA derived from the job's key, or "
        "PYCOLLECTIVE_TLS_CERT/KEY/CA)",
    )  # fmt: skip
    parser.add_argument(
        "--no-prefix", dest="prefix", action="store_false",
        help='do not prefix output lines with "[rank N]: "',
    )  # fmt: skip
    # torchrun's other options: named, so that their message says what to do instead of
    # argparse's "unrecognized arguments" (resolve_options).
    for names in _TORCHRUN_OTHERS:
        parser.add_argument(
            *names, dest="torchrun_others", action="append", type=lambda v, n=names[0]: (n, v),
            default=[], help=argparse.SUPPRESS,
        )  # fmt: skip
    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="program and arguments (a .py file runs with this Python)",
    )  # fmt: skip


def _count(text: str, what: str) -> int:
    if text in ("cpu", "auto"):
        return os.cpu_count() or 1
    if text == "gpu":
        raise UsageError(f"{what} gpu: pycollective runs on CPUs; give a number or 'cpu'")
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{what} must be a number or 'cpu', got {text!r}") from None


def _nnodes(text: str) -> int:
    lo, sep, hi = text.partition(":")
    if sep and lo != hi:
        raise UsageError(
            f"--nnodes {text}: a range of node counts (torchrun's elastic MIN:MAX) is not "
            "supported; give one number (a varying number of ranks on one node: --elastic "
            "MIN:MAX)"
        )
    try:
        return int(lo)
    except ValueError:
        raise UsageError(f"--nnodes must be a number, got {text!r}") from None


# torchrun options with no counterpart here: the ones that only tune torchrun's own agent
# are ignored with a note; the ones a job's outcome depends on are refused, saying instead.
_TORCHRUN_IGNORED = {
    "--monitor-interval": "the launcher watches its ranks every 20 ms",
    "--start-method": "every rank is a process of its own (a fresh interpreter)",
    "--role": "every rank has the role 'default'",
}
_TORCHRUN_REFUSED = {
    "--log-dir": "every line of every rank comes to the launcher's stdout/stderr with a "
    "[rank N] prefix: redirect those (pycollective run ... > job.log 2>&1)",
    "--redirects": "output is always forwarded line by line with a [rank N] prefix "
    "(--no-prefix drops it)",
    "--tee": "output is always forwarded line by line with a [rank N] prefix "
    "(--no-prefix drops it)",
    "--local-ranks-filter": "every rank's output is shown; filter it with grep '^\\[rank 0\\]'",
    "--run-path": "ranks are processes of their own: run the script itself",
    "--local-addr": "set PYCOLLECTIVE_SOCKET_IFNAME to choose the interface ranks listen on",
}
_TORCHRUN_OTHERS = [
    (name, name.replace("-", "_").replace("__", "--"), *(("-r",) if name == "--redirects"
                                                          else ("-t",) if name == "--tee"
                                                          else ()))
    for name in (*_TORCHRUN_IGNORED, *_TORCHRUN_REFUSED)
]  # fmt: skip


def _torchrun_others(given: list[tuple[str, str]]) -> list[str]:
    """Notes for torchrun's options that do not apply here; UsageError for those a job
    depends on."""
    notes = []
    for name, _value in given:
        if name in _TORCHRUN_REFUSED:
            raise UsageError(f"{name} (torchrun's) is not supported: {_TORCHRUN_REFUSED[name]}")
        notes.append(f"pycollective run: {name} (torchrun's) is ignored: {_TORCHRUN_IGNORED[name]}")
    return notes


def resolve_options(args: argparse.Namespace) -> dict:
    """The parsed command line as launch()'s keyword arguments (raises UsageError)."""
    for note in _torchrun_others(getattr(args, "torchrun_others", [])):
        print(note, file=sys.stderr)
    nprocs = _count(str(args.nprocs), "-n/--nproc-per-node")
    nnodes = _nnodes(str(args.nnodes))
    master_addr, master_port = args.master_addr, args.master_port
    backend = (args.rdzv_backend or "").lower()
    if backend in ("etcd", "etcd-v2"):
        return _etcd_options(args, nprocs, nnodes)
    if backend not in ("", "c10d", "static"):
        raise UsageError(
            f"--rdzv-backend {args.rdzv_backend}: c10d, static (both use the store that node "
            "0's launcher hosts) and etcd are supported"
        )
    if args.rdzv_conf:
        print("pycollective run: --rdzv-conf is ignored: the store's timeouts follow "
              "PYCOLLECTIVE_TIMEOUT", file=sys.stderr)  # fmt: skip
    if args.standalone:
        if nnodes != 1:
            raise UsageError(f"--standalone is a single-node job, but --nnodes is {nnodes}")
        if args.rdzv_endpoint or master_addr or master_port:
            raise UsageError(
                "--standalone picks a free local port itself: drop --rdzv-endpoint, "
                "--master-addr and --master-port"
            )
    if args.rdzv_endpoint:
        host, sep, port = args.rdzv_endpoint.rpartition(":")
        if not sep or "]" in port:  # no port, or a bare IPv6 address
            host, port = args.rdzv_endpoint, str(_RDZV_DEFAULT_PORT)
        host = host.strip("[]")
        try:
            rport = int(port)
        except ValueError:
            raise UsageError(f"--rdzv-endpoint {args.rdzv_endpoint}: bad port {port!r}") from None
        if (master_addr not in (None, host)) or (master_port not in (None, rport)):
            raise UsageError(
                "--rdzv-endpoint and --master-addr/--master-port disagree: give one of them"
            )
        master_addr, master_port = host, rport
        if nnodes > 1 and args.node_rank is None:
            raise UsageError(
                "torchrun's c10d rendezvous numbers the nodes as they arrive; pycollective "
                "run needs each node's --node-rank (0 on the host of --rdzv-endpoint)"
            )
    if nnodes == 1 and master_addr in ("localhost", "127.0.0.1") and master_port is None:
        master_addr = None
    command_line(args.command, module=args.module, no_python=args.no_python)  # checks only
    return dict(
        nprocs=nprocs,
        cmd=args.command,
        module=args.module,
        no_python=args.no_python,
        nnodes=nnodes,
        node_rank=0 if args.node_rank is None else args.node_rank,
        master_addr=master_addr,
        master_port=master_port or 0,
        prefix=args.prefix,
        grace=args.grace,
        servers=args.servers,
        notice=args.notice,
        max_restarts=args.max_restarts,
        elastic=args.elastic,
        tls=args.tls,
    )


# --rdzv-conf keys for etcd -> the variable each rank reads (torchrun's names, and ours)
_ETCD_CONF = {
    "cacert": "PYCOLLECTIVE_ETCD_CACERT",
    "cert": "PYCOLLECTIVE_ETCD_CERT",
    "key": "PYCOLLECTIVE_ETCD_KEY",
    "user": "PYCOLLECTIVE_ETCD_USER",
    "password_file": "PYCOLLECTIVE_ETCD_PASSWORD_FILE",
}


def _etcd_options(args: argparse.Namespace, nprocs: int, nnodes: int) -> dict:
    """--rdzv-backend etcd: the ranks meet in etcd (no store on any node)."""
    if args.rdzv_backend.lower() == "etcd-v2":
        raise UsageError(
            "--rdzv-backend etcd-v2: etcd's v2 API is gone from etcd 3.6; pycollective "
            "speaks v3 (etcd >= 3.4): use --rdzv-backend etcd"
        )
    if not args.rdzv_endpoint:
        raise UsageError(
            "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] (the etcd "
            "members, tried in turn)"
        )
    if args.master_addr or args.master_port or args.standalone:
        raise UsageError(
            "--rdzv-backend etcd: the ranks meet in etcd; drop --master-addr, --master-port "
            "and --standalone"
        )
    parse_endpoints(args.rdzv_endpoint)  # a bad endpoint is named here
    if nnodes > 1 and args.node_rank is None and args.elastic is None:
        raise UsageError(
            "--rdzv-backend etcd with --nnodes > 1 needs each node's --node-rank (ranks are "
            "numbered node by node), or --elastic MIN:MAX (members are numbered as they come)"
        )
    job = args.rdzv_id or "default"
    if "/" in job or not job.strip():
        raise UsageError(f"--rdzv-id {job!r}: a name without '/'")
    conf: dict[str, str] = {}
    for item in filter(None, (args.rdzv_conf or "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if key == "protocol" and value.strip() in ("http", "https"):
            continue  # torchrun's; the endpoints' scheme or a CA says it here
        if not sep or key not in _ETCD_CONF:
            raise UsageError(
                f"--rdzv-conf {item!r}: etcd takes {', '.join(k + '=' for k in _ETCD_CONF)}"
            )
        conf[_ETCD_CONF[key]] = os.path.abspath(value) if key != "user" else value
    command_line(args.command, module=args.module, no_python=args.no_python)
    return dict(
        nprocs=nprocs,
        cmd=args.command,
        module=args.module,
        no_python=args.no_python,
        nnodes=nnodes,
        node_rank=0 if args.node_rank is None else args.node_rank,
        master_addr=None,
        master_port=0,
        prefix=args.prefix,
        grace=args.grace,
        servers=args.servers,
        notice=args.notice,
        max_restarts=args.max_restarts,
        elastic=args.elastic,
        etcd=(args.rdzv_endpoint, job),
        etcd_env=conf,
    )


def command_line(cmd: Sequence[str], *, module: bool = False, no_python: bool = False) -> list[str]:
    """What each rank executes: torchrun's rules for -m and --no-python; otherwise a .py
    file (not executable) runs with this Python. A script that does not exist is named
    here, once, instead of by every rank."""
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command to run (e.g. pycollective run -n 2 train.py)")
    if module and no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if module:
        return [sys.executable, "-m", *cmd]
    if no_python:
        return cmd
    script_at = None
    if cmd[0].endswith(".py"):
        script_at = 0
    elif os.path.basename(cmd[0]).startswith("python") and len(cmd) > 1:
        if not cmd[1].startswith("-"):
            script_at = 1  # python script.py ...
    if script_at is not None and not os.path.exists(cmd[script_at]):
        raise UsageError(f"no such script: {cmd[script_at]}")
    if script_at == 0 and not os.access(cmd[0], os.X_OK):
        cmd.insert(0, sys.executable)
    return cmd


def rank_environment(base: Mapping[str, str], nprocs: int) -> tuple[dict[str, str], str | None]:
    """torchrun's extra for every rank: OMP_NUM_THREADS=1 unless the user set it, and the
    note to print once (None if nothing was set)."""
    if "OMP_NUM_THREADS" in base or nprocs <= 1:
        return {}, None
    return {"OMP_NUM_THREADS": "1"}, _OMP_NOTE.format(n=nprocs)


def main(args: argparse.Namespace) -> int:
    """The `run` subcommand: parsed arguments in, exit status out."""
    try:
        return launch(**resolve_options(args))
    except UsageError as exc:
        print(f"pycollective run: {exc}", file=sys.stderr)
        return 2
    except (CollectiveError, OSError) as exc:  # e.g. the store port is taken
        print(f"pycollective run: {exc}", file=sys.stderr)
        return 1


__all__ = ["add_arguments", "command_line", "describe_exit", "launch", "main", "resolve_options"]
