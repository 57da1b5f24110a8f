"""One rank of a multi-host test job (tests/multihost/test_multihost.py).

    python tests/multihost/_job.py [--quick] [--torch]    # topology report, then the battery
    python tests/multihost/_job.py --loop                 # all_reduce until something fails

The topology report is one line, "TOPOLOGY {json}", saying where this rank's bytes went:
the host identity of every rank (all_gather_object), whether the group of the ranks on
this host mapped a shared-memory arena and the world group did not, how many bytes a
4 MiB all_reduce put on TCP in each, and the address of every peer's connection.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))

import battery  # noqa: E402

import pycollective as dist  # noqa: E402
from pycollective._dtypes import BY_NAME  # noqa: E402
from pycollective.core import world as _traffic  # noqa: E402
from pycollective.runners import ArenaRunner
from pycollective.shm import _hostid  # noqa: E402

N = 1 << 20  # float32 elements: 4 MiB


def topology() -> dict:
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    ids: list = [None] * size
    dist.all_gather_object(ids, _hostid.host_id().hex())
    hosts: dict[str, list[int]] = {}
    for r, h in enumerate(ids):
        hosts.setdefault(h, []).append(r)
    # Every rank makes every host's group, in the same order (torch's new_group rule).
    groups = {h: dist.new_group(rs) for h, rs in hosts.items()}
    mine = groups[ids[rank]]
    counter = _traffic.count_traffic(world.world)
    assert counter is not None
    conns = counter.inner._conns  # the TCP transport's sockets, one per peer
    peers = {str(p): c.sock.getpeername()[0] for p, c in conns.items()}

    def tcp_bytes(group, algorithm=None) -> tuple[int, float]:
        x = np.full(N, rank + 1.0, dtype=np.float32)
        before = counter.snapshot()
        dist.all_reduce(x, group=group, algorithm=algorithm)
        sent = (counter.snapshot() - before).bytes_sent
        want = float(sum(r + 1 for r in group.ranks))
        return sent, float(x[0]) if np.all(x == want) else -1.0

    local_bytes, local_sum = tcp_bytes(mine)
    world_bytes, world_sum = tcp_bytes(world, "ring")  # ring: each sends 2(p-1)/p n
    report = {
        "rank": rank,
        "size": size,
        "host_ids": ids,
        "local_ranks": list(mine.ranks),
        "local_shm": mine.runner(ArenaRunner) is not None,
        "world_shm": world.runner(ArenaRunner) is not None,
        "local_tcp_bytes": local_bytes,
        "world_tcp_bytes": world_bytes,
        "local_sum": local_sum,
        "world_sum": world_sum,
        "payload_bytes": N * 4,
        "peer_addrs": peers,
        "local_auto": mine.choose_algorithm("all_reduce", None, N, BY_NAME["float32"], 0),
    }
    return report


def loop() -> int:
    """all_reduce until a peer fails; print what this rank saw and how long it took."""
    dist.init_process_group()
    rank = dist.get_rank()
    x = np.ones(1 << 16, dtype=np.float32)
    dist.all_reduce(x)
    print(f"rank {rank} pid {os.getpid()} looping", flush=True)
    seen = time.monotonic()
    try:
        while True:
            dist.all_reduce(x, algorithm="ring")
            seen = time.monotonic()
    except dist.CollectiveError as exc:
        waited = time.monotonic() - seen
        print(f"rank {rank} raised {type(exc).__name__} after {waited:.2f} s: {exc}", flush=True)
        return 1


def main() -> int:
    if "--loop" in sys.argv:
        return loop()
    dist.init_process_group()
    # One write: launchers that merge the ranks' output (mpirun) cannot split the line.
    os.write(1, ("TOPOLOGY " + json.dumps(topology()) + "\n").encode())
    battery.run_checks()
    rank = dist.get_rank()
    dist.destroy_process_group()
    return battery.report(rank)


if __name__ == "__main__":
    sys.exit(main())
