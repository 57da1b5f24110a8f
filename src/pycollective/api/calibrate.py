"""`calibrate()`: measure the cost model's parameters with the ranks of a running job (every
member calls it), through the public collectives so Python's share is in; the fit is
tuning/calibrate.py's and the command that starts ranks to do it is cli/calibrate.py."""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .._errors import UsageError
from .._reduce_ops import ReduceOp
from ..schedule import ALGORITHMS
from ..tuning import cache as _costcache
from ..tuning import fit as _costfit
from ..tuning import params as _tuning
from ..tuning.calibrate import CPU_SIDE, ITEMSIZE, fit_samples, measure_gamma
from . import collectives
from ._default import resolve_group


def _timed(
    dist: Any, group: Any, root: int, fns: dict[str, Callable[[], object]], reps: int, budget: float
) -> dict[str, float]:
    """Median seconds per call of each variant (slowest rank), taking turns; stops together
    once `budget` seconds are spent (after at least 3 rounds of turns)."""
    for fn in fns.values():
        fn()  # builds the schedule, warms the buffers
    local: dict[str, list[float]] = {k: [] for k in fns}
    flag = np.zeros(1, np.int32)
    start = time.perf_counter()
    for i in range(reps):
        for name, fn in fns.items():
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            local[name].append(time.perf_counter() - t0)
        if i >= 2 and i + 1 < reps:
            flag[0] = time.perf_counter() - start > budget
            dist.broadcast(flag, src=root, group=group)
            if flag[0]:
                break
    times = np.array([local[k] for k in fns], np.float64)
    dist.all_reduce(times, op=ReduceOp.MAX, group=group)
    # The lower quartile: a busy machine only ever adds time, and the model is of calls
    # that are not held up by anything else.
    return {k: float(np.percentile(row, 25)) for k, row in zip(fns, times, strict=True)}


def _samples(
    dist: Any, group: Any, root: int, p: int, k: float, oversubscribed: bool, budget: float
) -> list[_costfit.Sample]:
    out: list[_costfit.Sample] = []
    algos = ALGORITHMS["all_reduce"]

    def add(coll: str, count: int, times: dict[str, float], segment: int = 0) -> None:
        for algo, t in times.items():
            out.append(_costfit.Sample(coll, algo, p, count, ITEMSIZE, t, k, segment, p))

    counts = [p] + ([16384 * p, 262144] if oversubscribed else [])
    for count in counts:
        buf = np.zeros(count, np.float32)  # zeros: repeated sums stay finite
        fns: dict[str, Callable[[], object]] = {
            a: functools.partial(dist.all_reduce, buf, group=group, algorithm=a) for a in algos
        }
        add("all_reduce", count, _timed(dist, group, root, fns, 30, budget / len(counts)))
    if not oversubscribed:
        segment = _tuning.CHAIN_SEGMENT_BYTES // ITEMSIZE
        for count in (262144, 2097152):
            buf = np.zeros(count, np.float32)
            fns = {
                "tree": functools.partial(
                    dist.broadcast, buf, src=root, group=group, algorithm="tree"
                )
            }
            add("broadcast", count, _timed(dist, group, root, fns, 7, budget / 4), segment)
    return out


def calibrate(
    group: Any = None,
    transport: str = "tcp",
    save: bool = True,
    budget: float = 2.0,
    force: bool = False,
    load: float | None = None,
) -> dict[str, Any]:
    """Measure the cost parameters with the ranks of `group` (every member calls this).

    Returns {"params": {...}, "measured": [...], "world_size", "ranks_per_core", "cache"}.
    With a group of every rank, all then price `auto` with the new parameters; with
    `save`, rank 0 writes them to this host's cache (_costcache.py; never fails the job),
    unless the machine was busy (load average above the cores; `load` if given, else
    now) and not `force`.
    """
    dist = collectives
    g = resolve_group(group)
    p, rank = g.size(), g.rank()
    if p < 2:
        raise UsageError(f"calibration needs a group of 2 ranks or more, this one has {p}")
    root = g.ranks[0]
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    base = g.world.tuning.group_params(transport, p)
    k = base.ranks_per_core
    over = base.oversubscribed
    # gamma only with a core per rank: sharing cores, np.add would be timed with waits
    start = base if over else replace(base, gamma=measure_gamma())
    samples = _samples(dist, group, root, p, k, over, budget)
    fitted = fit_samples(samples, start, p, over)
    # Every rank takes rank 0's numbers, so that all choose alike.
    names = _costfit.NAMES
    vec = np.array([getattr(fitted, n) for n in names], np.float64)
    dist.broadcast(vec, src=root, group=group)
    fitted = replace(fitted, **{n: float(v) for n, v in zip(names, vec, strict=True)})
    host = replace(fitted, ranks_per_core=1.0)
    if p == g.world.size:
        # A group of every rank: all of them price with the new numbers from now on (a
        # subgroup's must not: the other ranks would then choose differently).
        tuning = g.world.tuning
        job = tuning.job or _tuning.local_job_cost(p)
        tuning.adopt(replace(job, params={**job.params, transport: host}))
    path, note = None, ""
    busy = load > _tuning.cores() and not force
    if save and rank == 0 and busy:
        note = (
            f"not cached: the load average was {load:.1f} on {_tuning.cores()} cores when "
            "calibration began, so the times are inflated (force=True to cache anyway)"
        )
        warnings.warn(f"pycollective calibrate: {note}", stacklevel=2)
    elif save and rank == 0:
        path = _costcache.save(transport, host, {"world_size": p, "load": load})
        _tuning.host_params.cache_clear()
    return {
        "load": load,
        "note": note,
        "params": _costcache.as_dict(host),
        "fitted": list(CPU_SIDE if over else ("alpha", "beta", "gamma"))
        + (["overhead"] if p > 2 and not over else []),
        "world_size": p,
        "ranks_per_core": k,
        "cache": str(path) if path else None,
        "measured": [
            {
                "collective": s.collective,
                "algorithm": s.algorithm,
                "count": s.count,
                "seconds": s.seconds,
                "model": _costfit.predicted(s, replace(fitted, ranks_per_core=k)),
            }
            for s in samples
        ],
    }
