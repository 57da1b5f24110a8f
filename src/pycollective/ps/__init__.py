"""The parameter-server pattern: S server processes each own a slice of the parameters;
workers push gradients to them and pull parameters back every step.

    from pycollective import ps

    roles = ps.init()                      # joins the job; the last S ranks are servers
    if roles.is_server:
        ps.serve(roles)                    # until every worker has closed
    else:
        client = ps.Client(roles, model.parameters(), {"name": "sgd", "lr": 0.1})
        for x, y in my_shard:
            loss_fn(model(x), y).backward()
            client.step([p.grad for p in model.parameters()])   # push, then pull
        client.close()
    ps.shutdown()

Start it with `pycollective run -n W --servers S script.py`. `mode="sync"` (default)
averages one gradient from every worker per update, so all workers hold the same
parameters, bit for bit; `mode="async"` applies each push as it comes.
"""

from __future__ import annotations

from typing import Any

from ..api import groups as _state
from ._client import Client
from ._optim import SGD, Adam, make_optimizer
from ._roles import Roles, roles
from ._server import ServerStats, serve
from ._sharding import shard_bounds


def init(num_servers: int | None = None, timeout: Any = None) -> Roles:
    """Join the job (pycollective's default group) and say who this process is."""
    if not _state.is_initialized():
        _state.init_process_group(timeout=timeout)
    return roles(_state.get_rank(), _state.get_world_size(), num_servers)


def shutdown() -> None:
    _state.destroy_process_group()


__all__ = [
    "SGD",
    "Adam",
    "Client",
    "Roles",
    "ServerStats",
    "init",
    "make_optimizer",
    "roles",
    "serve",
    "shard_bounds",
    "shutdown",
]
