"""Point-to-point: send/recv, isend/irecv, batch_isend_irecv, and monitored_barrier.

isend and irecv only record what to do; the engine runs every recorded operation as one
concurrent exchange when a handle is waited on or another operation is issued (see
_engine). Messages are matched by (group, tag) in the order they were sent, as in torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _config
from .._buffers import as_buffer
from .._errors import UsageError
from ..core import p2p as core_p2p
from ..core.group import ProcessGroup
from ..core.p2p import MAX_TAG
from ..core.work import Work
from ..transport._base import ANY_SOURCE
from . import _default as _state


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


def _submit(op: core_p2p.Op, label: str) -> Work:
    work = Work(label, [op.buf.source])
    return op.group.world.engine.defer_p2p(op, work)


def _make_op(
    is_send: bool,
    tensor: Any,
    peer: int | None,
    group: ProcessGroup | None,
    tag: int,
    group_peer: int | None,
) -> core_p2p.Op | None:
    g = _state.resolve_group(group)
    if not g.is_member:
        return None
    if is_send:
        target = _peer(g, peer, group_peer, "dst", allow_any=False)
        buf = as_buffer(tensor, "send tensor", writable=False)
    else:
        target = _peer(g, peer, group_peer, "src", allow_any=True)
        buf = as_buffer(tensor, "recv tensor")
    return core_p2p.Op(is_send, g, target, buf, _tag(tag))


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
        core_p2p.run_now(op)


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
    return core_p2p.run_now(op)


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
    seconds = _config.timeout_seconds(timeout) if timeout is not None else g.timeout
    core_p2p.monitored_barrier(g, seconds, wait_all_ranks)
