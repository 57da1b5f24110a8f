"""One rank of a job that meets at init_method "tcp://host:port" with no MASTER_ADDR, as
Ray Train's init_method="tcp" starts its workers (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE set; tests/multihost/test_multihost.py).

    python tests/multihost/_tcp_job.py torch|pycollective tcp://HOST:PORT

Prints one line, "TCPJOB {json}": the all_reduce's sum and the address of each peer's
connection (the other host's, not loopback).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from pycollective.core import world as _world


def peer_addresses(world) -> dict[str, list]:
    """The address of each peer's connection (taken while every peer is connected), and
    whether the transport takes that peer for one on this host (it must not)."""
    counter = _world.count_traffic(world)
    assert counter is not None
    inner = counter.inner
    return {str(p): [c.sock.getpeername()[0], inner.same_host(p)] for p, c in inner._conns.items()}


def main() -> int:
    which, url = sys.argv[1], sys.argv[2]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if which == "torch":
        import torch.distributed as tdist

        import torch

        tdist.init_process_group("pycollective", init_method=url, rank=rank, world_size=size)
        peers = peer_addresses(tdist.group.WORLD._world)
        x = torch.full((1 << 16,), float(rank + 1))
        tdist.all_reduce(x)
        total = float(x[0]) if bool((x == x[0]).all()) else -1.0
    else:
        import pycollective as dist

        dist.init_process_group(init_method=url, rank=rank, world_size=size)
        peers = peer_addresses(dist.group.WORLD.world)
        y = np.full(1 << 16, rank + 1.0, dtype=np.float32)
        dist.all_reduce(y)
        total = float(y[0]) if bool((y == y[0]).all()) else -1.0
    report = {"rank": rank, "sum": total, "peers": peers}
    os.write(1, ("TCPJOB " + json.dumps(report) + "\n").encode())
    if which == "torch":
        tdist.destroy_process_group()
    else:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
