"""Fit cost-model parameters to measured call times (no I/O: calibration and the sweep's
--fit both use it).

Each sample is one measured call: what ran (collective, algorithm, ranks, count, element
size), how long it took, and how many ranks shared each core. The model is that of
schedule/cost.py, max(lockstep, CPU work), which is linear in the parameters once the
branch (and each round's busiest rank) is known; so the fit alternates: fix the branches
at the current parameters, solve a non-negative least-squares problem in relative error,
repeat. A constant per group of samples (e.g. per world size) absorbs what every
algorithm pays alike in the lockstep branch, and changes no choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..schedule import cost
from ..schedule.cost import CostParams

NAMES = ("alpha", "beta", "gamma", "overhead", "msg_cpu", "byte_cpu", "call_cpu")


@dataclass(frozen=True)
class Sample:
    collective: str
    algorithm: str
    size: int
    count: int
    itemsize: int
    seconds: float
    ranks_per_core: float = 1.0
    segment: int = 0
    group: int = 0  # samples of one group share a per-call constant


def lockstep_terms(s: Sample, params: CostParams) -> list[float]:
    """(rounds, bytes, bytes reduced, extra messages) the lockstep model charges for a
    sample at these parameters (which rank is busiest in a round depends on them)."""
    prof = cost.profile(s.collective, s.algorithm, s.size, s.count, 0, s.segment)
    tot = [0.0, 0.0, 0.0, 0.0]
    for rnd in prof:
        if not rnd:
            continue
        row = max(rnd, key=lambda r: cost.price(((r,),), s.itemsize, params))
        tot[0] += row[0]
        tot[1] += row[1] * s.itemsize
        tot[2] += row[2] * s.itemsize
        tot[3] += row[3]
    return tot


def _row(s: Sample, params: CostParams, force_work: bool = False) -> tuple[bool, list[float]]:
    """(work branch?, the coefficients of NAMES) for one sample at these parameters (or in
    the work branch whenever oversubscribed, with force_work)."""
    p = replace(params, ranks_per_core=s.ranks_per_core)
    lock = cost.price(
        cost.profile(s.collective, s.algorithm, s.size, s.count, 0, s.segment), s.itemsize, p
    )
    w = cost.work(s.collective, s.algorithm, s.size, s.count, s.segment)
    if p.oversubscribed and (force_work or cost.price_work(w, s.itemsize, p) > lock):
        k = s.ranks_per_core
        msgs, elems, red = w
        return True, [0.0, 0.0, k * red * s.itemsize, 0.0, k * msgs, k * elems * s.itemsize, k]
    r, b, g, o = lockstep_terms(s, p)
    return False, [r, b, g, o, 0.0, 0.0, 0.0]


def fit(
    samples: Sequence[Sample],
    start: CostParams,
    free: Iterable[str] = NAMES,
    iters: int = 8,
    work_first: bool = False,
) -> tuple[CostParams, dict[int, float]]:
    """Parameters (those named in `free`; the rest stay as in `start`) that best predict
    the samples' times, and the per-group constants. work_first: begin with every
    oversubscribed sample in the work branch (else `start` decides, and CPU-side values
    too small to matter there would never be fitted). Raises ValueError without samples."""
    wanted = set(free)
    unknown = wanted - set(NAMES)
    if unknown:
        raise ValueError(f"cannot fit {sorted(unknown)}; parameters are {NAMES}")
    free = [n for n in NAMES if n in wanted]
    good = [s for s in samples if s.seconds > 0 and np.isfinite(s.seconds)]
    if not good:
        raise ValueError("no samples with a positive time to fit")
    groups = sorted({s.group for s in good})
    params = start
    consts = dict.fromkeys(groups, 0.0)
    for it in range(iters):
        rows, ys = [], []
        for s in good:
            work_branch, coef = _row(s, params, work_first and it == 0)
            fixed = sum(
                c * getattr(params, n) for c, n in zip(coef, NAMES, strict=True) if n not in free
            )
            onehot = [0.0 if work_branch or g != s.group else 1.0 for g in groups]
            x = onehot + [coef[NAMES.index(n)] for n in free]
            rows.append([v / s.seconds for v in x])
            ys.append(1.0 - fixed / s.seconds)
        sol = _nnls(np.array(rows), np.array(ys))
        consts = dict(zip(groups, (float(v) for v in sol[: len(groups)]), strict=True))
        new = {n: float(v) for n, v in zip(free, sol[len(groups) :], strict=True)}
        params = replace(params, **new)
    return params, consts


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients, by dropping the most negative one
    until none is left (enough for a handful of columns)."""
    cols = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        if cols:
            coef[cols] = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
        neg = [i for i in cols if coef[i] < 0]
        if not neg:
            return coef
        cols.remove(min(neg, key=lambda i: coef[i]))


def predicted(s: Sample, params: CostParams) -> float:
    """The model's time for a sample (without any per-group constant)."""
    p = replace(params, ranks_per_core=s.ranks_per_core)
    return cost.predict(
        s.collective, s.algorithm, s.size, s.count, s.itemsize, p, segment=s.segment
    )
