"""Point-to-point execution: a batch of sends and receives run as one exchange over the
transport (on the engine's thread), and monitored_barrier's exchange. The API's checks
are in api/p2p.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import _config
from .._buffers import Buffer, as_buffer
from .._errors import CollectiveError, CollectiveTimeout, UsageError
from ..transport import _wire
from ..transport._base import InMessage, OutMessage
from ..transport._wire import Header
from .group import ProcessGroup
from .work import Work
from .world import World

# (*) numpy's stubs give ndarray a __buffer__ only for Python 3.12+: memoryview() of an
# array is right at run time on every version, so mypy is told to let it be.

MAX_TAG = (1 << 31) - 1
MONITORED_BARRIER_TAG = MAX_TAG + 1  # outside the user's tag space
_MONITORED_GRACE = 2.0  # seconds non-root ranks wait beyond the timeout for the root's verdict


@dataclass(eq=False)
class Op:
    is_send: bool
    group: ProcessGroup
    peer: int  # global rank, or ANY_SOURCE
    buf: Buffer
    tag: int


def _header(op: Op, nbytes: int) -> Header:
    return Header(
        _wire.P2P,
        _wire.KIND_CODE["send_recv"],
        op.buf.dtype.code,
        0,
        _wire.ALGO_CODE["p2p"],
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


def run_batch(world: World, batch: Sequence[tuple[Op, Work | _Outcome]]) -> None:
    """Run deferred point-to-point operations as one exchange (on the engine's thread)."""
    sends, recvs, receivers = [], [], []
    for op, work in batch:
        op.group.check_usable()
        payload = memoryview(op.buf.array.view(np.uint8))  # type: ignore[arg-type]  # (*)
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
        if isinstance(exc, CollectiveTimeout):
            _config.with_timeout_hint(exc, timeout)
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


def run_now(op: Op) -> int:
    """A blocking send/recv with nothing deferred before it runs on the caller's thread,
    after everything issued before it (Engine.run keeps the order), instead of going to
    the worker thread and back. Returns the sender's rank (for a receive)."""
    world = op.group.world
    outcome = _Outcome()
    world.engine.run(lambda: run_batch(world, [(op, outcome)]))
    return outcome.src_rank


def monitored_barrier(g: ProcessGroup, seconds: float, wait_all_ranks: bool) -> None:
    """A barrier that names the ranks that did not arrive: rank 0 of the group hears from
    every other rank within `seconds`, then releases them."""
    world = g.world
    token = np.zeros(1, dtype=np.uint8)
    buf = as_buffer(token, "token")

    def send_to(peer: int) -> OutMessage:
        header = _header(Op(True, g, peer, buf, MONITORED_BARRIER_TAG), 1)
        return OutMessage(peer, header, memoryview(token))  # type: ignore[arg-type]  # (*)

    def recv_from(peer: int) -> InMessage:
        header = _header(Op(False, g, peer, buf, MONITORED_BARRIER_TAG), 1)
        return InMessage(peer, header, memoryview(np.zeros(1, np.uint8)))  # type: ignore[arg-type]  # (*)

    entry = world.flight.record(  # type: ignore[union-attr]
        g.group_id, g.group_name, -1, "monitored_barrier", 0, None, "p2p", root=0
    )

    def job() -> None:
        entry.start()
        transport = world.transport
        assert transport is not None  # a group with peers has one
        deadline = time.monotonic() + seconds
        if g.rank() == 0:
            others = list(g.ranks[1:])
            recvs = [recv_from(p) for p in others]
            try:
                transport.exchange([], recvs, deadline, g.group_id, "monitored_barrier")
            except CollectiveTimeout:
                missing = [p for p, m in zip(others, recvs, strict=True) if not m.done]
                shown = missing if wait_all_ranks else missing[:1]
                exc = CollectiveTimeout(
                    f"monitored_barrier: rank(s) {shown} did not arrive within {seconds:g} s "
                    "(set timeout= to change it)",
                    op="monitored_barrier",
                    waiting_on=missing,
                )
                g.fail(exc)  # release the ranks that did arrive with the same news
                entry.failed(exc)
                world.flight.dump(str(exc))  # type: ignore[union-attr]
                raise exc from None
            transport.exchange(
                [send_to(p) for p in others],
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
                [send_to(root)],
                [recv_from(root)],
                deadline + min(seconds, _MONITORED_GRACE),
                g.group_id,
                "monitored_barrier",
            )
        entry.end()

    world.engine.run(job)
