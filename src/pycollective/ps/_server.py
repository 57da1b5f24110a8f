"""The server side: own a slice of the parameters, apply the workers' gradients to it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .._errors import UsageError
from ..api import p2p as _p2p
from ..core.group import ProcessGroup
from ._optim import make_optimizer
from ._protocol import PULL_TAG, PUSH_TAG, STOP
from ._roles import Roles
from ._setup import receive_setup


@dataclass
class ServerStats:
    updates: int = 0
    pushes: int = 0
    seconds: float = 0.0


def serve(roles: Roles, group: ProcessGroup | None = None) -> ServerStats:
    """Run this server until every worker has stopped; return what it did."""
    if not roles.is_server:
        raise UsageError(f"rank {roles.rank} is a worker, not a server")
    spec, params = receive_setup(roles, group)
    optimizer = make_optimizer(spec["optimizer"])
    start = time.perf_counter()
    if spec["mode"] == "sync":
        stats = _serve_sync(roles, group, params, optimizer)
    else:
        stats = _serve_async(roles, group, params, optimizer)
    stats.seconds = time.perf_counter() - start
    return stats


def _serve_sync(roles: Roles, group, params: np.ndarray, optimizer) -> ServerStats:
    """Each round: one push from every worker, their mean applied once, then every
    worker pulls the same parameters (so all workers stay bitwise identical)."""
    stats = ServerStats()
    workers = list(roles.worker_ranks)
    inbox = np.empty((len(workers), params.size + 1), dtype=np.float32)
    while True:
        recvs = [_p2p.irecv(inbox[i], w, group=group, tag=PUSH_TAG) for i, w in enumerate(workers)]
        for work in recvs:
            work.wait()
        stats.pushes += len(workers)
        commands = inbox[:, 0]
        stopping = commands == STOP
        if stopping.any() and not stopping.all():
            raise UsageError(
                "synchronous parameter server: workers "
                f"{[w for w, s in zip(workers, stopping, strict=True) if s]} stopped while "
                f"others pushed a step; every worker must run the same number of steps"
            )
        if not stopping.all():
            grad = inbox[0, 1:].copy()
            for i in range(1, len(workers)):
                grad += inbox[i, 1:]
            grad /= np.float32(len(workers))
            optimizer.step(params, grad)
            stats.updates += 1
        sends = [_p2p.isend(params, w, group=group, tag=PULL_TAG) for w in workers]
        for work in sends:
            work.wait()
        if stopping.all():
            return stats


def _serve_async(roles: Roles, group, params: np.ndarray, optimizer) -> ServerStats:
    """Each push is applied as it arrives and answered with the parameters as they are
    then: workers never wait for each other, and may compute on stale parameters."""
    stats = ServerStats()
    inbox = np.empty(params.size + 1, dtype=np.float32)
    active = set(roles.worker_ranks)
    while active:
        work = _p2p.irecv(inbox, None, group=group, tag=PUSH_TAG)
        work.wait()
        source = work.src_rank
        stats.pushes += 1
        if inbox[0] == STOP:
            active.discard(source)
        else:
            optimizer.step(params, inbox[1:])
            stats.updates += 1
        _p2p.isend(params, source, group=group, tag=PULL_TAG).wait()
    return stats
