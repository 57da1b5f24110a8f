"""A few kill -9 and SIGINT runs of a real job under the launcher (the fault-injection
driver, tools/faults.py, runs 50 kills and more; see `make faults`)."""

from __future__ import annotations

import pytest
from tests._launch import within
from tests.faults._chaos import kill_run, sigint_run


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "nprocs,seed,delay,victim",
    [(3, 11, 0.2, 1), (4, 13, 0.05, 3)],
)
def test_kill_9_reaches_every_survivor_and_the_launcher_names_the_rank(
    nprocs: int, seed: int, delay: float, victim: int
) -> None:
    res = kill_run(nprocs, seed, delay, victim)
    assert res.ok, (res.problems, res.errors, res.stderr_tail)
    assert sorted(res.raise_seconds) == sorted(set(range(nprocs)) - {victim})
    # connection loss is noticed at once, not at the (60 s) timeout
    assert max(res.raise_seconds.values()) < within(2.0), res.raise_seconds
    assert all(f"rank {victim}" in e for e in res.errors.values()), res.errors


@pytest.mark.timeout(60)
def test_sigint_to_the_launcher_ends_every_rank_promptly_leaving_nothing() -> None:
    res = sigint_run(3, 21, 0.3)
    assert res.ok, (res.problems, res.stderr_tail)
    assert res.exit_seconds is not None and res.exit_seconds < 5.0
