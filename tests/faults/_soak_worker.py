"""One rank of a soak job: many small and some large all_reduces, with resident memory,
open file descriptors and threads measured after a warm-up and at the end.

    _soak_worker.py SMALL LARGE       prints `SOAK {json}` from every rank
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

import numpy as np

import pycollective as dist

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])
LARGE = 1 << 20  # elements (4 MiB of float32)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def sample() -> dict:
    return {"rss": rss(), "fds": fds(), "threads": threading.active_count()}


X = np.ones(16, np.float32)
Y = np.ones(LARGE, np.float32)  # one buffer for the whole run: the job's own memory is fixed


def run(small: int, large: int) -> float:
    x, y = X, Y
    every = max(1, small // max(1, large))
    t0 = time.perf_counter()
    for i in range(small):
        x[:] = 1
        dist.all_reduce(x)
        if x[0] != P:
            raise SystemExit(f"rank {RANK}: wrong small result {x[0]}")
        if large and i % every == 0:
            y[:] = 1
            dist.all_reduce(y)
            if y[-1] != P:
                raise SystemExit(f"rank {RANK}: wrong large result {y[-1]}")
            large -= 1
    for _ in range(large):
        dist.all_reduce(y)
    return time.perf_counter() - t0


def main() -> None:
    small, large = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group()
    # Warm-up: scratch pools, schedule caches and the allocator's arenas reach their size.
    run(max(500, small // 10), max(5, large // 10))
    before = sample()
    seconds = run(small // 2, large // 2)
    middle = sample()
    seconds += run(small - small // 2, large - large // 2)
    dist.barrier()
    after = sample()
    dist.destroy_process_group()
    print(
        "SOAK "
        + json.dumps(
            {
                "rank": RANK,
                "small": small,
                "large": large,
                "seconds": seconds,
                "before": before,
                "middle": middle,
                "after": after,
                "rss_growth_pct": 100.0 * (after["rss"] - before["rss"]) / before["rss"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
