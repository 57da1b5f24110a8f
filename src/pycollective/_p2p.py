"""Point-to-point: send/recv, isend/irecv, batch_isend_irecv, and monitored_barrier.

isend and irecv only record what to do; the engine runs every recorded operation as one
concurrent exchange when a handle is waited on or another operation is issued (see
_engine). Messages are matched by (group, tag) in the order they were sent, as in torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _state
from ._buffers import Buffer, as_buffer
from ._errors import CollectiveError, CollectiveTimeout, UsageError
from ._group import ALGO_CODE, ProcessGroup, World
from ._work import Work
from .transport import _wire
from .transport._base import ANY_SOURCE, InMessage, OutMessage
from .transport._wire import Header

MAX_TAG = (1 << 31) - 1
_MONITORED_BARRIER_TAG = MAX_TAG + 1  # outside the user's tag space
_MONITORED_GRACE = 2.0  # seconds non-root ranks wait beyond the timeout for the root's verdict


@dataclass(eq=False)
class _Op:
    is_send: bool
    group: ProcessGroup
    peer: int  # global rank, or ANY_SOURCE
    buf: Buffer
    tag: int


def _peer(
    g: ProcessGroup, global_rank: int | None, group_rank: int | None, what: str, allow_any: bool
) -> int:
    if global_rank is not None and group_rank is not None:
        raise UsageError(f"give either {what} or group_{what}, not both")
    if group_rank is not None:
        if not 0 <= group_rank < g.size():
            raise UsageError(f"group_{what}={group_rank} is out of range for a group of {g.size()}")
        peer = g.ranks[group_rank]
    elif global_rank is None:
        if allow_any:
            return ANY_SOURCE
        raise UsageError(f"{what} must be given")
    else:
        g.group_rank(int(global_rank), what)
        peer = int(global_rank)
    if peer == g.world.rank:
        raise UsageError(
            f"rank {peer} cannot {'send to' if what == 'dst' else 'receive from'} itself"
        )
    return peer


def _tag(tag: Any) -> int:
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool) or not 0 <= tag <= MAX_TAG:
        raise UsageError(f"tag must be an int in [0, {MAX_TAG}], got {tag!r}")
    return int(tag)


def _header(op: _Op, nbytes: int) -> Header:
    return Header(
        _wire.P2P,
        _wire.KIND_CODE["send_recv"],
        op.buf.dtype.code,
        0,
        ALGO_CODE["p2p"],
        op.group.group_id,
        0,
        op.tag,
        0,
        0,
        nbytes,
    )


class _Outcome:
    """What run_batch reports of a blocking send/recv run without a Work."""

    __slots__ = ("src_rank",)

    def __init__(self) -> None:
        self.src_rank = -1


def run_batch(world: World, batch: Sequence[tuple[_Op, Work | _Outcome]]) -> None:
    """Run deferred point-to-point operations as one exchange (on the engine's thread)."""
    sends, recvs, receivers = [], [], []
    for op, work in batch:
        op.group.check_usable()
        payload = memoryview(op.buf.array.view(np.uint8))
        if op.is_send:
            sends.append(OutMessage(op.peer, _header(op, payload.nbytes), payload))
        else:
            m = InMessage(op.peer, _header(op, payload.nbytes), payload)
            recvs.append(m)
            receivers.append((m, work))
    timeout = min(op.group.timeout for op, _ in batch)
    if world.transport is None:
        raise UsageError("point-to-point needs a world of more than one rank")
    label = (
        "p2p("
        + ", ".join(
            f"{'send to' if op.is_send else 'recv from'} "
            f"{op.peer if op.peer >= 0 else 'any'} tag {op.tag}"
            for op, _ in batch
        )
        + ")"
    )
    first_group = batch[0][0].group
    group_id = first_group.group_id
    entry = world.flight.record(  # type: ignore[union-attr]
        group_id,
        first_group.group_name,
        -1,
        "p2p",
        sum(op.buf.count for op, _ in batch),
        batch[0][0].buf.dtype,
        "p2p",
        detail=label,
    )
    entry.start()
    try:
        # An abort notice already here (e.g. a receiver that found our last message did not
        # match) fails a send-only batch too, instead of it completing into the void.
        world.transport.check_group(group_id)
        world.transport.exchange(sends, recvs, time.monotonic() + timeout, group_id, label)
    except CollectiveError as exc:
        entry.failed(exc)
        if not isinstance(exc, UsageError):
            # As for collectives: the group is unusable and its members are told why, so
            # the sender of a mismatched message hears of it at its next operation.
            for g in {id(op.group): op.group for op, _ in batch}.values():
                g.fail(exc)
            world.flight.dump(f"{type(exc).__name__} in {label}")  # type: ignore[union-attr]
        raise
    entry.end()
    for m, work in receivers:
        work.src_rank = m.source


def _submit(op: _Op, label: str) -> Work:
    work = Work(label, [op.buf.source])
    return op.group.world.engine.defer_p2p(op, work)


def _make_op(
    is_send: bool,
    tensor: Any,
    peer: int | None,
    group: ProcessGroup | None,
    tag: int,
    group_peer: int | None,
) -> _Op | None:
    g = _state.resolve_group(group)
    if not g.is_member:
        return None
    if is_send:
        target = _peer(g, peer, group_peer, "dst", allow_any=False)
        buf = as_buffer(tensor, "send tensor", writable=False)
    else:
        target = _peer(g, peer, group_peer, "src", allow_any=True)
        buf = as_buffer(tensor, "recv tensor")
    return _Op(is_send, g, target, buf, _tag(tag))


def _run_now(op: _Op) -> int:
    """A blocking send/recv with nothing deferred before it runs on the caller's thread,
    after everything issued before it (Engine.run keeps the order), instead of going to
    the worker thread and back. Returns the sender's rank (for a receive)."""
    world = op.group.world
    outcome = _Outcome()
    world.engine.run(lambda: run_batch(world, [(op, outcome)]))
    return outcome.src_rank


def isend(
    tensor: Any,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Work | None:
    """Send `tensor` to global rank `dst`; returns a Work to wait on."""
    op = _make_op(True, tensor, dst, group, tag, group_dst)
    if op is None:
        return None
    return _submit(op, f"isend(to {op.peer}, tag {tag})")


def irecv(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Work | None:
    """Receive into `tensor` from global rank `src` (any rank of the group if None)."""
    op = _make_op(False, tensor, src, group, tag, group_src)
    if op is None:
        return None
    return _submit(op, f"irecv(from {op.peer}, tag {tag})")


def send(
    tensor: Any,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    op = _make_op(True, tensor, dst, group, tag, group_dst)
    if op is None:
        return
    if op.group.world.engine.has_deferred_p2p():
        # batched with the isend/irecv issued before it (so irecv-then-send cannot deadlock)
        _submit(op, f"send(to {op.peer}, tag {tag})").wait()
    else:
        _run_now(op)


def recv(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receive into `tensor`; returns the global rank of the sender (-1 if not a member)."""
    op = _make_op(False, tensor, src, group, tag, group_src)
    if op is None:
        return -1
    if op.group.world.engine.has_deferred_p2p():
        work = _submit(op, f"recv(from {op.peer}, tag {tag})")
        work.wait()
        return work.src_rank
    return _run_now(op)


class P2POp:
    """One operation of batch_isend_irecv: P2POp(isend or irecv, tensor, peer, group, tag)."""

    def __init__(
        self,
        op: Callable[..., Any],
        tensor: Any,
        peer: int | None = None,
        group: ProcessGroup | None = None,
        tag: int = 0,
        group_peer: int | None = None,
    ):
        if op not in (isend, irecv):
            name = getattr(op, "__name__", "")
            if name not in ("isend", "irecv"):
                raise UsageError("P2POp's op must be pycollective.isend or pycollective.irecv")
            op = isend if name == "isend" else irecv
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every operation of the list at once; returns their Works."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise UsageError("batch_isend_irecv needs a non-empty list of P2POp")
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            w = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            w = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        if w is not None:
            works.append(w)
    if works:
        _state.resolve_group(p2p_op_list[0].group).world.engine.flush_p2p()
    return works


def monitored_barrier(
    group: ProcessGroup | None = None, timeout: Any = None, wait_all_ranks: bool = False
) -> None:
    """A barrier that names the ranks that did not arrive: rank 0 of the group hears from
    every other rank within `timeout`, then releases them."""
    g = _state.resolve_group(group)
    if not g.is_member or g.size() == 1:
        return
    seconds = _state._timeout_seconds(timeout) if timeout is not None else g.timeout
    world = g.world
    token = np.zeros(1, dtype=np.uint8)
    buf = as_buffer(token, "token")

    def message(peer: int, is_send: bool) -> tuple[OutMessage | None, InMessage | None]:
        header = _header(_Op(is_send, g, peer, buf, _MONITORED_BARRIER_TAG), 1)
        if is_send:
            return OutMessage(peer, header, memoryview(token)), None
        return None, InMessage(peer, header, memoryview(np.zeros(1, np.uint8)))

    entry = world.flight.record(  # type: ignore[union-attr]
        g.group_id, g.group_name, -1, "monitored_barrier", 0, None, "p2p", root=0
    )

    def job() -> None:
        entry.start()
        transport = world.transport
        deadline = time.monotonic() + seconds
        if g.rank() == 0:
            others = list(g.ranks[1:])
            recvs = [message(p, False)[1] for p in others]
            try:
                transport.exchange([], recvs, deadline, g.group_id, "monitored_barrier")
            except CollectiveTimeout:
                missing = [p for p, m in zip(others, recvs, strict=True) if not m.done]
                shown = missing if wait_all_ranks else missing[:1]
                exc = CollectiveTimeout(
                    f"monitored_barrier: rank(s) {shown} did not arrive within {seconds:g} s",
                    op="monitored_barrier",
                    waiting_on=missing,
                )
                g.fail(exc)  # release the ranks that did arrive with the same news
                entry.failed(exc)
                world.flight.dump(str(exc))  # type: ignore[union-attr]
                raise exc from None
            transport.exchange(
                [message(p, True)[0] for p in others],
                [],
                deadline,
                g.group_id,
                "monitored_barrier release",
            )
        else:
            root = g.ranks[0]
            # Wait a little past the root's deadline: at its timeout the root tells us who
            # did not arrive, which is better news than our own "rank 0 never answered".
            transport.exchange(
                [message(root, True)[0]],
                [message(root, False)[1]],
                deadline + min(seconds, _MONITORED_GRACE),
                g.group_id,
                "monitored_barrier",
            )
        entry.end()

    world.engine.run(job)
