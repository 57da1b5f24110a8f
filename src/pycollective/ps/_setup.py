"""The setup collective every rank of a parameter-server job runs first.

Worker 0's spec travels in the pickle-free format (a transfer of the library's own, see
_serialize.allow_pickle) and is checked before it is used; the initial parameters follow in
pieces, of which each server keeps only its slice, so what a server allocates is its
slice and one piece, whatever the spec claims.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from .._errors import CollectiveError, UsageError
from ..api import collectives as _api
from ..api import objects as _objects
from ..core.group import ProcessGroup
from ._protocol import MODES
from ._roles import Roles
from ._sharding import shard_bounds

PIECE_ELEMENTS = 16 << 20  # float32 elements per broadcast of the initial parameters


def send_setup(
    roles: Roles, group: ProcessGroup | None, spec: dict[str, Any], flat: np.ndarray
) -> None:
    """Worker side: worker 0's spec and parameters reach every rank; `flat` is overwritten
    with worker 0's values on the other workers."""
    box = [spec if roles.rank == 0 else None]
    _objects.broadcast_internal(box, src=0, group=group)
    if box[0] != spec:
        raise UsageError(
            f"worker {roles.rank} was set up differently from worker 0: {spec} vs {box[0]}"
        )
    for lo, hi in _pieces(flat.size):
        _api.broadcast(flat[lo:hi], src=0, group=group)


def receive_setup(roles: Roles, group: ProcessGroup | None) -> tuple[dict[str, Any], np.ndarray]:
    """Server side: the spec and this server's slice of the initial parameters."""
    box: list[Any] = [None]
    _objects.broadcast_internal(box, src=0, group=group)
    spec = check_spec(box[0])
    start, stop = shard_bounds(spec["total"], roles.num_servers)[roles.server_index]
    mine = np.empty(stop - start, dtype=np.float32)
    for lo, hi in _pieces(spec["total"]):
        piece = np.empty(hi - lo, dtype=np.float32)
        _api.broadcast(piece, src=0, group=group)
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            mine[a - start : b - start] = piece[a - lo : b - lo]
    return spec, mine


def check_spec(spec: Any) -> dict[str, Any]:
    """Worker 0's spec, checked: what a server allocates and runs depends on it."""
    limit = int(_config.get("PYCOLLECTIVE_MAX_OBJECT_BYTES")) // 4
    if not isinstance(spec, dict) or set(spec) != {"total", "optimizer", "mode"}:
        raise CollectiveError(f"worker 0 sent a malformed parameter-server spec: {spec!r:.200}")
    total = spec["total"]
    if type(total) is not int or not 0 <= total <= limit:
        raise CollectiveError(
            f"worker 0's spec claims {total!r:.40} parameters; a server accepts 0..{limit} "
            "(PYCOLLECTIVE_MAX_OBJECT_BYTES / 4)"
        )
    if spec["mode"] not in MODES or not isinstance(spec["optimizer"], dict):
        raise CollectiveError(f"worker 0 sent a malformed parameter-server spec: {spec!r:.200}")
    return spec


def _pieces(total: int):
    for lo in range(0, total, PIECE_ELEMENTS):
        yield lo, min(total, lo + PIECE_ELEMENTS)
