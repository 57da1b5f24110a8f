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

from ._dtypes import DType
from ._reduce_ops import Kernel
from .schedule._steps import Chunk, Copy, Recv, Schedule, Send
from .transport._base import InMessage, OutMessage, Transport
from .transport._wire import Header

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

    def _apply(self, upto: int) -> None:
        lo = self.done
        if self.kernel is None:
            self.dst[lo:upto] = self.tmp[lo:upto]
        else:
            self.kernel(self.dst[lo:upto], self.tmp[lo:upto])
        self.done = upto


def _overlaps(a: Chunk, b: Chunk) -> bool:
    return a.buf == b.buf and a.offset < b.end and b.offset < a.end and a.count and b.count


def run_schedule(
    schedule: Schedule,
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
    """Execute `schedule` on `arrays` (1-D arrays of `dtype.numpy`, named as the schedule's
    buffers). `ranks` maps group ranks to the transport's global ranks; `header` is the
    template of every frame this collective sends."""
    itemsize = dtype.itemsize
    bufs = dict(arrays)
    temp_elems = max((_temp_elems(rnd) for rnd in schedule.rounds), default=0)
    scratch_elems = sum(schedule.scratch.values())
    region = pool.take((scratch_elems + temp_elems) * itemsize).view(dtype.numpy)
    offset = 0
    for name, count in schedule.scratch.items():
        bufs[name] = region[offset : offset + count]
        offset += count
    temp_region = region[offset:]
    raw = {name: arr.view(np.uint8) for name, arr in bufs.items()}
    group = header.group

    def view(chunk: Chunk) -> np.ndarray:
        return bufs[chunk.buf][chunk.offset : chunk.end]

    def raw_view(chunk: Chunk) -> memoryview:
        return memoryview(raw[chunk.buf][chunk.offset * itemsize : chunk.end * itemsize])

    for index, rnd in enumerate(schedule.rounds):
        if not rnd:
            continue
        sends: list[OutMessage] = []
        recvs: list[InMessage] = []
        pending: list[_Reduction] = []
        send_chunks = [s.src for s in rnd if isinstance(s, Send)]
        sent_to: dict[int, int] = {}
        recv_from: dict[int, int] = {}
        temp_used = 0
        for step in rnd:
            if isinstance(step, Copy):
                view(step.dst)[...] = view(step.src)
        for step in rnd:
            if isinstance(step, Send):
                k = sent_to.get(step.peer, 0)
                sent_to[step.peer] = k + 1
                payload = raw_view(step.src)
                tag = index << _ROUND_BITS | k
                sends.append(
                    OutMessage(ranks[step.peer], header.with_tag(tag, payload.nbytes), payload)
                )
            elif isinstance(step, Recv):
                k = recv_from.get(step.peer, 0)
                recv_from[step.peer] = k + 1
                tag = index << _ROUND_BITS | k
                clash = any(_overlaps(step.dst, c) for c in send_chunks)
                expect = header.with_tag(tag, step.dst.count * itemsize)
                if step.reduce or clash:
                    tmp = temp_region[temp_used : temp_used + step.dst.count]
                    temp_used += step.dst.count
                    red = _Reduction(
                        view(step.dst), tmp, kernel if step.reduce else None, itemsize, not clash
                    )
                    pending.append(red)
                    recvs.append(
                        InMessage(
                            ranks[step.peer],
                            expect,
                            memoryview(tmp.view(np.uint8)),
                            on_data=red.on_data if red.overlap_ok else None,
                        )
                    )
                else:
                    recvs.append(InMessage(ranks[step.peer], expect, raw_view(step.dst)))
        if sends or recvs:
            transport.exchange(sends, recvs, deadline, group, label)
        for red in pending:
            red.finish()


def _temp_elems(rnd) -> int:
    """Elements of temporary space a round needs: one per reducing or clashing receive."""
    send_chunks = [s.src for s in rnd if isinstance(s, Send)]
    total = 0
    for step in rnd:
        if isinstance(step, Recv) and (
            step.reduce or any(_overlaps(step.dst, c) for c in send_chunks)
        ):
            total += step.dst.count
    return total
