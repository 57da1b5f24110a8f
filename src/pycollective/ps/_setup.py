"""The setup collective every rank of a parameter-server job runs first."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import UsageError
from ..api import collectives as _api
from ..api import objects as _objects
from ..core.group import ProcessGroup
from ._roles import Roles
from ._sharding import shard_bounds


def send_setup(
    roles: Roles, group: ProcessGroup | None, spec: dict[str, Any], flat: np.ndarray
) -> None:
    """Worker side: worker 0's spec and parameters reach every rank; `flat` is overwritten
    with worker 0's values on the other workers."""
    box = [spec if roles.rank == 0 else None]
    _objects.broadcast_object_list(box, src=0, group=group)
    if box[0] != spec:
        raise UsageError(
            f"worker {roles.rank} was set up differently from worker 0: {spec} vs {box[0]}"
        )
    _api.broadcast(flat, src=0, group=group)


def receive_setup(roles: Roles, group: ProcessGroup | None) -> tuple[dict[str, Any], np.ndarray]:
    """Server side: the spec and this server's slice of the initial parameters."""
    box: list[Any] = [None]
    _objects.broadcast_object_list(box, src=0, group=group)
    spec = box[0]
    flat = np.empty(spec["total"], dtype=np.float32)
    _api.broadcast(flat, src=0, group=group)
    start, stop = shard_bounds(spec["total"], roles.num_servers)[roles.server_index]
    return spec, flat[start:stop].copy()
