"""Who is a worker and who is a server in a parameter-server job.

The last S ranks of the world are servers, the first W = world - S are workers. S comes
from `num_servers` or PYCOLLECTIVE_NUM_SERVERS (which `pycollective run --servers S` sets).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _config
from .._errors import UsageError


@dataclass(frozen=True)
class Roles:
    rank: int
    world_size: int
    num_servers: int

    @property
    def num_workers(self) -> int:
        return self.world_size - self.num_servers

    @property
    def is_server(self) -> bool:
        return self.rank >= self.num_workers

    @property
    def is_worker(self) -> bool:
        return not self.is_server

    @property
    def worker_index(self) -> int:
        """0..W-1 for a worker (its data shard), -1 for a server."""
        return self.rank if self.is_worker else -1

    @property
    def server_index(self) -> int:
        return self.rank - self.num_workers if self.is_server else -1

    def server_rank(self, index: int) -> int:
        return self.num_workers + index

    @property
    def worker_ranks(self) -> range:
        return range(self.num_workers)


def roles(rank: int, world_size: int, num_servers: int | None = None) -> Roles:
    if num_servers is None:
        num_servers = _config.get("PYCOLLECTIVE_NUM_SERVERS")
        if num_servers is None:
            num_servers = 1
    if not 1 <= num_servers < world_size:
        raise UsageError(
            f"a parameter-server job needs 1 <= servers < world size; got {num_servers} "
            f"servers in a world of {world_size} (start it with `pycollective run -n W "
            "--servers S`)"
        )
    return Roles(rank, world_size, num_servers)
