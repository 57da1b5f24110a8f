"""The sans-IO half of calibration: what the samples measured in a job (api/calibrate.py)
become as cost parameters, and the one local measurement (gamma). `pycollective calibrate`
(cli/calibrate.py) starts the ranks that measure and caches the result per host.

What is measured, in a few seconds, through the public API (so Python's share is in):

* With a core per rank (ranks_per_core 1): gamma, np.add(a, b, out=a) on 16 MiB of
  float32 on each rank at once (rank 0's is kept); alpha (and overhead from 3 ranks on) from
  tiny all_reduce by every algorithm, whose rounds and messages differ; beta from tree
  broadcast of 1 and 8 MiB (one-way messages, as the model charges them).
* With more ranks than cores: the CPU-work side (msg_cpu, byte_cpu, call_cpu) from
  all_reduce by every algorithm at three sizes, the lockstep side held fixed.

Each call is timed as the slowest rank's, after a barrier, variants taking turns (a busy
spell hits all alike); lower quartiles go to _costfit.fit(). Rank 0's result is broadcast, so
every rank holds the same numbers.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..schedule.cost import CostParams
from . import fit as _costfit

ITEMSIZE = 4  # float32
CPU_SIDE = ("msg_cpu", "byte_cpu", "call_cpu")


def measure_gamma(nbytes: int = 16 << 20, reps: int = 7) -> float:
    """Seconds per byte of an in-place float32 sum beyond cache (median of reps)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones(nbytes // 4, np.float32)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / nbytes


def fit_samples(
    samples: list[_costfit.Sample], start: CostParams, p: int, oversubscribed: bool
) -> CostParams:
    """The parameters calibrate() derives from its samples (no I/O; see the module doc).
    A parameter the samples cannot resolve (the fit leaves it at 0) keeps its value in
    `start`."""
    if oversubscribed:
        ar = [s for s in samples if s.collective == "all_reduce"]
        fitted = _costfit.fit(ar, start, CPU_SIDE, work_first=True)[0]
        return _keep_unresolved(fitted, start, CPU_SIDE)
    tiny = [s for s in samples if s.collective == "all_reduce"]
    flat = replace(start, ranks_per_core=1.0)
    free = ("alpha", "overhead") if p > 2 else ("alpha",)
    params = _keep_unresolved(_costfit.fit(tiny, flat, free)[0], flat, free)
    big = [s for s in samples if s.collective == "broadcast"]
    if big:
        params = _keep_unresolved(_costfit.fit(big, params, ("beta",))[0], params, ("beta",))
    return replace(params, ranks_per_core=start.ranks_per_core)


def _keep_unresolved(fitted: CostParams, start: CostParams, names: tuple[str, ...]) -> CostParams:
    keep = {n: getattr(start, n) for n in names if getattr(fitted, n) <= 0}
    return replace(fitted, **keep) if keep else fitted
