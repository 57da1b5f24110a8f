"""Run every rank's schedule in memory: for tests, and to check schedules before use.

Per round, exactly as _steps documents: every rank's Copies (in order), then every Send
snapshots its source, then plain Recvs land, then reducing Recvs apply op in step order.
Scratch buffers start as junk (zero-filling is not promised), so a schedule that reads
scratch before writing it shows up as a wrong answer.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._registry import ALGORITHMS, build_all
from ._steps import Chunk, Copy, Recv, Schedule, Send

ReduceFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


class ScheduleError(ValueError):
    """A set of schedules is inconsistent (unmatched messages, bad chunks)."""


# ---------------------------------------------------------------------------- checks


def check_matching(schedules: Sequence[Schedule]) -> None:
    """Raise ScheduleError unless every Send has exactly one Recv with the same count.

    Messages match by (round, sender, receiver, order among that round's messages
    between the pair), the rule of _steps.
    """
    p = len(schedules)
    problems: list[str] = []
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(schedules):
        if s.rank != i or s.size != p:
            problems.append(f"schedule #{i} says rank {s.rank} of {s.size}, expected {i} of {p}")
            continue
        for t, rnd in enumerate(s.rounds):
            for step in rnd:
                if isinstance(step, Copy):
                    continue
                if not 0 <= step.peer < p or step.peer == i:
                    problems.append(f"round {t}: rank {i} has a message with peer {step.peer}")
                elif isinstance(step, Send):
                    sends[t, i, step.peer].append(step.src.count)
                else:
                    recvs[t, step.peer, i].append(step.dst.count)
    for key in sorted(set(sends) | set(recvs)):
        t, a, b = key
        sc, rc = sends.get(key, []), recvs.get(key, [])
        if sc != rc:
            problems.append(
                f"round {t}: rank {a} sends {len(sc)} message(s) to rank {b} (counts {sc}) "
                f"but rank {b} posts {len(rc)} recv(s) from rank {a} (counts {rc})"
            )
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise ScheduleError("unmatched messages: " + "; ".join(problems[:10]) + more)


def check_hazards(schedule: Schedule) -> None:
    """Raise ScheduleError on chunks outside their buffer, unknown buffers, or two Recvs of
    one round writing overlapping elements where one is a plain Recv (arrival order would
    decide which value survives). Overlapping reducing Recvs are allowed: with a
    commutative, associative op the result is the same in any order (up to float rounding,
    and the value is still computed on one rank only)."""
    sizes = {**schedule.buffers, **schedule.scratch}
    clash = set(schedule.buffers) & set(schedule.scratch)
    if clash:
        raise ScheduleError(f"rank {schedule.rank}: {sorted(clash)} both buffer and scratch")
    for t, rnd in enumerate(schedule.rounds):
        written: dict[str, list[tuple[int, int, bool]]] = defaultdict(list)
        for step in rnd:
            chunks = (
                (step.src,)
                if isinstance(step, Send)
                else ((step.dst,) if isinstance(step, Recv) else (step.src, step.dst))
            )
            for c in chunks:
                if c.buf not in sizes:
                    raise ScheduleError(f"rank {schedule.rank} round {t}: no buffer {c.buf!r}")
                if c.offset < 0 or c.count < 0 or c.end > sizes[c.buf]:
                    raise ScheduleError(
                        f"rank {schedule.rank} round {t}: {c} outside {c.buf}[{sizes[c.buf]}]"
                    )
            if isinstance(step, Recv) and step.dst.count:
                for lo, hi, red in written[step.dst.buf]:
                    both_reduce = red and step.reduce
                    if step.dst.offset < hi and lo < step.dst.end and not both_reduce:
                        raise ScheduleError(
                            f"rank {schedule.rank} round {t}: Recvs overlap in {step.dst.buf} "
                            f"[{lo},{hi}) and [{step.dst.offset},{step.dst.end})"
                        )
                written[step.dst.buf].append((step.dst.offset, step.dst.end, step.reduce))


@dataclass(frozen=True)
class WireBytes:
    """Bytes on the wire: the total, and per rank sent and received."""

    total: int
    sent: tuple[int, ...]
    received: tuple[int, ...]

    @property
    def max_sent(self) -> int:
        return max(self.sent, default=0)

    @property
    def max_received(self) -> int:
        return max(self.received, default=0)


def wire_bytes(schedules: Sequence[Schedule], itemsize: int) -> WireBytes:
    """Bytes every rank sends and receives over the whole collective."""
    sent = [0] * len(schedules)
    recv = [0] * len(schedules)
    for i, s in enumerate(schedules):
        for step in s.steps():
            if isinstance(step, Send):
                sent[i] += step.src.count * itemsize
            elif isinstance(step, Recv):
                recv[i] += step.dst.count * itemsize
    return WireBytes(sum(sent), tuple(sent), tuple(recv))


# ---------------------------------------------------------------------------- running


def _junk(count: int, dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        return (raw & 1).astype(np.bool_)
    out: np.ndarray = raw.view(dtype).copy()
    return out


def execute(
    schedules: Sequence[Schedule],
    buffers: Sequence[Mapping[str, np.ndarray]],
    reduce_fn: ReduceFn = np.add,
) -> list[dict[str, np.ndarray]]:
    """Run `schedules` over copies of `buffers` (one dict per rank) and return the caller
    buffers afterwards. Caller buffers a rank's dict omits start as junk, like scratch."""
    check_matching(schedules)
    if len(buffers) != len(schedules):
        raise ScheduleError(f"{len(buffers)} buffer dicts for {len(schedules)} ranks")
    dtypes = [np.asarray(a).dtype for b in buffers for a in b.values()]
    dtype = dtypes[0] if dtypes else np.dtype(np.int64)
    mem: list[dict[str, np.ndarray]] = []
    for i, (s, given) in enumerate(zip(schedules, buffers, strict=True)):
        check_hazards(s)
        unknown = set(given) - set(s.buffers)
        if unknown:
            raise ScheduleError(f"rank {i}: buffers {sorted(unknown)} not in {sorted(s.buffers)}")
        m: dict[str, np.ndarray] = {}
        for name, n in s.buffers.items():
            if name in given:
                arr = np.array(given[name], copy=True).reshape(-1)
                if arr.size != n:
                    raise ScheduleError(f"rank {i}: {name} has {arr.size} elements, needs {n}")
                m[name] = arr
            else:
                m[name] = _junk(n, dtype, seed=zlib.crc32(f"{i}/{name}".encode()))
        for name, n in s.scratch.items():
            m[name] = _junk(n, dtype, seed=zlib.crc32(f"{i}/{name}/scratch".encode()))
        mem.append(m)

    def view(i: int, c: Chunk) -> np.ndarray:
        return mem[i][c.buf][c.offset : c.end]

    nrounds = max((len(s.rounds) for s in schedules), default=0)
    for t in range(nrounds):
        live = [(i, s.rounds[t]) for i, s in enumerate(schedules) if t < len(s.rounds)]
        for i, rnd in live:
            for step in rnd:
                if isinstance(step, Copy):
                    view(i, step.dst)[...] = view(i, step.src)
        inbox: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
        for i, rnd in live:
            for step in rnd:
                if isinstance(step, Send):
                    inbox[i, step.peer].append(view(i, step.src).copy())
        for i, rnd in live:
            reductions = []
            for step in rnd:
                if isinstance(step, Recv):
                    msg = inbox[step.peer, i].pop(0)
                    if step.reduce:
                        reductions.append((step, msg))
                    else:
                        view(i, step.dst)[...] = msg
            for step, msg in reductions:
                dst = view(i, step.dst)
                dst[...] = reduce_fn(dst, msg)
    return [
        {k: v for k, v in m.items() if k in s.buffers} for m, s in zip(mem, schedules, strict=True)
    ]


def _infer_count(collective: str, inputs: Sequence[Mapping[str, np.ndarray]]) -> int:
    """Elements per rank (per block for the p-block buffers) from the first rank that gives
    the collective's main buffer."""
    p = len(inputs)
    if collective == "barrier":
        return 0
    for key, per_p in (("data", False), ("input", False), ("output", False)):
        sizes = [int(np.asarray(d[key]).size) for d in inputs if key in d]
        if not sizes:
            continue
        n = sizes[0]
        blocks = {
            "input": collective in ("reduce_scatter", "scatter", "all_to_all"),
            "output": collective in ("all_gather", "gather"),
        }.get(key, per_p)
        if blocks:
            if n % p:
                raise ValueError(f"{collective} {key} of {n} elements is not {p} equal blocks")
            n //= p
        return n
    raise ValueError(f"cannot infer count for {collective}: pass count=")


def simulate(
    collective: str,
    algorithm: str,
    inputs: Sequence[Mapping[str, np.ndarray]],
    reduce_fn: ReduceFn = np.add,
    *,
    root: int = 0,
    segment: int = 0,
    count: int | None = None,
    send_counts: Sequence[Sequence[int]] | None = None,
    recv_counts: Sequence[Sequence[int]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Build every rank's schedule (world size = len(inputs)) and run them in memory.

    `inputs[r]` maps buffer names to rank r's initial contents (see the conventions in
    the package docstring); `count` is inferred from them unless given. For all_to_all,
    `send_counts[r]` is rank r's list; `recv_counts` defaults to its transpose.
    Returns each rank's caller buffers afterwards; the inputs are not modified.
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}")
    p = len(inputs)
    if p < 1:
        raise ValueError("inputs must hold one dict per rank (at least one)")
    if send_counts is not None and recv_counts is None:
        recv_counts = [[send_counts[j][r] for j in range(p)] for r in range(p)]
    if count is None:
        count = 0 if send_counts is not None else _infer_count(collective, inputs)
    schedules = build_all(collective, algorithm, p, count, root, segment, send_counts, recv_counts)
    return execute(schedules, inputs, reduce_fn)


_PRIMARY_IN = {
    "all_reduce": "data",
    "broadcast": "data",
    "reduce": "data",
    "all_gather": "input",
    "reduce_scatter": "input",
    "gather": "input",
    "scatter": "input",
    "all_to_all": "input",
}
_PRIMARY_OUT = {
    **{k: "output" for k in _PRIMARY_IN},
    "all_reduce": "data",
    "broadcast": "data",
    "reduce": "data",
}


def run_collective(
    collective: str,
    algorithm: str,
    arrays: Sequence[np.ndarray | None],
    op: ReduceFn = np.add,
    *,
    root: int = 0,
    segment: int = 0,
    send_counts: Sequence[Sequence[int]] | None = None,
) -> list[np.ndarray | None]:
    """The convenience form: one input array per rank in, one result array per rank out.

    The input array is "data" for all_reduce/broadcast/reduce and "input" otherwise (for
    scatter only the root's is read; others may be None). The result is "data" or
    "output"; None where a rank has no output (gather off the root, barrier).
    For barrier pass [None] * size.
    """
    p = len(arrays)
    if collective == "barrier":
        simulate(collective, algorithm, [{} for _ in range(p)], op)
        return [None] * p
    if collective not in _PRIMARY_IN:
        raise ValueError(f"unknown collective {collective!r}")
    key = _PRIMARY_IN[collective]
    inputs: list[dict[str, np.ndarray]] = []
    for r, a in enumerate(arrays):
        if collective == "scatter" and r != root:
            inputs.append({})
        elif a is None:
            raise ValueError(f"rank {r} needs an input array for {collective}")
        else:
            inputs.append({key: np.asarray(a).reshape(-1)})
    count = None
    if collective == "scatter":
        given = np.asarray(arrays[root]).size
        if given % p:
            raise ValueError(f"scatter input of {given} elements is not {p} equal blocks")
        count = given // p
    out = simulate(
        collective,
        algorithm,
        inputs,
        op,
        root=root,
        segment=segment,
        count=count,
        send_counts=send_counts,
    )
    res_key = _PRIMARY_OUT[collective]
    return [d.get(res_key) for d in out]


__all__ = [
    "ScheduleError",
    "WireBytes",
    "check_hazards",
    "check_matching",
    "execute",
    "run_collective",
    "simulate",
    "wire_bytes",
]
