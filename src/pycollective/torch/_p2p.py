"""The torch backend's point-to-point calls (send, recv, recv from any source) and the
monitored barrier built on point-to-point, with gloo's messages for the ranks that did
not arrive. The group's methods (torch/_backend.py) call these inside `torch_call`."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as tdist

from .._errors import CollectiveError, CollectiveTimeout
from ..api import p2p as _api_p2p
from ._forms import one, tensors_of
from ._group import BackendGroup
from ._views import Staged


def monitored_barrier(pg: BackendGroup, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not arrive, with gloo's messages.

    torch's `dist.monitored_barrier` refuses every backend not named "gloo" before it
    reaches one; call this on the group object instead (or pycollective's own
    `monitored_barrier`)."""
    if timeout is None:
        seconds = pg._pg.timeout
    else:
        given = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if float(given) <= 0 and pg.rank() == 0:
            # gloo: rank 0 spends its budget before waiting on anyone
            raise RuntimeError("Rank 0 timed out in monitoredBarrier after 0 ms")
        seconds = max(float(given), 1e-3)
    try:
        _api_p2p.monitored_barrier(pg._pg, seconds, wait_all_ranks)
    except CollectiveTimeout as exc:
        ms = int(round((seconds or 0) * 1000))
        if pg.rank() == 0 and exc.waiting_on:
            missing = sorted(int(r) for r in exc.waiting_on)
            if wait_all_ranks:
                who = f"Ranks {', '.join(map(str, missing))}"
            else:
                who = f"Rank {missing[0]}"
            raise RuntimeError(f"{who} failed to pass monitoredBarrier in {ms} ms ({exc})") from exc
        if pg.rank() == 0:
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier: {exc}") from exc
        raise RuntimeError(
            f"Rank {pg.rank()} successfully reached monitoredBarrier, but received "
            f"errors while waiting for send/recv from rank 0: {exc}"
        ) from exc
    except CollectiveError as exc:
        if pg.rank() == 0:
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier: {exc}") from exc
        raise RuntimeError(
            f"Rank {pg.rank()} successfully reached monitoredBarrier, but received "
            f"errors while waiting for send/recv from rank 0: {exc}"
        ) from exc


def send(pg: BackendGroup, tensors: Any, dst: int, tag: int = 0) -> tdist.Work:
    t = Staged().inp(one(tensors_of(tensors, "send"), "send"), "send tensor")
    work = _api_p2p.isend(t, group=pg._pg, tag=tag, group_dst=dst)
    return pg._work([work], None, tensors)


def recv(pg: BackendGroup, tensors: Any, src: int, tag: int = 0) -> tdist.Work:
    staged = Staged()
    t = staged.out(one(tensors_of(tensors, "recv"), "recv"), "recv tensor")
    work = _api_p2p.irecv(t, group=pg._pg, tag=tag, group_src=src)
    return pg._work([work], staged.finish(), tensors)


def recv_anysource(pg: BackendGroup, tensors: Any, tag: int = 0) -> tdist.Work:
    staged = Staged()
    t = staged.out(one(tensors_of(tensors, "recv"), "recv"), "recv tensor")
    work = _api_p2p.irecv(t, None, group=pg._pg, tag=tag)
    return pg._work([work], staged.finish(), tensors)
