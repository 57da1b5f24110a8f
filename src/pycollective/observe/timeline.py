"""The timeline: what each rank did, when, and how long it waited, as a Chrome trace.

    PYCOLLECTIVE_TIMELINE=trace.json pycollective run -n 4 python train.py

Every rank records each collective and point-to-point batch it runs (name, bytes,
algorithm, group, start, end, and how long it was blocked waiting for peers) and writes
them at destroy_process_group and at exit to its own file, the rank put into the name
(trace.rank0.json ...; or where FILE says "{rank}"). `pycollective run` merges the files
of its job into FILE when the job ends; `pycollective timeline merge FILE` does the same
by hand (multi-host jobs: copy the files to one place first). The format is Chrome's
trace events (JSON, one pid per rank, one row per group), read by Perfetto
(ui.perfetto.dev) and chrome://tracing.

How it hooks in: operations already pass through the flight recorder (_flight.py), which
hands out one Entry per operation and marks its start and end; with a timeline, those
entries are TracedEntry objects that also append one tuple to this process's list when
they end. Off (the default), nothing here runs: the recorder's entries are plain.

Waiting is measured where a rank blocks on its peers: the TCP transport's select() and the
shared-memory arena's wait for peers' phase counters add the seconds they spent to
WAIT.total (two clock reads per wait, and only while a timeline records); an operation's
wait is the difference across it. Operations of a process run one at a time (_engine.py),
so the difference belongs to that operation.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from .. import _config, _files
from .._units import human_bytes
from .flight import Entry, job_id

log = logging.getLogger("pycollective")

ENV = "PYCOLLECTIVE_TIMELINE"
FORMAT = "pycollective-timeline/1"


class WaitClock:
    """Seconds this process spent blocked on peers, summed while a timeline records."""

    __slots__ = ("on", "total")

    def __init__(self) -> None:
        self.on = False
        self.total = 0.0


WAIT = WaitClock()


class TracedEntry(Entry):
    """A flight-recorder entry that also reports to the timeline when it ends."""

    __slots__ = ("_timeline", "_wait0")

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self._timeline = timeline
        self._wait0 = 0.0

    def start(self) -> float:
        self._wait0 = WAIT.total
        return super().start()

    def end(self) -> None:
        super().end()
        self._timeline.add(self, WAIT.total - self._wait0)

    def failed(self, exc: BaseException) -> None:
        super().failed(exc)
        self._timeline.add(self, WAIT.total - self._wait0)


def _wall_offset() -> float:
    """time.time() - time.monotonic(), from the closest of a few paired reads, so that
    ranks' timestamps line up to about a microsecond on one host."""
    best = (float("inf"), 0.0)
    for _ in range(5):
        a = time.monotonic()
        w = time.time()
        b = time.monotonic()
        best = min(best, (b - a, w - (a + b) / 2))
    return best[1]


class Timeline:
    """One process's recorded operations (of every World it makes) and where they go."""

    def __init__(self, template: str, rank: int, size: int, limit: int = 1_000_000) -> None:
        self.template = template
        self.rank = rank
        self.size = size
        self.limit = limit
        self.dropped = 0
        # (rank, kind, count, itemsize, dtype, algorithm, op, root, group_name, group,
        #  seq, detail, issued, started, ended, wait, error), times on time.monotonic()
        self.events: list[tuple] = []
        self.offset = _wall_offset()
        self._lock = threading.Lock()

    def entry(self) -> TracedEntry:
        return TracedEntry(self)

    def add(self, e: Entry, wait: float) -> None:
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        started = e.t_started or e.t_ended
        self.events.append(
            (
                self.rank,
                e.kind,
                e.count,
                getattr(e.dtype, "itemsize", 0),
                getattr(e.dtype, "name", str(e.dtype)),
                e.algorithm,
                getattr(e.op, "name", e.op),
                e.root,
                e.group_name,
                e.group,
                e.seq,
                e.detail,
                e.t_issued,
                started,
                e.t_ended,
                wait,
                e.error,
            )
        )

    @property
    def path(self) -> str:
        return rank_path(self.template, self.rank)

    def trace(self) -> dict[str, Any]:
        return to_trace(list(self.events), self.offset, self.meta())

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "world_size": self.size,
            "host": socket.gethostname(),
            "os_pid": os.getpid(),
            "job": job_id(),
            "events": len(self.events),
            "dropped": self.dropped,
        }

    def write(self) -> str | None:
        """Write this rank's file (atomically, 0600: the path's directory may be shared, so
        nothing planted there is followed); the path, or None if it could not be."""
        path = self.path
        with self._lock:
            try:
                _files.ensure_dir(os.path.dirname(path))
                with _files.replacing(path) as f:
                    json.dump(self.trace(), f)
            except OSError as exc:
                log.warning("timeline: could not write %s: %s", path, exc)
                return None
        return path


# ---------------------------------------------------------------------------- the process's


_current: Timeline | None = None
_current_lock = threading.Lock()


def from_env(rank: int, size: int) -> Timeline | None:
    """This process's timeline when PYCOLLECTIVE_TIMELINE is set (made once, at the first
    World; later Worlds add to it), else None."""
    global _current
    template = _config.get(ENV)
    if not template:
        return None
    with _current_lock:
        if _current is None or _current.template != template:
            limit = _config.get("PYCOLLECTIVE_TIMELINE_LIMIT")
            _current = Timeline(template, rank, size, limit)
            WAIT.on = True
            atexit.register(_current.write)
        return _current


def rank_path(template: str, rank: int) -> str:
    """trace.json -> trace.rank3.json; a template with "{rank}" gets the rank there."""
    if "{rank}" in template:
        return template.replace("{rank}", str(rank))
    root, ext = os.path.splitext(template)
    return f"{root}.rank{rank}{ext}"


def rank_files(template: str) -> list[str]:
    """The per-rank files written for `template` that exist now, in rank order."""
    if "{rank}" in template:
        pattern = re.escape(template).replace(re.escape("{rank}"), r"(\d+)")
    else:
        root, ext = os.path.splitext(template)
        pattern = re.escape(root) + r"\.rank(\d+)" + re.escape(ext)
    directory = os.path.dirname(template) or "."
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        path = os.path.join(os.path.dirname(template), name)
        m = re.fullmatch(pattern, path)
        if m:
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


# ---------------------------------------------------------------------------- Chrome trace


def to_trace(events: Sequence[tuple], offset: float, meta: dict[str, Any]) -> dict[str, Any]:
    """Chrome trace events: per rank (pid) a name, per group (tid) a row, per operation an
    "X" (complete) event with ts and dur in microseconds of wall-clock time."""
    out: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    ranks: set[int] = set()
    for (
        rank,
        kind,
        count,
        itemsize,
        dtype,
        algo,
        op,
        root,
        gname,
        group,
        seq,
        detail,
        issued,
        started,
        ended,
        wait,
        error,
    ) in events:
        if rank not in ranks:
            ranks.add(rank)
            out.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": rank,
                    "tid": 0,
                    "args": {"name": f"rank {rank}"},
                }
            )
            out.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": rank,
                    "tid": 0,
                    "args": {"sort_index": rank},
                }
            )
        row = "p2p" if kind == "p2p" else (gname or f"group {group}")
        tid = tids.get((rank, row))
        if tid is None:
            tid = tids[(rank, row)] = sum(1 for r, _ in tids if r == rank)
            out.append(
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": row}}
            )
        nbytes = count * itemsize
        dur = max(0.0, ended - started)
        args: dict[str, Any] = {
            "bytes": nbytes,
            "count": count,
            "dtype": dtype,
            "algorithm": algo,
            "group": gname,
            "seq": seq,
            "wait_us": round(wait * 1e6, 3),
            "queued_us": round(max(0.0, started - issued) * 1e6, 3),
        }
        if op is not None:
            args["op"] = op
        if root >= 0 and kind in ("broadcast", "reduce", "gather", "scatter"):
            args["root"] = root
        if detail:
            args["detail"] = detail
        if error:
            args["error"] = error
        out.append(
            {
                "ph": "X",
                "name": f"{kind} {human_bytes(nbytes)}",
                "cat": kind,
                "pid": rank,
                "tid": tid,
                "ts": round((started + offset) * 1e6, 3),
                "dur": round(dur * 1e6, 3),
                "args": args,
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": meta}


def merge(paths: Iterable[str], job: str | None = None) -> dict[str, Any]:
    """One trace of several ranks' files; timestamps start at the job's first event.
    With `job`, only files of that job (PYCOLLECTIVE_JOB_ID) are taken."""
    events: list[dict[str, Any]] = []
    ranks, jobs, dropped = [], set(), 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        meta = data.get("otherData", {})
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not a pycollective timeline (format {meta.get('format')!r})")
        if job is not None and meta.get("job") != job:
            continue
        ranks.append(meta.get("rank"))
        jobs.add(meta.get("job"))
        dropped += meta.get("dropped", 0)
        events.extend(data["traceEvents"])
    stamps = [e["ts"] for e in events if e.get("ph") == "X"]
    origin = min(stamps) if stamps else 0.0
    for e in events:
        if "ts" in e:
            e["ts"] = round(e["ts"] - origin, 3)
    meta = {
        "format": FORMAT,
        "ranks": sorted(r for r in ranks if r is not None),
        "jobs": sorted(j for j in jobs if j),
        "origin_unix_us": origin,
        "dropped": dropped,
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def write_merged(template: str, out: str | None = None, job: str | None = None) -> str | None:
    """Merge the rank files of `template` into `out` (default: the template's own name);
    the path written, or None when there were no files."""
    paths = rank_files(template)
    data = merge(paths, job)
    if not data["otherData"]["ranks"]:
        return None
    out = out or template.replace("{rank}", "all")
    with _files.replacing(out) as f:
        json.dump(data, f)
    return out


def summarize(trace: dict) -> list[str]:
    """Per rank and operation kind: calls, total time, time waiting for peers."""
    sums: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        cell = sums[(e["pid"], e.get("cat", e["name"]))]
        cell[0] += 1
        cell[1] += e["dur"]
        cell[2] += e.get("args", {}).get("wait_us", 0.0)
    lines = [
        f"{'rank':>4} {'operation':<16} {'calls':>8} {'time(ms)':>11} {'waiting(ms)':>12} "
        f"{'waiting':>8}"
    ]
    for (rank, kind), (calls, dur, wait) in sorted(sums.items()):
        share = f"{wait / dur:.0%}" if dur > 0 else "-"
        lines.append(
            f"{rank:>4} {kind:<16} {int(calls):>8} {dur / 1e3:>11.3f} "
            f"{wait / 1e3:>12.3f} {share:>8}"
        )
    return lines
