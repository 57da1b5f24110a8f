"""Shared plumbing of the benchmark scripts (not part of the library).

A benchmark script runs as N ranks. Started by hand (`python benchmarks/x.py -n 4 ...`)
it re-launches itself through `python -m pycollective run -n 4`, so every rank is a real
process talking over the TCP transport on loopback. Under a launcher already (RANK set)
it just runs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np


def under_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def relaunch(script: str, nprocs: int, argv: Sequence[str], timeout: float) -> int:
    """Run `script argv` as `nprocs` ranks with our launcher; return its exit status."""
    cmd = [sys.executable, "-m", "pycollective", "run", "-n", str(nprocs), script, *argv]
    try:
        return subprocess.run(cmd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"benchmark timed out after {timeout:.0f} s", file=sys.stderr)
        return 124


def timed_reps(
    dist,
    fn: Callable[[], object],
    reps: int,
    budget: float,
    warmup: int = 1,
    min_reps: int = 3,
) -> list[float]:
    """Seconds per call of `fn` (a collective every rank calls), one value per rep.

    Each rep starts after a barrier; its time is the largest of the ranks' own times, so
    a rank that waits for a late one is charged the wait. Stops early (every rank
    together) once `budget` seconds have gone by, after at least `min_reps` reps.
    """
    for _ in range(warmup):
        fn()
    local: list[float] = []
    start = time.perf_counter()
    flag = np.zeros(1, dtype=np.int32)
    for i in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        local.append(time.perf_counter() - t0)
        if i + 1 >= min_reps and i + 1 < reps:
            # Agree on stopping: rank 0's clock decides, broadcast with the next barrier.
            flag[0] = 1 if time.perf_counter() - start > budget else 0
            dist.broadcast(flag, src=0)
            if flag[0]:
                break
    times = np.array(local, dtype=np.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def interleaved(
    dist,
    fns: dict[str, Callable[[], object]],
    reps: int,
    budget: float,
    warmup: int = 1,
    min_reps: int = 3,
) -> dict[str, list[float]]:
    """Like timed_reps for several variants at once, taking turns (rep 1 of each, rep 2
    of each, ...) so that a noisy spell on a shared machine hits every variant alike.
    `budget` is for all variants together."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    local: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    flag = np.zeros(1, dtype=np.int32)
    for i in range(reps):
        for name, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            local[name].append(time.perf_counter() - t0)
        if i + 1 >= min_reps and i + 1 < reps:
            flag[0] = 1 if time.perf_counter() - start > budget else 0
            dist.broadcast(flag, src=0)
            if flag[0]:
                break
    out = {}
    for name, ts in local.items():
        arr = np.array(ts, dtype=np.float64)
        dist.all_reduce(arr, op=dist.ReduceOp.MAX)
        out[name] = arr.tolist()
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_time(t: float) -> str:
    if t != t:
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:.0f}us"
    if t < 1:
        return f"{t * 1e3:.2f}ms"
    return f"{t:.2f}s"


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n}B"
