"""Property test: any algorithm, world size, count, root, segment and dtype gives the numpy
answer, with every message matched."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import PAIRS, assert_results, int_inputs, reference

from pycollective.schedule import build_all
from pycollective.schedule.simulate import check_matching, run_collective


@st.composite
def cases(draw):
    collective, algorithm = draw(st.sampled_from(PAIRS))
    p = draw(st.integers(1, 24))
    n = draw(st.one_of(st.integers(0, 3 * p + 2), st.integers(0, 300)))
    root = draw(st.integers(0, p - 1))
    segment = draw(st.integers(0, n + 2))
    dtype = draw(st.sampled_from([np.int8, np.int32, np.uint16, np.int64]))
    return collective, algorithm, p, n, root, segment, dtype


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_any_configuration(case) -> None:
    collective, algorithm, p, n, root, segment, dtype = case
    check_matching(build_all(collective, algorithm, p, n, root, segment))
    if collective == "barrier":
        run_collective(collective, algorithm, [None] * p)
        return
    xs = [x.astype(dtype) for x in int_inputs(collective, p, n, seed=n)]  # wraps: still exact
    got = run_collective(collective, algorithm, xs, np.add, root=root, segment=segment)
    assert_results(got, reference(collective, xs, root), str(case))
