"""Collectives of Python objects, built on the byte collectives.

Objects are serialized (_serialize.py: pickle, as torch's, unless the job chose the safe
format or authenticates nobody), sizes are exchanged first, and payloads are padded to the
largest so the byte collectives stay uniform. What a peer sends is held to account before
anything is decoded:

* every payload carries a MAC under a key derived from the job's key, over the group, the
  object call's number and the sender, so bytes changed on the way (without TLS, an
  attacker on the path could) or replayed from another call are refused before they are
  unpickled;
* every size a peer announces is checked against PYCOLLECTIVE_MAX_OBJECT_BYTES, and large
  payloads travel in pieces of CHUNK_BYTES, so memory grows as the bytes arrive, not as
  far as a peer claims.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import _config, _serialize
from .._errors import CollectiveError, UsageError
from ..core.group import ProcessGroup
from . import _default as _state
from . import collectives as _api
from . import p2p as _p2p

CHUNK_BYTES = 64 << 20  # per rank and byte collective
MAC_BYTES = 32
_CONTEXT = struct.Struct("<QQqI")  # group id, object call, sender, item


# ---------------------------------------------------------------------- sealing


class _Seal:
    """Seals and opens the payloads of one object call of group `g` (a collective's: the
    group's count of them; or a pair's, `peer` given: their count of them). `internal`:
    a transfer of the library's own (see _serialize.allow_pickle)."""

    def __init__(self, g: ProcessGroup, peer: int | None = None, internal: bool = False) -> None:
        self.g = g
        key = g.world.key
        self.authenticated = key is not None and not key.insecure
        self.key = key.derive(b"object payloads") if key is not None else b""
        if peer is None:
            self.call = g.object_calls
            g.object_calls += 1
        else:  # both ends count the objects between them; no other rank takes part
            self.call = g.object_pairs.get(peer, 0)
            g.object_pairs[peer] = self.call + 1
            self.call |= 1 << 63
        self.internal = internal
        self.limit = int(_config.get("PYCOLLECTIVE_MAX_OBJECT_BYTES"))

    def _pickling(self) -> bool:
        return _serialize.allow_pickle(self.internal, self.authenticated)

    def _mac(self, sender: int, item: int, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self.key, _CONTEXT.pack(self.g.group_id, self.call, sender, item), "sha256")
        mac.update(payload)
        return mac.digest()

    def seal(self, obj: Any, item: int = 0) -> np.ndarray:
        data = _serialize.dumps(obj, self._pickling())
        if len(data) + MAC_BYTES > self.limit:
            raise UsageError(
                f"the object serializes to {len(data)} bytes, over "
                f"PYCOLLECTIVE_MAX_OBJECT_BYTES={self.limit}"
            )
        sealed = data + self._mac(self.g.world.rank, item, data)
        return np.frombuffer(sealed, dtype=np.uint8)

    def open(self, data: bytes | bytearray | memoryview, sender: int, item: int = 0) -> Any:
        view = memoryview(data)
        if view.nbytes < MAC_BYTES:
            self.refuse(f"rank {sender} sent a {view.nbytes}-byte object payload (no MAC)")
        payload, mac = view[:-MAC_BYTES], view[-MAC_BYTES:]
        if not hmac.compare_digest(bytes(mac), self._mac(sender, item, payload)):
            self.refuse(
                f"an object payload from rank {sender} does not carry this job's MAC for this "
                "call: it was changed on the way (an attacker on the path? use TLS: "
                "PYCOLLECTIVE_TLS=1) or comes from another call; nothing of it was decoded"
            )
        return _serialize.loads(bytes(payload), sender, self._pickling())

    def check_size(self, n: int | np.integer[Any], sender: int | str) -> int:
        n = int(n)
        if not 0 <= n <= self.limit:
            self.refuse(
                f"rank {sender} announced a {n}-byte object payload; at most "
                f"PYCOLLECTIVE_MAX_OBJECT_BYTES={self.limit} is accepted"
            )
        return n

    def refuse(self, why: str) -> None:
        exc = CollectiveError(why)
        self.g.fail(exc, self.g._seq)
        raise exc


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


def _pieces(total: int, per: int = CHUNK_BYTES) -> Iterator[tuple[int, int]]:
    for lo in range(0, total, per):
        yield lo, min(total, lo + per)


# ---------------------------------------------------------------------- the collectives


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """Replace `object_list`'s items on every rank with those of rank `src`."""
    _broadcast(object_list, src, group, group_src, internal=False)


def broadcast_internal(
    object_list: list[Any], src: int | None = None, group: ProcessGroup | None = None
) -> None:
    """broadcast_object_list for the library's own transfers (never pickled unless the job
    chose PYCOLLECTIVE_OBJECT_SERIALIZER=pickle)."""
    _broadcast(object_list, src, group, None, internal=True)


def _broadcast(
    object_list: list[Any],
    src: int | None,
    group: ProcessGroup | None,
    group_src: int | None,
    internal: bool,
) -> None:
    g = _state.resolve_group(group)
    if not g.is_member:
        return
    if not isinstance(object_list, list):
        raise UsageError("broadcast_object_list needs a list (its items are replaced in place)")
    root = _root(g, src, group_src, "src")
    seal = _Seal(g, internal=internal)
    sender = g.ranks[root]
    sizes = np.zeros(len(object_list), dtype=np.int64)
    payloads: list[np.ndarray] = []
    if g.rank() == root:
        payloads = _encode(g, lambda: [seal.seal(o, i) for i, o in enumerate(object_list)])
        sizes[:] = [p.size for p in payloads]
    _api.broadcast(sizes, group=g, group_src=root)
    if g.rank() == root:
        data = np.concatenate(payloads) if payloads else np.empty(0, np.uint8)
        for lo, hi in _pieces(data.size):
            _api.broadcast(data[lo:hi], group=g, group_src=root)
        return
    total = seal.check_size(sum([seal.check_size(n, sender) for n in sizes]), sender)
    received = bytearray()
    for lo, hi in _pieces(total):
        piece = np.empty(hi - lo, np.uint8)
        _api.broadcast(piece, group=g, group_src=root)
        received += piece.data
    offset = 0
    for i, n in enumerate(sizes):
        object_list[i] = seal.open(memoryview(received)[offset : offset + int(n)], sender, i)
        offset += int(n)


def _gather_sizes(g: ProcessGroup, n: int, seal: _Seal) -> list[int]:
    sizes = np.zeros(g.size(), dtype=np.int64)
    _api.all_gather_into_tensor(sizes, np.array([n], dtype=np.int64), group=g)
    return [seal.check_size(s, g.ranks[i]) for i, s in enumerate(sizes)]


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
    seal = _Seal(g)
    payload = _encode(g, lambda: seal.seal(obj))
    sizes = _gather_sizes(g, payload.size, seal)
    p, width = g.size(), max(sizes)
    mine = _padded(payload, width)
    received = [bytearray() for _ in range(p)]
    for lo, hi in _pieces(width, max(1, CHUNK_BYTES // p)):
        out = np.empty((p, hi - lo), dtype=np.uint8)
        _api.all_gather_into_tensor(out.reshape(-1), mine[lo:hi], group=g)
        for i in range(p):
            if lo < sizes[i]:
                received[i] += out[i, : sizes[i] - lo].data
    for i in range(p):
        object_list[i] = seal.open(received[i], g.ranks[i])


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
    seal = _Seal(g)
    payload = _encode(g, lambda: seal.seal(obj))
    sizes = _gather_sizes(g, payload.size, seal)
    p, width = g.size(), max(sizes)
    mine = _padded(payload, width)
    at_root = g.rank() == root
    received = [bytearray() for _ in range(p)] if at_root else []
    for lo, hi in _pieces(width, max(1, CHUNK_BYTES // p)):
        slots = [np.empty(hi - lo, dtype=np.uint8) for _ in range(p)] if at_root else None
        _api.gather(mine[lo:hi], slots, group=g, group_dst=root)
        if slots is not None:
            for i in range(p):
                if lo < sizes[i]:
                    received[i] += slots[i][: sizes[i] - lo].data
    if at_root and object_gather_list is not None:
        for i in range(p):
            object_gather_list[i] = seal.open(received[i], g.ranks[i])


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
    seal = _Seal(g)
    sender = g.ranks[root]
    sizes = np.zeros(g.size(), dtype=np.int64)
    pieces: list[np.ndarray] = []
    if g.rank() == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != g.size():
            raise UsageError(f"scatter_object_input_list needs {g.size()} objects on src")
        items = scatter_object_input_list
        # each rank's item is sealed for that rank's slot (item = its group rank)
        pieces = _encode(g, lambda: [seal.seal(o, i) for i, o in enumerate(items)])
        sizes[:] = [piece.size for piece in pieces]
    _api.broadcast(sizes, group=g, group_src=root)
    checked = [seal.check_size(n, sender) for n in sizes]
    width = max(checked)
    me = g.rank()
    padded = [_padded(piece, width) for piece in pieces]
    received = bytearray()
    for lo, hi in _pieces(width):
        mine = np.empty(hi - lo, dtype=np.uint8)
        chunks = [piece[lo:hi] for piece in padded] if g.rank() == root else None
        _api.scatter(mine, chunks, group=g, group_src=root)
        if lo < checked[me]:
            received += mine[: checked[me] - lo].data
    scatter_object_output_list[0] = seal.open(received, sender, me)


def send_object(
    obj: Any, dst: int, group: ProcessGroup | None = None, internal: bool = False
) -> None:
    """Send one object to rank `dst` (global), which calls recv_object: sealed, sized, and
    in pieces of CHUNK_BYTES. `internal`: a transfer of the library's own (pickles only
    with PYCOLLECTIVE_OBJECT_SERIALIZER=pickle)."""
    g = _state.resolve_group(group)
    seal = _Seal(g, dst, internal)
    data = _encode(g, lambda: seal.seal(obj))
    _p2p.send(np.array([data.size], np.int64), dst=dst, group=g)
    for lo, hi in _pieces(data.size):
        _p2p.send(data[lo:hi], dst=dst, group=g)


def recv_object(src: int, group: ProcessGroup | None = None, internal: bool = False) -> Any:
    """The object rank `src` (global) sends with send_object; its size is checked before
    anything is allocated, and memory grows as the pieces arrive."""
    g = _state.resolve_group(group)
    seal = _Seal(g, src, internal)
    length = np.zeros(1, np.int64)
    _p2p.recv(length, src=src, group=g)
    total = seal.check_size(length[0], src)
    received = bytearray()
    for lo, hi in _pieces(total):
        piece = np.empty(hi - lo, np.uint8)
        _p2p.recv(piece, src=src, group=g)
        received += piece.data
    return seal.open(received, src)
