"""One rank of tests/api/test_init_methods.py: joins by the method named in argv, runs an
all_reduce and a broadcast, and prints the result."""

from __future__ import annotations

import datetime
import sys

import numpy as np

import pycollective as dist


def main() -> None:
    method, rank, world, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if method == "tcp":
        dist.init_process_group("gloo", init_method=f"tcp://{where}", rank=rank, world_size=world)
    elif method == "file":
        dist.init_process_group(init_method=f"file://{where}", rank=rank, world_size=world)
    elif method == "store":
        host, port = where.rsplit(":", 1)
        store = dist.TCPStore(
            host, int(port), world, rank == 0, timeout=datetime.timedelta(seconds=30)
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
        )
    else:
        raise SystemExit(f"unknown method {method}")
    x = np.full(3, rank + 1, dtype=np.int64)
    dist.all_reduce(x)
    y = np.array([rank], dtype=np.int32)
    dist.broadcast(y, src=world - 1)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum={x.tolist()} bcast={y.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
