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
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..transport._wire import Header
from ..transport.tcp.transport import SWAP_DONE  # what TCPTransport.swap returns

_new_header = tuple.__new__  # Header from a tuple, without NamedTuple's argument handling
MAX_SIGS = 16  # signatures remembered (the oldest is replaced)


class SwapPlan:
    """What repeats a call whose schedule is one swap: the peer (global rank), the tag."""

    __slots__ = ("peer", "tag")

    def __init__(self, peer: int, tag: int) -> None:
        self.peer = peer
        self.tag = tag


def swap_plan(plan: Any, arrays: dict[str, np.ndarray], ranks: tuple[int, ...]) -> SwapPlan | None:
    """The SwapPlan of an executor Plan that is one swap of the whole `data` buffer with a
    reduction, else None."""
    data = arrays.get("data")
    if data is None or len(plan.rounds) != 1 or plan.scratch:
        return None
    rnd = plan.rounds[0]
    if rnd.copies or len(rnd.sends) != 1 or len(rnd.recvs) != 1:
        return None
    s, r = rnd.sends[0], rnd.recvs[0]
    whole = (0, data.size)
    if (
        s.peer != r.peer
        or s.tag != r.tag
        or s.buf != "data"
        or r.buf != "data"
        or not r.reduce
        or (s.lo, s.hi) != whole
        or (r.lo, r.hi) != whole
    ):
        return None
    return SwapPlan(ranks[s.peer], s.tag)


class _Sig:
    """One call signature: the buffer's type, dtype and shape, the op object as passed,
    the header's fields but the sequence number, the kernel, where the peer's data lands,
    the flight recorder's fields of the call."""

    __slots__ = (
        "type", "key", "dtype", "shape", "nbytes", "peer", "head", "tail", "kernel",
        "into", "tmp", "prepared", "fields", "tag",
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


class _Resume:
    """A call handed to the group's `finish`: what `resume` needs to go on."""

    __slots__ = ("sig", "obj")

    def __init__(self, sig: _Sig, obj: np.ndarray) -> None:
        self.sig = sig
        self.obj = obj


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
        g.into = memoryview(bytearray(obj.nbytes))
        g.tmp = np.frombuffer(g.into, dtype=obj.dtype).reshape(obj.shape)
        g.prepared = prepared
        g.fields = (
            entry.group, entry.group_name, entry.kind, entry.count, entry.dtype,
            entry.algorithm, entry.op, entry.root, entry.detail,
        )  # fmt: skip
        g.tag = plan.tag
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

    def all_reduce(self, obj: Any, op: Any) -> bool:
        if type(obj) is not np.ndarray:
            return False
        for g in self._sigs:
            if g.key is op and g.shape == obj.shape and g.dtype == obj.dtype:
                break
        else:
            return False
        flags = obj.flags
        if not (flags.c_contiguous and flags.writeable):
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
            header = _new_header(Header, g.head + (seq, g.tag) + g.tail)
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
            rc = transport.swap(g.peer, header, memoryview(obj).cast("B"), g.into, True)  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+
            if rc == SWAP_DONE:
                g.kernel(obj, g.tmp)
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
        self.finish(g.prepared, seq, entry, _Resume(g, obj), started)
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


def resume(transport: Any, call: Any, status: _Resume) -> None:
    """Go on with a swap the fast path handed over (the engine is this thread's)."""
    transport.swap_finish(call.deadline, call.label)
    g = status.sig
    g.kernel(status.obj, g.tmp)
