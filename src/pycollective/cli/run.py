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
others get SIGTERM and `grace` seconds to exit on their own before their process groups
are SIGKILLed; the launcher then names the rank that failed first and shows the end of
its stderr. Nothing the ranks started outlives the launcher: every process group is
killed at the end, and on Linux a rank also dies if the launcher itself is killed.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import logging
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

from .._errors import CollectiveError, UsageError
from ..observe import diagnose
from ..observe import timeline as _timeline
from ..store import TCPStoreServer

logger = logging.getLogger("pycollective.launch")

HELP = "start N ranks of a program with the torchrun environment"
_STDERR_TAIL = 20  # lines of the failing rank's stderr kept for the report
_POLL = 0.02


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
    def __init__(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.rank = rank
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
) -> int:
    """Run `cmd` as `nprocs` ranks on this node (node `node_rank` of `nnodes`).

    With `servers` > 0 (single node), `servers` more ranks run the same command after the
    workers, as parameter servers: every rank gets PYCOLLECTIVE_NUM_SERVERS and
    PYCOLLECTIVE_ROLE (worker or server); see pycollective.ps.

    Returns 0 if every rank exited 0; otherwise the first failing rank's exit status
    (128 + N if it died of signal N), or 128 + N if the launcher itself got signal N.
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
    if grace < 0:
        raise UsageError(f"grace must be >= 0, got {grace}")
    if not 0 <= master_port < 65536:
        raise UsageError(f"master port must be in 0..65535, got {master_port}")
    if nnodes > 1 and (master_addr is None or master_port == 0):
        raise UsageError("a multi-node job needs --master-addr and a non-zero --master-port")
    command = command_line(cmd, module=module, no_python=no_python)
    base_env = dict(os.environ if env is None else env)
    out = _Output(stdout if stdout is not None else sys.stdout.buffer)
    err = _Output(stderr if stderr is not None else sys.stderr.buffer)
    # A single-node job listens on loopback only, unless told an address to be reached at.
    bind = "" if nnodes > 1 else (master_addr or "127.0.0.1")
    master_addr = master_addr or "127.0.0.1"

    secret_vars: dict[str, str] = {}
    if base_env.get("PYCOLLECTIVE_SECRET"):
        secret = base_env["PYCOLLECTIVE_SECRET"].encode()
    elif base_env.get("PYCOLLECTIVE_SECRET_FILE"):
        # The ranks read the same file themselves (pycollective._auth.secret_from_env).
        with open(base_env["PYCOLLECTIVE_SECRET_FILE"], "rb") as f:
            secret = f.read().strip()
    elif nnodes == 1:
        secret_vars["PYCOLLECTIVE_SECRET"] = secrets.token_hex(32)
        secret = secret_vars["PYCOLLECTIVE_SECRET"].encode()
    else:
        # Each node's launcher would invent a different secret; only the user can share one.
        logger.warning("multi-node job without PYCOLLECTIVE_SECRET: ranks are not authenticated")
        secret = b""

    server: TCPStoreServer | None = None
    if node_rank == 0:
        server = TCPStoreServer(bind, master_port, secret).start()
        master_port = server.port
    # Flight-recorder dumps of this job go to a directory of its own (unless the user
    # chose one), so that a failure can be diagnosed from exactly this job's files.
    flight_dir = None
    if not base_env.get("PYCOLLECTIVE_FLIGHT_DIR"):
        flight_dir = tempfile.mkdtemp(prefix="pycollective-flight-")
        secret_vars["PYCOLLECTIVE_FLIGHT_DIR"] = flight_dir
    omp, note = rank_environment(base_env, nprocs + servers)
    secret_vars.update(omp)
    if note:
        err.write(b"", note.encode())
    secret_vars.setdefault("PYCOLLECTIVE_JOB_ID", f"{os.getpid()}-{secrets.token_hex(4)}")
    try:
        status = _run(
            nprocs, command, nnodes, node_rank, master_addr, master_port,
            prefix, grace, base_env, secret_vars, out, err, servers,
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
            base_env["PYCOLLECTIVE_TIMELINE"].strip(), secret_vars["PYCOLLECTIVE_JOB_ID"], err
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
    if status == 0:
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
    secret_vars: dict[str, str],
    out: _Output,
    err: _Output,
    servers: int = 0,
) -> int:
    received: list[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    previous: dict[int, object] = {}
    if in_main:  # signal handlers can only be installed from the main thread
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))

    ranks: list[_Rank] = []
    preexec = _parent_death_signal()
    try:
        for local_rank in range(nprocs + servers):
            rank = node_rank * nprocs + local_rank
            child_env = dict(base_env)
            child_env.update(secret_vars)
            if servers:
                child_env.update(
                    PYCOLLECTIVE_NUM_SERVERS=str(servers),
                    PYCOLLECTIVE_ROLE="server" if local_rank >= nprocs else "worker",
                )
            child_env.update(
                RANK=str(rank),
                WORLD_SIZE=str(nprocs * nnodes + servers),
                LOCAL_RANK=str(local_rank),
                LOCAL_WORLD_SIZE=str(nprocs + servers),
                GROUP_RANK=str(node_rank),
                GROUP_WORLD_SIZE=str(nnodes),
                NODE_RANK=str(node_rank),
                ROLE_RANK=str(rank),
                ROLE_WORLD_SIZE=str(nprocs * nnodes + servers),
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(master_port),
                PYCOLLECTIVE_STORE_HOSTED="1",
                PYTHONUNBUFFERED="1",
            )
            try:
                proc = subprocess.Popen(
                    command,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # own process group: a killpg takes grandchildren
                    preexec_fn=preexec,
                )
            except OSError as exc:
                err.write(b"", f"pycollective run: cannot start {command[0]!r}: {exc}".encode())
                return 127 if isinstance(exc, FileNotFoundError) else 126
            r = _Rank(rank, proc)
            tag = f"[rank {rank}]: ".encode() if prefix else b""
            assert proc.stdout is not None and proc.stderr is not None
            for pipe, dest, tail in ((proc.stdout, out, None), (proc.stderr, err, r.stderr_tail)):
                t = threading.Thread(target=_pump, args=(pipe, dest, tag, tail), daemon=True)
                t.start()
                r.readers.append(t)
            ranks.append(r)
        return _supervise(ranks, grace, received, err)
    finally:
        for r in ranks:
            # Also reached when the launcher is interrupted by an exception: never leave
            # a rank, or anything it started, behind.
            _killpg(r.proc.pid, signal.SIGKILL)
            if r.proc.poll() is None:
                r.proc.wait()
        until = time.monotonic() + 2.0
        for r in ranks:
            for t in r.readers:
                t.join(timeout=max(0.0, until - time.monotonic()))
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def _supervise(ranks: list[_Rank], grace: float, received: list[int], err: _Output) -> int:
    first: _Rank | None = None
    launcher_signal: int | None = None
    kill_at: float | None = None
    handled = 0
    while True:
        running = []
        failed_now = []
        for r in ranks:
            if r.returncode is None:
                r.returncode = r.proc.poll()
                if r.returncode is None:
                    running.append(r)
                elif r.returncode != 0:
                    failed_now.append(r)
        if failed_now and first is None and launcher_signal is None:
            # Several found dead in one look: a rank killed by a signal is likelier the
            # cause than one that exited with an error (often the others' reaction to it).
            first = min(failed_now, key=lambda x: ((x.returncode or 0) >= 0, x.rank))
            others = [o for o in ranks if o is not first and o.proc.poll() is None]
            if others:
                err.write(
                    b"",
                    f"pycollective run: rank {first.rank} "
                    f"{describe_exit(first.returncode or 0)}; "
                    f"stopping the other ranks (grace {grace:g} s)".encode(),
                )
            for other in others:
                _killpg(other.proc.pid, signal.SIGTERM)
            kill_at = time.monotonic() + grace
        while handled < len(received):
            sig = received[handled]
            handled += 1
            if launcher_signal is None:
                launcher_signal = sig
                kill_at = kill_at or time.monotonic() + grace
                for r in running:
                    _killpg(r.proc.pid, sig)
            else:  # a second signal: the user does not want to wait
                kill_at = time.monotonic()
        if not running:
            break
        if kill_at is not None and time.monotonic() >= kill_at:
            for r in running:
                _killpg(r.proc.pid, signal.SIGKILL)
            kill_at = None  # SIGKILL cannot be ignored: just reap
        time.sleep(_POLL)

    for r in ranks:
        _killpg(r.proc.pid, signal.SIGKILL)  # what the ranks left running would hold the pipes
    until = time.monotonic() + 2.0
    for r in ranks:
        for t in r.readers:
            t.join(timeout=max(0.0, until - time.monotonic()))  # so the stderr tail is complete
    if launcher_signal is not None:
        err.write(b"", f"pycollective run: stopped by {_signal_name(launcher_signal)}".encode())
        return 128 + launcher_signal
    if first is None:
        return 0
    assert first.returncode is not None
    how = describe_exit(first.returncode)
    lines = [f"pycollective run: rank {first.rank} {how} (the first rank to fail)"]
    if first.stderr_tail:
        lines.append(f"pycollective run: last lines of rank {first.rank}'s stderr:")
        lines.extend("    " + b.decode("utf-8", "replace").rstrip("\n") for b in first.stderr_tail)
    others = [
        f"rank {r.rank} {describe_exit(r.returncode)}"
        for r in ranks
        if r is not first and r.returncode not in (None, 0)
    ]
    if others:
        lines.append("pycollective run: then " + ", ".join(others))
    err.write(b"", "\n".join(lines).encode())
    return _exit_code(first.returncode)


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
        f"PORT (port {_RDZV_DEFAULT_PORT} if omitted)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-backend", "--rdzv_backend", default=None, metavar="NAME",
        help="accepted for torchrun scripts: c10d or static (both mean the store above)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-id", "--rdzv_id", default=None, metavar="ID",
        help="accepted for torchrun scripts (the job is named by its store)",
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
        "--grace", type=float, default=5.0,
        help="seconds the other ranks get to exit after one fails, before SIGKILL (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--no-prefix", dest="prefix", action="store_false",
        help='do not prefix output lines with "[rank N]: "',
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
            "supported; give one number"
        )
    try:
        return int(lo)
    except ValueError:
        raise UsageError(f"--nnodes must be a number, got {text!r}") from None


def resolve_options(args: argparse.Namespace) -> dict:
    """The parsed command line as launch()'s keyword arguments (raises UsageError)."""
    nprocs = _count(str(args.nprocs), "-n/--nproc-per-node")
    nnodes = _nnodes(str(args.nnodes))
    master_addr, master_port = args.master_addr, args.master_port
    backend = (args.rdzv_backend or "").lower()
    if backend not in ("", "c10d", "static"):
        raise UsageError(
            f"--rdzv-backend {args.rdzv_backend}: only c10d and static are supported "
            "(both use the store that node 0's launcher hosts)"
        )
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
