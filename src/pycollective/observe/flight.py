"""The flight recorder: each process remembers its last N operations.

Every collective and point-to-point batch takes one slot of a preallocated ring when it
is issued, and updates it in place when it starts and ends: a few attribute stores and
two clock reads per call, no allocation, no I/O, no lock (operations of one process are
ordered by the engine, and a torn read by the dumper costs at most one odd entry).

The ring is written out as JSON when a collective fails or times out, on SIGUSR1, and on
request (`dump`). `pycollective diagnose DIR` merges the files of a job and says which
rank is behind and at which call (see diagnose.py).

    PYCOLLECTIVE_FLIGHT_RECORDER=N   entries kept (default 256; 0 turns recording off)
    PYCOLLECTIVE_FLIGHT_DIR=DIR      where dumps go (default: $TMPDIR/pycollective-flight-<uid>;
                                     `pycollective run` makes one per job)

Dumps are private (0600, written to a fresh name and renamed: a link planted at a dump's
name is replaced, never followed). The default directory has a predictable name in a
directory everyone writes, so it is used only if it is ours and private (0700, made so
when missing); otherwise the dumps go to a fresh private directory, and a warning says
which. A directory the user names is made 0700 when missing and taken as it is otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any

from .. import _config, _files

log = logging.getLogger("pycollective")

DEFAULT_ENTRIES = _config.VARS["PYCOLLECTIVE_FLIGHT_RECORDER"].default
FORMAT = "pycollective-flight/1"

# states of an entry
QUEUED, RUNNING, COMPLETED, FAILED = "queued", "running", "completed", "failed"


class Entry:
    """One operation. Fields hold raw objects (DType, ReduceOp); text is made at dump."""

    __slots__ = (
        "id",
        "group",
        "group_name",
        "seq",
        "kind",
        "count",
        "dtype",
        "algorithm",
        "op",
        "root",
        "detail",
        "state",
        "t_issued",
        "t_started",
        "t_ended",
        "error",
        "culprits",
    )

    def __init__(self) -> None:
        self.id = -1
        self.group = 0
        self.group_name = ""
        self.seq = -1
        self.kind = ""
        self.count = 0
        self.dtype: Any = None
        self.algorithm = ""
        self.op: Any = None
        self.root = -1
        self.detail = ""
        self.state = ""
        self.t_issued = 0.0
        self.t_started = 0.0
        self.t_ended = 0.0
        self.error = ""
        self.culprits: tuple[int, ...] = ()

    def start(self) -> float:
        """Mark it running; returns the time (time.monotonic), which callers reuse."""
        self.state = RUNNING
        self.t_started = t = time.monotonic()
        return t

    def end(self) -> None:
        self.state = COMPLETED
        self.t_ended = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        self.state = FAILED
        self.t_ended = time.monotonic()
        self.error = f"{type(exc).__name__}: {exc}"
        # the ranks the failure points at: whom a timeout waited on, the peer that was lost
        peer = getattr(exc, "peer", None)
        waiting = tuple(getattr(exc, "waiting_on", ()) or ())
        self.culprits = waiting or ((peer,) if peer is not None else ())

    def as_dict(self, now: float, wall_offset: float) -> dict[str, Any]:
        dtype = getattr(self.dtype, "name", self.dtype)
        op = getattr(self.op, "name", self.op)
        started = self.t_started or None
        ended = self.t_ended or None
        return {
            "id": self.id,
            "group": self.group,
            "group_name": self.group_name,
            "seq": self.seq,
            "kind": self.kind,
            "count": self.count,
            "dtype": dtype,
            "algorithm": self.algorithm,
            "op": op,
            "root": self.root,
            "detail": self.detail,
            "state": self.state,
            "issued_at": self.t_issued + wall_offset,
            "queued_s": (started - self.t_issued) if started else now - self.t_issued,
            "duration_s": (
                (ended - started) if started and ended else (now - started if started else None)
            ),
            "error": self.error or None,
            "culprits": list(self.culprits),
        }


class _Off(Entry):
    """What a disabled recorder hands out: accepts every update, keeps nothing."""

    def start(self) -> float:
        return time.monotonic()

    def end(self) -> None:
        pass

    def failed(self, exc: BaseException) -> None:
        pass


_OFF = _Off()
OFF = _OFF  # what a call records into when recording is off


class FlightRecorder:
    """A ring of the last `capacity` operations of one process (one World)."""

    def __init__(
        self, rank: int, size: int, capacity: int | None = None, timeline: Any = None
    ) -> None:
        if capacity is None:
            capacity = _capacity_from_env()
        self.rank = rank
        self.size = size
        self.capacity = max(0, capacity)
        # With PYCOLLECTIVE_TIMELINE set, entries also report to the timeline (timeline.py):
        # it hands out the entries (`timeline.entry()`), which tell it when they end.
        self.timeline = timeline
        self._ring = [Entry() for _ in range(self.capacity)]
        self._next = 0
        self.last_dump: str | None = None
        self._fallback_dir: str | None = None  # when the default directory was refused
        _register(self)

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def record(
        self,
        group: int,
        group_name: str,
        seq: int,
        kind: str,
        count: int,
        dtype: Any,
        algorithm: str,
        op: Any = None,
        root: int = -1,
        detail: str = "",
    ) -> Entry:
        """Take the next slot for an operation just issued (state 'queued')."""
        timeline = self.timeline
        if timeline is None and not self.capacity:
            return _OFF
        i = self._next
        self._next = i + 1
        if timeline is None:
            e = self._ring[i % self.capacity]
        else:
            # A fresh entry each time: the timeline reads it when it ends, which for an
            # async operation may come after the ring has wrapped round.
            e = timeline.entry()
            if self.capacity:
                self._ring[i % self.capacity] = e
        e.id = i
        e.group = group
        e.group_name = group_name
        e.seq = seq
        e.kind = kind
        e.count = count
        e.dtype = dtype
        e.algorithm = algorithm
        e.op = op
        e.root = root
        e.detail = detail
        e.state = QUEUED
        e.t_issued = time.monotonic()
        e.t_started = e.t_ended = 0.0
        e.error = ""
        e.culprits = ()
        return e

    def entries(self) -> list[dict[str, Any]]:
        """The recorded operations, oldest first, as plain dicts."""
        now = time.monotonic()
        offset = time.time() - now
        n = self._next
        lo = max(0, n - self.capacity)
        out = []
        for i in range(lo, n):
            e = self._ring[i % self.capacity]
            if e.id == i:  # else overwritten while we read: skip rather than mislabel
                out.append(e.as_dict(now, offset))
        return out

    def snapshot(self, reason: str) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "world_size": self.size,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "job": job_id(),
            "reason": reason,
            "time": time.time(),
            "capacity": self.capacity,
            "recorded": self._next,
            "entries": self.entries(),
        }

    def dump(self, reason: str, directory: str | None = None) -> str | None:
        """Write the ring to DIR/rank<R>-<pid>.json (atomically, 0600); return the path, or
        None when disabled or the write failed (logged: a dump must never raise)."""
        if not self.capacity:
            return None
        path = None
        try:
            directory = _files.ensure_dir(directory) if directory else self.directory()
            path = os.path.join(directory, f"rank{self.rank}-{os.getpid()}.json")
            with _files.replacing(path) as f:
                json.dump(self.snapshot(reason), f, indent=1)
        except (OSError, TypeError, ValueError) as exc:
            log.warning("flight recorder: could not write %s: %s", path or "a dump", exc)
            return None
        self.last_dump = path
        log.info("flight recorder: %s: wrote %s", reason, path)
        return path

    def directory(self) -> str:
        """Where this recorder's dumps go: PYCOLLECTIVE_FLIGHT_DIR (made 0700 if missing),
        else the default if it is private to us, else a fresh private directory."""
        explicit = _config.get("PYCOLLECTIVE_FLIGHT_DIR")
        if explicit:
            return _files.ensure_dir(explicit)
        if self._fallback_dir is not None:
            return self._fallback_dir
        default = flight_dir()
        try:
            return _files.private_dir(default)
        except (OSError, _files.UnsafePath) as exc:
            why = exc.problem if isinstance(exc, _files.UnsafePath) else str(exc)
            fresh = tempfile.mkdtemp(prefix=f"{os.path.basename(default)}-")  # 0700, random
            self._fallback_dir = fresh
            # warnings, not the log: the package's log is silent unless asked, and this is
            # someone else's directory at our name, which the user should hear about
            warnings.warn(
                f"pycollective flight recorder: not using {default} ({why}: another user "
                f"could read or replace the dumps there); this process dumps to {fresh} "
                "instead (set PYCOLLECTIVE_FLIGHT_DIR to choose)",
                stacklevel=2,
            )
            return fresh


def _capacity_from_env() -> int:
    return int(_config.get("PYCOLLECTIVE_FLIGHT_RECORDER"))


def flight_dir() -> str:
    """PYCOLLECTIVE_FLIGHT_DIR, else the default (not judged here: see
    FlightRecorder.directory)."""
    explicit = _config.get("PYCOLLECTIVE_FLIGHT_DIR")
    if explicit:
        return explicit
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"pycollective-flight-{uid}")


def job_id() -> str:
    """What tells this job's dumps from another's in a shared directory."""
    for var in ("PYCOLLECTIVE_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if os.environ.get(var):
            return os.environ[var]
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else f"pid{os.getpid()}"


# ---------------------------------------------------------------------- SIGUSR1

# The recorder of the most recent World: what SIGUSR1 dumps. Weak, so a destroyed
# World's recorder goes with it.
_current: weakref.ReferenceType[FlightRecorder] | None = None
_signal_installed = False


def _register(recorder: FlightRecorder) -> None:
    global _current
    _current = weakref.ref(recorder)
    _install_sigusr1()


def current() -> FlightRecorder | None:
    return _current() if _current is not None else None


def _on_sigusr1(signum: int, frame: Any) -> None:
    recorder = current()
    if recorder is None:
        return
    # Write from a thread: the handler runs between two bytecodes of whatever the main
    # thread was doing, which may hold a lock that file I/O or logging wants.
    threading.Thread(
        target=recorder.dump, args=("SIGUSR1",), name="pycollective-flight-dump", daemon=True
    ).start()


def _install_sigusr1() -> None:
    """Dump on SIGUSR1, unless the program handles SIGUSR1 itself (then leave it be)."""
    global _signal_installed
    if _signal_installed or not hasattr(signal, "SIGUSR1"):
        return
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may install handlers; try again with the next World
    try:
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            _signal_installed = True  # someone else's: theirs wins
            return
        signal.signal(signal.SIGUSR1, _on_sigusr1)
    except (ValueError, OSError):
        return
    _signal_installed = True
