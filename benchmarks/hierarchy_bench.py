"""Hierarchical vs flat all-reduce on fake hosts (PYCOLLECTIVE_HOST_ID), on this machine.

    python benchmarks/hierarchy_bench.py [--hosts aabb] [--sizes 4K,1M,16M] [--reps 15]

Starts one rank per letter of --hosts (equal letters: same host). The algorithms take turns
per repetition; each time is the slowest rank's, after a barrier; prints the median per
size and algorithm, and the bytes each rank sent over TCP per call. On one machine every
"host" link is loopback: what the hierarchy saves here is TCP copies inside a host (the
arena takes them) and rounds; the network effects are what `pycollective simulate` models.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ALGOS = ("ring", "halving_doubling", "hierarchical")


def _rank(sizes: list[int], reps: int) -> None:
    import numpy as np

    import pycollective as dist
    from pycollective.core.world import count_traffic

    dist.init_process_group()
    counter = count_traffic(dist.group.WORLD.world)
    out = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        times: dict[str, list[float]] = {a: [] for a in ALGOS}
        sent: dict[str, int] = {}
        for a in ALGOS:
            dist.all_reduce(x, algorithm=a)  # warm-up
        for _ in range(reps):
            for a in ALGOS:
                dist.barrier()
                before = counter.snapshot().bytes_sent if counter else 0
                t0 = time.perf_counter()
                dist.all_reduce(x, algorithm=a)
                dt = np.array([time.perf_counter() - t0])
                sent[a] = (counter.snapshot().bytes_sent if counter else 0) - before
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, algorithm="ring")
                times[a].append(float(dt[0]))
        out.append(
            {
                "bytes": nbytes,
                "median_s": {a: statistics.median(t) for a, t in times.items()},
                "tcp_bytes_sent_rank": sent,
            }
        )
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", default="aabb")
    ap.add_argument("--sizes", default="4K,1M,16M")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pycollective._units import parse_size as parse_bytes

    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    if args.rank_worker:
        _rank(sizes, args.reps)
        return 0
    from tests._launch import assert_all_ok, run_ranks

    per_rank = {i: {"PYCOLLECTIVE_HOST_ID": h} for i, h in enumerate(args.hosts)}
    res = run_ranks(
        __file__,
        len(args.hosts),
        ("--rank-worker", "--sizes", args.sizes, "--reps", str(args.reps)),
        per_rank_env=per_rank,
        timeout=600,
    )
    assert_all_ok(res)
    rows = json.loads(res[0].stdout.split("RESULT ", 1)[1])
    print(f"hosts {args.hosts}, {args.reps} reps, load {os.getloadavg()[0]:.1f}")
    print(f"{'size':>10}  " + "  ".join(f"{a:>22}" for a in ALGOS))
    for r in rows:
        cells = [
            f"{r['median_s'][a] * 1e3:9.2f} ms {r['tcp_bytes_sent_rank'][a]:>9} B" for a in ALGOS
        ]
        print(f"{r['bytes']:>10}  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
