"""Collectives of picklable Python objects, built on the tensor collectives.

Objects are serialized to bytes (pickle, or the pickle-free format of _serialize.py when
PYCOLLECTIVE_OBJECT_SERIALIZER=safe), sizes are exchanged first, and payloads are padded
to the largest so the byte collectives stay uniform. Only authenticated peers can send
these bytes (every connection passed the shared-secret handshake), but unpickling still
runs their code: with pickle, use object collectives only within a job you trust.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _serialize
from .._errors import CollectiveError, UsageError
from ..core.group import ProcessGroup
from . import _default as _state
from . import collectives as _api


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(_serialize.dumps(obj), dtype=np.uint8)


def _loads(data: np.ndarray, sender: int | None = None) -> Any:
    return _serialize.loads(data.tobytes(), sender)


def _encode(g: ProcessGroup, fn: Callable[[], Any]) -> Any:
    """Serialize on this rank; if that fails, tell the group before raising, so ranks
    already waiting for our bytes fail at once instead of at their timeout."""
    try:
        return fn()
    except Exception as exc:
        g.fail(
            CollectiveError(f"rank {g.world.rank} could not serialize its object: {exc}"),
            g._seq,
        )
        if isinstance(exc, CollectiveError):
            raise
        raise UsageError(f"cannot serialize the object: {exc}") from exc


def _root(g: ProcessGroup, rank: int | None, group_rank: int | None, what: str) -> int:
    return _api._root(g, rank, group_rank, what)


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """Replace `object_list`'s items on every rank with those of rank `src`."""
    g = _state.resolve_group(group)
    if not g.is_member:
        return
    if not isinstance(object_list, list):
        raise UsageError("broadcast_object_list needs a list (its items are replaced in place)")
    root = _root(g, src, group_src, "src")
    sizes = np.zeros(len(object_list), dtype=np.int64)
    payloads: list[np.ndarray] = []
    if g.rank() == root:
        payloads = _encode(g, lambda: [_dumps(o) for o in object_list])
        sizes[:] = [p.size for p in payloads]
    _api.broadcast(sizes, group=g, group_src=root)
    data = np.concatenate(payloads) if payloads else np.empty(int(sizes.sum()), dtype=np.uint8)
    _api.broadcast(data, group=g, group_src=root)
    if g.rank() != root:
        offset = 0
        for i, n in enumerate(sizes):
            object_list[i] = _loads(data[offset : offset + n], g.ranks[root])
            offset += int(n)


def _gather_sizes(g: ProcessGroup, n: int) -> np.ndarray:
    sizes = np.zeros(g.size(), dtype=np.int64)
    _api.all_gather_into_tensor(sizes, np.array([n], dtype=np.int64), group=g)
    return sizes


def _padded(payload: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(width, dtype=np.uint8)
    out[: payload.size] = payload
    return out


def all_gather_object(object_list: list[Any], obj: Any, group: ProcessGroup | None = None) -> None:
    """Fill `object_list[i]` with rank i's `obj`, on every rank."""
    g = _state.resolve_group(group)
    if not g.is_member:
        return
    if not isinstance(object_list, list) or len(object_list) != g.size():
        raise UsageError(f"all_gather_object needs a list of {g.size()} slots")
    payload = _encode(g, lambda: _dumps(obj))
    sizes = _gather_sizes(g, payload.size)
    width = int(sizes.max())
    out = np.empty(width * g.size(), dtype=np.uint8)
    _api.all_gather_into_tensor(out, _padded(payload, width), group=g)
    for i, n in enumerate(sizes):
        object_list[i] = _loads(out[i * width : i * width + n], g.ranks[i])


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    group_dst: int | None = None,
) -> None:
    """Collect every rank's `obj` into `object_gather_list` on rank `dst`."""
    g = _state.resolve_group(group)
    if not g.is_member:
        return
    root = _root(g, dst, group_dst, "dst")
    if g.rank() == root and (
        not isinstance(object_gather_list, list) or len(object_gather_list) != g.size()
    ):
        raise UsageError(f"gather_object needs object_gather_list of {g.size()} slots on dst")
    payload = _encode(g, lambda: _dumps(obj))
    sizes = _gather_sizes(g, payload.size)
    width = int(sizes.max())
    slots = [np.empty(width, dtype=np.uint8) for _ in range(g.size())] if g.rank() == root else None
    _api.gather(_padded(payload, width), slots, group=g, group_dst=root)
    if slots is not None and object_gather_list is not None:
        for i, n in enumerate(sizes):
            object_gather_list[i] = _loads(slots[i][:n], g.ranks[i])


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Sequence[Any] | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    group_src: int | None = None,
) -> None:
    """Rank i receives `scatter_object_input_list[i]` of rank `src` in output list[0]."""
    g = _state.resolve_group(group)
    if not g.is_member:
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise UsageError("scatter_object_list needs an output list with at least one slot")
    root = _root(g, src, group_src, "src")
    width = np.zeros(1, dtype=np.int64)
    pieces = None
    if g.rank() == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != g.size():
            raise UsageError(f"scatter_object_input_list needs {g.size()} objects on src")
        items = scatter_object_input_list
        payloads = _encode(g, lambda: [_dumps(o) for o in items])
        width[0] = max(p.size for p in payloads) + 8
        pieces = []
        for p in payloads:
            framed = np.zeros(int(width[0]), dtype=np.uint8)
            framed[:8] = np.frombuffer(np.int64(p.size).tobytes(), dtype=np.uint8)
            framed[8 : 8 + p.size] = p
            pieces.append(framed)
    _api.broadcast(width, group=g, group_src=root)
    mine = np.empty(int(width[0]), dtype=np.uint8)
    _api.scatter(mine, pieces, group=g, group_src=root)
    n = int(mine[:8].view(np.int64)[0])
    if not 0 <= n <= mine.size - 8:
        raise CollectiveError(f"rank {g.ranks[root]} sent a malformed object frame")
    scatter_object_output_list[0] = _loads(mine[8 : 8 + n], g.ranks[root])
