"""The scheduled runner's path of repeated calls (ProcessGroup.fast), over a transport
that can `swap`: one frame each way with one peer (transport/tcp/transport.py).

Its one case is the commonest small call between two ranks: an all_reduce whose schedule
is one round of one send and one reducing receive of the whole buffer with the same peer
(recursive doubling at p=2). The first call of a signature runs the whole Python path;
once it succeeded, the group offers it here (`add`). A later call with the same buffer
type, dtype and shape and the same op object goes from the API function to `all_reduce`
below, which does what ProcessGroup.run_collective and run_schedule do for it, without
their objects: the group usable, the engine idle (its lock held for the call), the
sequence number, the flight recorder's entry, the frame header (prepared but for the
sequence number), `swap` (one sendmsg, non-blocking recv_into while the peer is within
the polling budget) and the reduction kernel into the caller's buffer.

Anything it does not know declines (False) before it touches anything, and the Python
path runs. A swap that needs the regular machinery (the peer's frame is not the very one
expected, a wait past the polling budget, a lost connection, a partial send) is handed to
the group's `finish`, which resumes it through `resume` (TCPTransport.swap_finish: the
same deadline, probes, abort notices, mismatch and loss errors as `exchange`) and fails
the call exactly as run_collective's job does.

With the compiled core, `fast_path` puts csrc/swappath.c's SwapPath in front: it runs the
commonest of these calls (one swap in a frame the read buffer holds, reduced by a compiled
kernel) in C from the API function on, and calls SwapFast (the reference) for the rest:
`all_reduce` for what it does not take, `hand_over` for a round that was not plain.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from .._reduce_ops import ReduceOp, fold_codes
from ..observe.flight import COMPLETED, RUNNING
from ..transport._base import InMessage, OutMessage
from ..transport._wire import Header
from ..transport.tcp.transport import (  # what TCPTransport.swap returns
    SWAP_DONE,
    SWAP_FOLDED,
    SWAP_PENDING,
)

_new_header = tuple.__new__  # Header from a tuple, without NamedTuple's argument handling
MAX_SIGS = 16  # signatures remembered (the oldest is replaced)


class SwapPlan:
    """What repeats a call whose schedule is swaps with one peer: the peer (global rank)
    and the steps, in order, each (tag, send lo, send hi, receive lo, receive hi, reduce)
    in bytes of the `data` buffer; a reducing step receives into the same range of a
    temporary, then combines it into `data`, a plain one receives into `data` itself."""

    __slots__ = ("peer", "steps")

    def __init__(self, peer: int, steps: tuple[tuple[int, int, int, int, int, bool], ...]) -> None:
        self.peer = peer
        self.steps = steps


# Steps a swap plan may have: recursive doubling at p=2 is one, the ring (reduce-scatter,
# then all-gather: half the reduction, and the second half received in place) two.
MAX_STEPS = 2


def swap_plan(plan: Any, arrays: dict[str, np.ndarray], ranks: tuple[int, ...]) -> SwapPlan | None:
    """The SwapPlan of an executor Plan whose rounds are each one swap of equal sizes
    with the same peer in the `data` buffer (a reducing receive, or a plain one clear of
    that round's send), else None."""
    data = arrays.get("data")
    if data is None or not 0 < len(plan.rounds) <= MAX_STEPS or plan.scratch:
        return None
    itemsize = data.itemsize
    peers = set()
    steps = []
    for rnd in plan.rounds:
        if rnd.copies or len(rnd.sends) != 1 or len(rnd.recvs) != 1:
            return None
        s, r = rnd.sends[0], rnd.recvs[0]
        if (
            s.peer != r.peer
            or s.tag != r.tag
            or s.buf != "data"
            or r.buf != "data"
            or s.hi - s.lo != r.hi - r.lo  # both sides send alike: one header both ways
            or (not r.reduce and (r.via_temp or (s.lo < r.hi and r.lo < s.hi)))
        ):
            return None
        peers.add(s.peer)
        steps.append((s.tag, s.lo * itemsize, s.hi * itemsize, r.lo * itemsize, r.hi * itemsize,
                      bool(r.reduce)))  # fmt: skip
    if len(peers) != 1:
        return None
    return SwapPlan(ranks[peers.pop()], tuple(steps))


# A step of a _Sig: tag, header tail, send bytes lo, hi, receive bytes lo, hi, and for a
# reducing one the items it combines (lo, hi)
_Step = tuple[int, tuple[int, ...], int, int, int, int, "tuple[int, int] | None"]


class _Sig:
    """One call signature: the buffer's type, dtype and shape, the op object as passed,
    the header's fields but the sequence number, the kernel, where the peer's data lands,
    the flight recorder's fields of the call."""

    __slots__ = (
        "type", "key", "dtype", "shape", "nbytes", "peer", "head", "tail", "kernel",
        "into", "tmp", "prepared", "fields", "tag", "steps", "fold",
    )  # fmt: skip
    type: type
    key: Any  # the op object as the caller passed it
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    peer: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    kernel: Any
    into: memoryview
    tmp: np.ndarray
    prepared: Any
    fields: tuple[Any, ...]
    tag: int
    steps: tuple[_Step, ...] | None  # None: the one swap of the whole buffer
    fold: tuple[int, int] | None  # the kernel's codes for the compiled round, if it has them


class _Resume:
    """A call handed to the group's `finish`: what `resume` needs to go on (a plan of
    steps: the step it stopped at, and whether that step's swap is pending)."""

    __slots__ = ("sig", "obj", "step", "pending")

    def __init__(self, sig: _Sig, obj: np.ndarray, step: int = 0, pending: bool = True) -> None:
        self.sig = sig
        self.obj = obj
        self.step = step
        self.pending = pending


def fast_path(
    group: Any, engine: Any, recorder: Any, entry_type: type, finish: Any, transport: Any
) -> Any:
    """The group's path of repeated calls: SwapFast, behind the transport's compiled
    path (csrc/swappath.c) where it has one. That one runs the commonest call, a small
    swap reduced by a compiled kernel, from the API function to the kernel in C (41k
    instructions a call through SwapFast, most of them the interpreter's), and calls
    SwapFast for everything else."""
    fast = SwapFast(group, engine, recorder, finish, transport)
    compiled = transport.compiled_path(
        fast, group.state, engine.state, fast.recorder, entry_type, RUNNING, COMPLETED
    )
    return fast if compiled is None else compiled


class SwapFast:
    """The group's path of repeated calls over `transport.swap` (see the module)."""

    def __init__(self, group: Any, engine: Any, recorder: Any, finish: Any, transport: Any) -> None:
        self.group = group
        self.world = group.world
        self.engine = engine
        self.recorder = recorder if recorder.enabled else None
        self.finish = finish
        self.transport = transport
        self._sigs: list[_Sig] = []
        self._evict = 0
        self.calls = 0  # calls this path ran (tests, benchmarks)
        self.handed = 0  # of which handed to `finish`
        self.folded = 0  # of which reduced by the transport's compiled round (SWAP_FOLDED)

    @property
    def size(self) -> int:
        return len(self._sigs)

    def forget(self) -> None:
        self._sigs.clear()

    def add(self, obj: Any, key: Any, plan: Any, prepared: Any, entry: Any) -> bool:
        """Learn the signature of an all_reduce that just ran (`prepared`: the group's,
        with its header fields `head`/`tail`, `kernel` and `spec`)."""
        if not isinstance(plan, SwapPlan) or type(obj) is not np.ndarray:
            return False
        spec = prepared.spec
        if (
            spec.collective != "all_reduce"
            or prepared.kernel is None
            or obj.dtype != spec.dtype.numpy
            or obj.size != spec.count
            or not obj.flags.c_contiguous
        ):
            return False
        g = _Sig()
        g.type = type(obj)
        g.key = key
        g.dtype = obj.dtype
        g.shape = obj.shape
        g.nbytes = obj.nbytes
        g.peer = plan.peer
        g.head = prepared.head
        g.tail = prepared.tail[:2] + (obj.nbytes,)
        g.kernel = prepared.kernel
        g.fold = fold_codes(spec.op, spec.dtype) if spec.op != ReduceOp.AVG else None
        g.into = memoryview(bytearray(obj.nbytes))
        g.tmp = np.frombuffer(g.into, dtype=obj.dtype).reshape(obj.shape)
        g.prepared = prepared
        g.fields = (
            entry.group, entry.group_name, entry.kind, entry.count, entry.dtype,
            entry.algorithm, entry.op, entry.root, entry.detail,
        )  # fmt: skip
        whole = (0, obj.nbytes, 0, obj.nbytes, True)
        if len(plan.steps) == 1 and plan.steps[0][1:] == whole:
            g.tag = plan.steps[0][0]
            g.steps = None
        else:
            g.tag = -1
            isz = obj.itemsize
            root, count = prepared.tail[:2]
            g.steps = tuple(
                (tag, (root, count, shi - slo), slo, shi, rlo, rhi,
                 (rlo // isz, rhi // isz) if reduce else None)
                for tag, slo, shi, rlo, rhi, reduce in plan.steps
            )  # fmt: skip
        sigs = self._sigs
        for i, s in enumerate(sigs):
            if s.key is key and s.dtype == g.dtype and s.shape == g.shape:
                sigs[i] = g
                return True
        if len(sigs) >= MAX_SIGS:
            sigs[self._evict] = g
            self._evict = (self._evict + 1) % MAX_SIGS
        else:
            sigs.append(g)
        return True

    def compiled_spec(self, obj: Any, key: Any) -> tuple | None:
        """What csrc/swappath.c needs to repeat the signature `add` just learnt, if it can:
        one swap of the whole buffer reduced by a compiled kernel, in a frame the
        connection's read buffer holds. (sig, where the payload lands, the peer, its
        connection and socket, the frame's Header and packed bytes with sequence number
        0, the kernel's op and dtype codes), or None."""
        for g in self._sigs:
            if g.key is key and g.shape == obj.shape and g.dtype == obj.dtype:
                break
        else:
            return None
        if g.steps is not None or g.fold is None:
            return None
        found = self.transport.compiled_conn(g.peer, g.nbytes)
        if found is None:
            return None
        conn, fd = found
        header = _new_header(Header, g.head + (0, g.tag) + g.tail)
        return (g, g.into, g.peer, conn, fd, header, header.pack(), *g.fold)

    def hand_over(
        self, g: _Sig, obj: Any, header: Header, result: Any, seq: int, entry: Any, started: float
    ) -> None:
        """A call csrc/swappath.c started and could not finish plainly (result: its
        round's, as swap_round returns it, or the error the call tracker raised): the
        transport's state settled the regular way, then the group's `finish` resumes the
        call as it does SwapFast's (the engine is this thread's). `finish` runs whatever
        happens before it: it alone frees the engine, and fails the call on every rank."""
        transport = self.transport
        if isinstance(result, tuple):
            try:
                transport.swap_settle(g.peer, header, memoryview(obj).cast("B"), g.into, result)
            except BaseException as exc:  # noqa: BLE001 - raised through `finish`
                transport.swap_refused(header, exc)
        else:
            transport.swap_refused(header, result)
        self.finish(g.prepared, seq, entry, _Resume(g, obj), started)

    def all_reduce(self, obj: Any, op: Any) -> bool:
        if type(obj) is not np.ndarray:
            return False
        for g in self._sigs:
            if g.key is op and g.shape == obj.shape and g.dtype == obj.dtype:
                break
        else:
            return False
        flags = obj.flags
        if not (flags.c_contiguous and flags.writeable and flags.aligned):
            return False
        gs = self.group.state
        if gs.failed is not None or self.world.closed:
            return False
        transport = self.transport
        es = self.engine.state
        lock = es.lock
        if not lock.acquire(False):
            return False
        try:
            if es.running or es.queue or es.stopped or es.deferred:
                return False
            seq = gs.seq
            if g.steps is None:
                header = _new_header(Header, g.head + (seq, g.tag) + g.tail)
            else:
                first = g.steps[0]
                header = _new_header(Header, g.head + (seq, first[0]) + first[1])
            if not transport.swap_ready(g.peer, header):
                return False
            gs.seq = seq + 1
            recorder = self.recorder
            if recorder is not None:
                f = g.fields
                entry = recorder.record(f[0], f[1], seq, f[2], f[3], f[4], f[5], f[6], f[7], f[8])
            else:
                entry = None
            started = entry.start() if entry is not None else time.monotonic()
            # (bytes: a partial send goes on from a byte offset, queued as any payload)
            raw = memoryview(obj).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+
            if g.steps is None:
                fold = g.fold
                rc = transport.swap(
                    g.peer, header, raw, g.into, True, None if fold is None else (raw, *fold)
                )
                step, pending = 0, True
                if rc == SWAP_DONE:
                    g.kernel(obj, g.tmp)
                elif rc == SWAP_FOLDED:  # reduced into obj by the compiled round
                    rc = SWAP_DONE
                    self.folded += 1
            else:
                step, pending = _run_steps(transport, g, obj, raw, seq, 0)
                rc = SWAP_DONE if step == len(g.steps) else -1
            if rc == SWAP_DONE:
                if entry is not None:
                    entry.end()
                self.calls += 1
                return True
            # It needs the regular machinery: the engine runs this thread's job now (as
            # Engine.run would), and `finish` resumes the call and frees the engine.
            es.running = True
            es.owner = threading.get_ident()
        finally:
            lock.release()
        self.handed += 1
        self.finish(g.prepared, seq, entry, _Resume(g, obj, step, pending), started)
        self.calls += 1
        return True

    def broadcast(self, obj: Any, src: Any) -> bool:
        return False

    def barrier(self) -> bool:
        return False

    def reduce(self, obj: Any, dst: Any, op: Any) -> bool:
        return False

    def all_gather(self, out: Any, inp: Any) -> bool:
        return False

    def reduce_scatter(self, out: Any, inp: Any, op: Any) -> bool:
        return False


def _step_io(g: _Sig, raw: memoryview, seq: int, i: int) -> tuple[Header, memoryview, memoryview]:
    """Step i's frame header, what it sends and where what it receives lands (a reducing
    step's into the temporary, a plain one's in place)."""
    tag, tail, slo, shi, rlo, rhi, items = g.steps[i]  # type: ignore[index]  # plans of steps
    header = _new_header(Header, g.head + (seq, tag) + tail)
    return header, raw[slo:shi], g.into[rlo:rhi] if items is not None else raw[rlo:rhi]


def _combine(g: _Sig, obj: np.ndarray, i: int) -> None:
    """Step i's reduction of what it received into the caller's buffer (if it reduces)."""
    items = g.steps[i][6]  # type: ignore[index]  # plans of steps
    if items is not None:
        lo, hi = items
        g.kernel(obj.reshape(-1)[lo:hi], g.tmp.reshape(-1)[lo:hi])


def _run_steps(
    transport: Any, g: _Sig, obj: np.ndarray, raw: memoryview, seq: int, start: int
) -> tuple[int, bool]:
    """Swap `g`'s steps from `start` on, each combined before the next: (steps done,
    whether the swap of the one it stopped at is pending; else it was declined)."""
    steps = g.steps
    assert steps is not None  # noqa: S101 - only for plans of steps
    for i in range(start, len(steps)):
        header, payload, into = _step_io(g, raw, seq, i)
        rc = transport.swap(g.peer, header, payload, into, i == start == 0)
        if rc != SWAP_DONE:
            return i, rc == SWAP_PENDING
        _combine(g, obj, i)
    return len(steps), False


def resume(transport: Any, call: Any, status: _Resume) -> None:
    """Go on with a swap the fast path handed over (the engine is this thread's)."""
    g = status.sig
    steps = g.steps
    if steps is None:
        transport.swap_finish(call.deadline, call.label)
        g.kernel(status.obj, g.tmp)
        return
    obj = status.obj
    raw = memoryview(obj).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+
    seq = call.header.seq
    i, pending = status.step, status.pending
    while i < len(steps):
        if pending:
            transport.swap_finish(call.deadline, call.label)
        else:  # declined: the regular exchange (whatever made the swap decline, it reads)
            header, payload, into = _step_io(g, raw, seq, i)
            transport.exchange(
                [OutMessage(g.peer, header, payload)],
                [InMessage(g.peer, header, into)],
                call.deadline,
                header.group,
                call.label,
            )
        _combine(g, obj, i)
        i, pending = _run_steps(transport, g, obj, raw, seq, i + 1)
