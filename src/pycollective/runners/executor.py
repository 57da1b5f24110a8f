"""Run one rank's schedule over a transport.

This is the only place where schedules meet I/O. For each round: local copies first, then
every send and receive at once through `Transport.exchange`, reducing incoming data in
segments as it lands (so the reduction overlaps the transfer), then whatever reduction
could not overlap because the destination was also being sent in that round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._dtypes import DType
from .._reduce_ops import Kernel, fold_codes
from ..schedule._steps import Chunk, Copy, Recv, Schedule, Send
from ..transport._base import InMessage, OutMessage, Transport
from ..transport._wire import Header

# (*) numpy's stubs give ndarray a __buffer__ only for Python 3.12+: memoryview() of an
# array is right at run time on every version, so mypy is told to let it be.

SEGMENT_BYTES = 512 * 1024  # reduce incoming data in pieces of this size as it arrives
_ROUND_BITS = 10  # tag = round << 10 | index of the message among those to one peer


class ScratchPool:
    """One growing byte buffer reused by successive collectives of a process.

    Collectives of one process run one at a time (see _engine), so one buffer suffices;
    reusing it avoids page-faulting fresh memory on every call.
    """

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._buf.nbytes < nbytes:
            self._buf = np.empty(nbytes, dtype=np.uint8)
        return self._buf[:nbytes]

    def release(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)


@dataclass
class _Reduction:
    """dst = op(dst, tmp), done piecewise as bytes of tmp arrive."""

    dst: np.ndarray
    tmp: np.ndarray
    kernel: Kernel | None  # None: a plain receive through a temporary (copy at the end)
    itemsize: int
    overlap_ok: bool
    done: int = 0  # elements already combined

    def on_data(self, nbytes: int) -> None:
        upto = nbytes // self.itemsize
        if upto - self.done >= SEGMENT_BYTES // self.itemsize or upto == self.dst.size:
            self._apply(upto)

    def finish(self) -> None:
        if self.done < self.dst.size:
            self._apply(self.dst.size)

    def sink(self, data: memoryview) -> None:
        """Combine the next piece of the message, read from wherever the transport put it
        (a small reused buffer: no temporary as large as the message)."""
        lo = self.done
        src = np.frombuffer(data, dtype=self.dst.dtype)
        hi = lo + src.size
        self.kernel(self.dst[lo:hi], src)  # type: ignore[misc]
        self.done = hi

    def _apply(self, upto: int) -> None:
        lo = self.done
        if self.kernel is None:
            self.dst[lo:upto] = self.tmp[lo:upto]
        else:
            self.kernel(self.dst[lo:upto], self.tmp[lo:upto])
        self.done = upto


def _overlaps(a: Chunk, b: Chunk) -> bool:
    return a.buf == b.buf and a.offset < b.end and b.offset < a.end and a.count > 0 < b.count


@dataclass(frozen=True, slots=True)
class _SendPlan:
    peer: int  # group rank
    buf: str
    lo: int  # elements
    hi: int
    tag: int


@dataclass(frozen=True, slots=True)
class _RecvPlan:
    peer: int
    buf: str
    lo: int
    hi: int
    tag: int
    reduce: bool
    via_temp: bool  # received into temporary space first (reduction, or dst is being sent)
    temp_lo: int  # where in the temporary space
    overlap_ok: bool  # may be combined piecewise while the round is still running


@dataclass(frozen=True, slots=True)
class _RoundPlan:
    index: int
    copies: tuple[tuple[Chunk, Chunk], ...]
    sends: tuple[_SendPlan, ...]
    recvs: tuple[_RecvPlan, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A schedule digested once for execution: tags, temporary space and overlap decisions
    are worked out here instead of on every call."""

    rounds: tuple[_RoundPlan, ...]
    scratch: tuple[tuple[str, int], ...]
    temp_elems: int
    # temporary space when reductions that may overlap read from the transport's window
    # (InMessage.sink) and need none; None: as temp_elems
    sink_temp_elems: int | None = None


def make_plan(schedule: Schedule) -> Plan:
    rounds = []
    temp_elems = sink_temp_elems = 0
    for index, rnd in enumerate(schedule.rounds):
        if not rnd:
            continue
        send_chunks = [s.src for s in rnd if isinstance(s, Send)]
        copies = tuple((s.src, s.dst) for s in rnd if isinstance(s, Copy))
        sends, recvs = [], []
        sent_to: dict[int, int] = {}
        recv_from: dict[int, int] = {}
        temp_used = 0
        for step in rnd:
            if isinstance(step, Send):
                k = sent_to.get(step.peer, 0)
                sent_to[step.peer] = k + 1
                sends.append(
                    _SendPlan(
                        step.peer,
                        step.src.buf,
                        step.src.offset,
                        step.src.end,
                        index << _ROUND_BITS | k,
                    )
                )
            elif isinstance(step, Recv):
                k = recv_from.get(step.peer, 0)
                recv_from[step.peer] = k + 1
                clash = any(_overlaps(step.dst, c) for c in send_chunks)
                via_temp = step.reduce or clash
                recvs.append(
                    _RecvPlan(
                        step.peer,
                        step.dst.buf,
                        step.dst.offset,
                        step.dst.end,
                        index << _ROUND_BITS | k,
                        step.reduce,
                        via_temp,
                        temp_used,
                        not clash,
                    )
                )
                if via_temp:
                    if not (step.reduce and not clash):
                        sink_temp_elems = max(sink_temp_elems, temp_used + step.dst.count)
                    temp_used += step.dst.count
        temp_elems = max(temp_elems, temp_used)
        rounds.append(_RoundPlan(index, copies, tuple(sends), tuple(recvs)))
    return Plan(tuple(rounds), tuple(schedule.scratch.items()), temp_elems, sink_temp_elems)


def run_schedule(
    schedule: Schedule | Plan,
    arrays: dict[str, np.ndarray],
    dtype: DType,
    kernel: Kernel | None,
    transport: Transport,
    ranks: Sequence[int],
    header: Header,
    deadline: float | None,
    pool: ScratchPool,
    label: str = "",
) -> None:
    """Execute a schedule (or its Plan) on `arrays` (1-D arrays of `dtype.numpy`, named as
    the schedule's buffers). `ranks` maps group ranks to the transport's global ranks;
    `header` is the template of every frame this collective sends."""
    plan = schedule if isinstance(schedule, Plan) else make_plan(schedule)
    itemsize = dtype.itemsize
    bufs = dict(arrays)
    # Reductions read incoming pieces where they land if the transport offers it (sink).
    sinks = transport is not None and transport.supports_sink
    temp_elems = plan.temp_elems
    if sinks and plan.sink_temp_elems is not None:
        temp_elems = plan.sink_temp_elems
    scratch_elems = sum(count for _, count in plan.scratch)
    region = pool.take((scratch_elems + temp_elems) * itemsize).view(dtype.numpy)
    offset = 0
    for name, count in plan.scratch:
        bufs[name] = region[offset : offset + count]
        offset += count
    temp = region[offset:]
    raw = {name: arr.view(np.uint8) for name, arr in bufs.items()}
    group = header.group
    with_tag = header.with_tag
    # what the kernel does, for a transport that can combine a payload as it reads it
    fold = fold_codes(header.op, dtype) if kernel is not None and sinks else None

    for rnd in plan.rounds:
        for src, dst in rnd.copies:
            bufs[dst.buf][dst.offset : dst.end] = bufs[src.buf][src.offset : src.end]
        sends = []
        for s in rnd.sends:
            payload = memoryview(raw[s.buf][s.lo * itemsize : s.hi * itemsize])  # type: ignore[arg-type]  # (*)
            sends.append(OutMessage(ranks[s.peer], with_tag(s.tag, payload.nbytes), payload))
        recvs = []
        pending: list[_Reduction] = []
        for r in rnd.recvs:
            expect = with_tag(r.tag, (r.hi - r.lo) * itemsize)
            if r.reduce and r.overlap_ok and sinks:  # (a reduction has a kernel)
                red = _Reduction(bufs[r.buf][r.lo : r.hi], temp[:0], kernel, itemsize, True)
                dest = memoryview(raw[r.buf][r.lo * itemsize : r.hi * itemsize])  # type: ignore[arg-type]  # (*)
                recvs.append(
                    InMessage(ranks[r.peer], expect, dest, sink=red.sink, align=itemsize, fold=fold)
                )
            elif r.via_temp:
                tmp = temp[r.temp_lo : r.temp_lo + r.hi - r.lo]
                red = _Reduction(
                    bufs[r.buf][r.lo : r.hi],
                    tmp,
                    kernel if r.reduce else None,
                    itemsize,
                    r.overlap_ok,
                )
                pending.append(red)
                recvs.append(
                    InMessage(
                        ranks[r.peer],
                        expect,
                        memoryview(tmp.view(np.uint8)),  # type: ignore[arg-type]  # (*)
                        on_data=red.on_data if r.overlap_ok else None,
                    )
                )
            else:
                dest = memoryview(raw[r.buf][r.lo * itemsize : r.hi * itemsize])  # type: ignore[arg-type]  # (*)
                recvs.append(InMessage(ranks[r.peer], expect, dest))
        if sends or recvs:
            transport.exchange(sends, recvs, deadline, group, label)
        for red in pending:
            red.finish()
