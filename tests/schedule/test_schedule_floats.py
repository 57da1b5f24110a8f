"""all_reduce on floats: every rank must end with bitwise the same bytes, and close to the
exact sum (the order of reduction is the algorithm's, not numpy's)."""

from __future__ import annotations

import numpy as np
import pytest
from sched_helpers import SIZES, counts_for

from pycollective.schedule import ALGORITHMS
from pycollective.schedule.simulate import run_collective


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("algorithm", ALGORITHMS["all_reduce"])
def test_all_reduce_bitwise_identical(algorithm: str, dtype) -> None:
    for p in SIZES:
        for n in counts_for(p):
            rng = np.random.default_rng(p * 100 + n)
            # Wide exponent range, so a different order of additions would differ in bits.
            xs = [
                (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
                for _ in range(p)
            ]
            for op in (np.add, np.multiply):
                with np.errstate(all="ignore"):  # products may overflow to inf: still equal
                    got = run_collective("all_reduce", algorithm, xs, op)
                first = got[0].tobytes()
                for r in range(1, p):
                    assert got[r].tobytes() == first, f"{algorithm} p={p} n={n} rank {r}"
                if op is np.add:
                    want = np.sum(np.stack(xs).astype(np.float64), axis=0)
                    np.testing.assert_allclose(
                        got[0].astype(np.float64),
                        want,
                        rtol=1e-2 if dtype == np.float16 else 1e-4,
                        atol=p * 10 if dtype == np.float16 else 1e-3,
                    )


def test_nan_and_inf_propagate_identically() -> None:
    for algorithm in ALGORITHMS["all_reduce"]:
        p = 6
        xs = [np.array([1.0, np.inf, 0.0, -0.0], dtype=np.float32) for _ in range(p)]
        xs[3][2] = np.nan
        got = run_collective("all_reduce", algorithm, xs, np.add)
        assert len({g.tobytes() for g in got}) == 1, algorithm
        assert np.isnan(got[0][2]) and got[0][1] == np.inf and got[0][0] == p
