"""The worker side: push gradients to the servers, pull the parameters back."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._buffers import as_buffer
from .._dtypes import BY_NAME
from .._errors import UsageError
from ..api import groups as _state
from ..api import p2p as _p2p
from ..core.group import ProcessGroup
from ..core.world import count_traffic
from ..transport import counting as _traffic
from ._protocol import MODES, PULL_TAG, PUSH_TAG, STEP, STOP
from ._roles import Roles
from ._setup import send_setup
from ._sharding import shard_bounds


class Client:
    """A worker's connection to the parameter servers.

    `params` are the model's parameters (float32 numpy arrays or CPU torch tensors,
    contiguous); they are overwritten in place with worker 0's initial values at
    construction and with the servers' values after every `step`. `optimizer` is the
    servers' optimizer, e.g. {"name": "sgd", "lr": 0.1, "momentum": 0.9}.
    """

    def __init__(
        self,
        roles: Roles,
        params: Sequence[Any],
        optimizer: dict[str, Any],
        mode: str = "sync",
        group: ProcessGroup | None = None,
    ) -> None:
        if not roles.is_worker:
            raise UsageError(f"rank {roles.rank} is a server; call serve() there")
        if mode not in MODES:
            raise UsageError(f"mode must be one of {MODES}, got {mode!r}")
        self.roles, self.mode, self._group = roles, mode, group
        self._params = [as_buffer(p, f"params[{i}]") for i, p in enumerate(params)]
        for i, b in enumerate(self._params):
            if b.dtype is not BY_NAME["float32"]:
                raise UsageError(f"params[{i}] is {b.dtype.name}; the servers hold float32")
        self.total = sum(b.count for b in self._params)
        self._flat = (
            np.concatenate([b.array for b in self._params])
            if self._params
            else (np.empty(0, np.float32))
        )
        self._bounds = shard_bounds(self.total, roles.num_servers)
        # One outgoing buffer per server: [command, gradient slice].
        self._out = [np.empty(b - a + 1, dtype=np.float32) for a, b in self._bounds]
        spec = {"total": self.total, "optimizer": dict(optimizer), "mode": mode}
        send_setup(roles, group, spec, self._flat)
        self._scatter_params()
        world = _state.resolve_group(group).world
        self._traffic = count_traffic(world)
        self.steps = 0
        self.comm_seconds = 0.0
        self._closed = False

    def step(self, grads: Sequence[Any]) -> None:
        """Push `grads` (one per parameter, same shapes) and pull the new parameters."""
        if self._closed:
            raise UsageError("this parameter-server client was closed")
        bufs = [as_buffer(g, f"grads[{i}]", writable=False) for i, g in enumerate(grads)]
        if [b.count for b in bufs] != [b.count for b in self._params]:
            raise UsageError("grads must match params one for one, with the same sizes")
        flat_grad = np.concatenate([b.array for b in bufs]) if bufs else self._flat[:0]
        for out, (a, b) in zip(self._out, self._bounds, strict=True):
            out[0] = STEP
            out[1:] = flat_grad[a:b]
        self._exchange()
        self.steps += 1

    def close(self) -> None:
        """Tell the servers this worker is done; the parameters end as the servers' final ones."""
        if self._closed:
            return
        for out in self._out:
            out[0] = STOP
            out[1:] = 0
        self._exchange()
        self._closed = True

    def traffic(self) -> _traffic.TrafficSnapshot:
        return self._traffic.snapshot() if self._traffic else _traffic.TrafficSnapshot()

    def _exchange(self) -> None:
        start = time.perf_counter()
        works = []
        for s, (out, (a, b)) in enumerate(zip(self._out, self._bounds, strict=True)):
            server = self.roles.server_rank(s)
            works.append(_p2p.isend(out, server, group=self._group, tag=PUSH_TAG))
            works.append(_p2p.irecv(self._flat[a:b], server, group=self._group, tag=PULL_TAG))
        for w in works:
            w.wait()
        self._scatter_params()
        self.comm_seconds += time.perf_counter() - start

    def _scatter_params(self) -> None:
        offset = 0
        for b in self._params:
            b.array[...] = self._flat[offset : offset + b.count]
            offset += b.count


__all__ = ["Client"]
