"""The ranks' processes: how they are started and reaped, their output forwarded line by
line, and how they ended, in words."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

STDERR_TAIL = 20  # lines of the failing rank's stderr kept for the report


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int) -> str:
    """'exited with status 3' / 'was killed by SIGKILL', from a Popen return code."""
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with status {returncode}"


def exit_code(returncode: int) -> int:
    # Shell convention: a death by signal N reads as 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def parent_death_signal() -> Callable[[], None] | None:
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


def killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Output:
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


def pump(pipe: BinaryIO, out: Output, prefix: bytes, tail: collections.deque[bytes] | None) -> None:
    with pipe:
        # readline with a limit, so a rank printing one endless line cannot exhaust memory.
        for line in iter(lambda: pipe.readline(65536), b""):
            out.write(prefix, line)
            if tail is not None:
                tail.append(line)


class Rank:
    def __init__(self, rank: int, proc: subprocess.Popen[bytes], local_rank: int = 0) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.proc = proc
        self.returncode: int | None = None
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL)
        self.readers: list[threading.Thread] = []


def handles(pid: int, sig: int) -> bool:
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


def last_line(tail: collections.deque[bytes]) -> str:
    for raw in reversed(tail):
        text = raw.decode("utf-8", "replace").strip()
        if text:
            return text
    return ""


def reap(ranks: list[Rank]) -> None:
    """Kill what is left of `ranks` and wait for their output. Also reached when the
    launcher is interrupted by an exception: never leave a rank, or anything it started,
    behind."""
    for r in ranks:
        killpg(r.proc.pid, signal.SIGKILL)
        if r.proc.poll() is None:
            r.proc.wait()
    until = time.monotonic() + 2.0
    for r in ranks:
        for t in r.readers:
            t.join(timeout=max(0.0, until - time.monotonic()))
    ranks.clear()
