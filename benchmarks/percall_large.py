"""Large all_reduce with and without the compiled per-call path, taking turns in the same ranks.

    python benchmarks/percall_large.py -n 2 -s 1M,4M,16M --reps 31

Every repetition runs a batch of --calls in-place float32 all_reduces of one size twice:
once as a repeated call (the compiled per-call path, csrc/callpath.c, when the group has
one) and once with `algorithm="shm"` (the Python per-call path, which the compiled one
declines: same runner, same single copy, only the per-call work differs), in alternating
order. Each batch starts after a barrier; its wall time and this thread's CPU time (user
+ system: the calls run on it) per call are taken, and rank 0 prints, per size and mode, the median,
fastest and slowest of the repetitions' slowest-rank times, with the load before and after.
Rank r is pinned to CPU r % cores (as mpirun binds), unless --no-pin.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench import fmt_bytes, relaunch, under_launcher  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20}
MODES = ("compiled", "python")


def parse_size(s: str) -> int:
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def cpu_s() -> float:
    return time.thread_time()  # the scheduler's exact count (getrusage's is in ticks)


def worker(args: argparse.Namespace) -> None:
    import pycollective as dist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not args.no_pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})  # type: ignore[operator]
    dist.init_process_group()
    load0 = os.getloadavg()[0]
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        x = np.ones(nbytes // 4, np.float32)
        calls = {
            "compiled": lambda x=x: dist.all_reduce(x),
            "python": lambda x=x: dist.all_reduce(x, algorithm="shm"),
        }
        for fn in calls.values():  # the first repeated call teaches the compiled path
            for _ in range(3):
                fn()
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for mode in order:
                fn = calls[mode]
                dist.barrier()
                c0, t0 = cpu_s(), time.perf_counter()
                for _ in range(args.calls):
                    fn()
                t1, c1 = time.perf_counter(), cpu_s()
                results.setdefault((nbytes, mode), []).append(
                    ((t1 - t0) / args.calls, (c1 - c0) / args.calls)
                )
    fast = dist.group.WORLD.fast
    # the slowest rank's numbers, repetition by repetition
    mine = np.array([results[k] for k in sorted(results)], np.float64)
    gathered = [np.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        slowest = np.maximum.reduce(gathered)
        load1 = os.getloadavg()[0]
        print(f"p={size}, {args.calls} calls a batch, {args.reps} batches alternating, "
              f"load {load0:.1f} -> {load1:.1f}, compiled path calls (rank 0): "
              f"{fast.calls if fast is not None else None}")  # fmt: skip
        print(f"{'size':>8} {'mode':>9} {'wall median/min/max us':>26} {'cpu median/min us':>20}")
        for (nbytes, mode), rows in zip(sorted(results), slowest, strict=True):
            wall, cpu = rows[:, 0] * 1e6, rows[:, 1] * 1e6
            print(
                f"{fmt_bytes(nbytes):>8} {mode:>9} {statistics.median(wall):9.1f} "
                f"{wall.min():7.1f} {wall.max():8.1f} {statistics.median(cpu):11.1f} "
                f"{cpu.min():7.1f}"
            )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nprocs", type=int, default=2)
    ap.add_argument("-s", "--sizes", default="1M,4M,16M")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--calls", type=int, default=10, help="calls a batch")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if under_launcher():
        worker(args)
        return
    sys.exit(relaunch(__file__, args.nprocs, sys.argv[1:], args.timeout))


if __name__ == "__main__":
    main()
