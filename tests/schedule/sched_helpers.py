"""Shared helpers for the schedule tests: inputs, numpy references, counts to try."""

from __future__ import annotations

from functools import reduce as _fold

import numpy as np

from pycollective.schedule import ALGORITHMS, ROOTED

PAIRS = [(c, a) for c, algs in ALGORITHMS.items() for a in algs]
SIZES = range(1, 17)
BLOCKED_INPUT = {"reduce_scatter", "scatter", "all_to_all"}  # input holds p blocks


def counts_for(p: int) -> list[int]:
    """The awkward counts every schedule is tested with: 0, 1, p-1, p+1 and a large-ish one."""
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000 + p})


def roots_for(collective: str, p: int) -> list[int]:
    if collective not in ROOTED:
        return [0]
    return list(range(p)) if p <= 12 else sorted({0, 1, p // 2, p - 2, p - 1})


def int_inputs(collective: str, p: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    per = p * n if collective in BLOCKED_INPUT else n
    return [rng.integers(-1000, 1000, per, dtype=np.int64) for _ in range(p)]


def reference(collective: str, xs: list[np.ndarray], root: int, op=np.add) -> list:
    """What each rank's result buffer must hold ("data" or "output"; None if it has none)."""
    p = len(xs)
    if collective == "barrier":
        return [None] * p
    total = _fold(op, xs)
    n = xs[0].size // p if collective in BLOCKED_INPUT else xs[0].size
    if collective == "all_reduce":
        return [total] * p
    if collective == "broadcast":
        return [xs[root]] * p
    if collective == "reduce":
        return [total if r == root else xs[r] for r in range(p)]
    if collective == "all_gather":
        return [np.concatenate(xs)] * p
    if collective == "gather":
        return [np.concatenate(xs) if r == root else None for r in range(p)]
    if collective == "reduce_scatter":
        return [total[r * n : (r + 1) * n] for r in range(p)]
    if collective == "scatter":
        return [xs[root][r * n : (r + 1) * n] for r in range(p)]
    if collective == "all_to_all":
        return [np.concatenate([x[r * n : (r + 1) * n] for x in xs]) for r in range(p)]
    raise AssertionError(collective)


def assert_results(got: list, want: list, label: str) -> None:
    assert len(got) == len(want), label
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, f"{label}: rank {r} should have no result"
        else:
            assert g is not None, f"{label}: rank {r} has no result"
            np.testing.assert_array_equal(g, w, err_msg=f"{label}: rank {r}")
