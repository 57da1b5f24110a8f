"""Every collective x algorithm x world size 1..16 x awkward counts x roots, in memory,
against numpy. Integers make equality exact; junk-filled scratch and outputs make any
read-before-write show up."""

from __future__ import annotations

import numpy as np
import pytest
from sched_helpers import (
    PAIRS,
    SIZES,
    assert_results,
    counts_for,
    int_inputs,
    reference,
    roots_for,
)

from pycollective.schedule.simulate import run_collective, simulate


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize(("collective", "algorithm"), PAIRS)
def test_matches_numpy(collective: str, algorithm: str, p: int) -> None:
    for n in counts_for(p):
        for root in roots_for(collective, p):
            if collective == "barrier":
                assert run_collective(collective, algorithm, [None] * p) == [None] * p
                continue
            xs = int_inputs(collective, p, n, seed=p * 7919 + n * 31 + root)
            got = run_collective(collective, algorithm, xs, np.add, root=root)
            assert_results(
                got, reference(collective, xs, root), f"{algorithm} p={p} n={n} root={root}"
            )


@pytest.mark.parametrize(
    ("collective", "algorithm"),
    [pair for pair in PAIRS if pair[0] in ("all_reduce", "reduce", "reduce_scatter")],
)
@pytest.mark.parametrize("op", [np.maximum, np.bitwise_xor, np.multiply])
def test_other_ops(collective: str, algorithm: str, op) -> None:
    for p in (1, 3, 5, 8, 11):
        for n in (1, p + 1, 37):
            xs = int_inputs(collective, p, n, seed=p + n)
            if op is np.multiply:
                xs = [np.sign(x) + (x == 0) for x in xs]  # +-1: products stay in range
            root = p // 2 if collective == "reduce" else 0
            got = run_collective(collective, algorithm, xs, op, root=root)
            assert_results(
                got, reference(collective, xs, root, op), f"{algorithm} {op.__name__} p={p}"
            )


@pytest.mark.parametrize("p", SIZES)
def test_reduce_leaves_non_root_data_unchanged(p: int) -> None:
    for root in range(p):
        xs = int_inputs("reduce", p, p + 3, seed=root)
        out = simulate("reduce", "tree", [{"data": x} for x in xs], np.add, root=root)
        for r in range(p):
            if r != root:
                np.testing.assert_array_equal(out[r]["data"], xs[r])


@pytest.mark.parametrize("algorithm", ["ring", "recursive_halving"])
@pytest.mark.parametrize("p", SIZES)
def test_reduce_scatter_leaves_input_unchanged(algorithm: str, p: int) -> None:
    for n in counts_for(p):
        xs = int_inputs("reduce_scatter", p, n, seed=n)
        out = simulate("reduce_scatter", algorithm, [{"input": x} for x in xs], np.add)
        for r in range(p):
            np.testing.assert_array_equal(out[r]["input"], xs[r])


@pytest.mark.parametrize("p", SIZES)
def test_inputs_of_gathers_unchanged(p: int) -> None:
    for collective, algorithm in PAIRS:
        if collective not in ("all_gather", "gather", "all_to_all", "scatter"):
            continue
        root = p - 1
        xs = int_inputs(collective, p, 5, seed=p)
        inputs = [
            {} if collective == "scatter" and r != root else {"input": x} for r, x in enumerate(xs)
        ]
        out = simulate(collective, algorithm, inputs, np.add, root=root, count=5)
        for r in range(p):
            if "input" in inputs[r]:
                np.testing.assert_array_equal(out[r]["input"], xs[r])


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13, 16])
def test_all_to_all_uneven_counts(p: int) -> None:
    rng = np.random.default_rng(p)
    send = rng.integers(0, 5, (p, p)).tolist()  # send[i][j]: elements rank i sends to j
    xs = [rng.integers(-99, 99, sum(row)) for row in send]
    out = simulate("all_to_all", "pairwise", [{"input": x} for x in xs], send_counts=send)
    offs = [np.concatenate([[0], np.cumsum(row)]) for row in send]
    for r in range(p):
        want = np.concatenate([xs[j][offs[j][r] : offs[j][r + 1]] for j in range(p)])
        np.testing.assert_array_equal(out[r]["output"], want)


@pytest.mark.parametrize("segment", [1, 2, 3, 7, 100, 5000])
def test_chain_segments(segment: int) -> None:
    for p in (1, 2, 5, 9):
        for root in range(p):
            xs = int_inputs("broadcast", p, 1000, seed=segment)
            got = run_collective("broadcast", "chain", xs, root=root, segment=segment)
            assert_results(got, [xs[root]] * p, f"seg={segment} p={p} root={root}")
