"""The synchronous parameter-server step as a schedule: it computes the sum on every
worker, its bytes are what ps.Client and the servers move, and its cost is the closed
form 2 alpha + 2 beta n max(1, W/S) (+ reduction and per-message overhead)."""

from __future__ import annotations

import numpy as np
import pytest

from pycollective.schedule import cost, simulate
from pycollective.schedule import parameter_server as ps


@pytest.mark.parametrize("workers,servers,count", [(1, 1, 5), (2, 1, 7), (3, 2, 10), (4, 3, 2),
                                                   (5, 4, 0), (2, 5, 3), (6, 6, 37)])  # fmt: skip
def test_every_worker_gets_the_sum(workers: int, servers: int, count: int) -> None:
    scheds = ps.build_all(workers, servers, count)
    rng = np.random.default_rng(workers * 100 + servers)
    grads = [rng.integers(-50, 50, count).astype(np.float64) for _ in range(workers)]
    bufs = [{"data": g} for g in grads]
    bufs += [{"data": np.zeros(s.buffers["data"])} for s in scheds[workers:]]
    out = simulate.execute(scheds, bufs)
    want = np.sum(grads, axis=0) if count else np.zeros(0)
    for w in range(workers):
        np.testing.assert_array_equal(out[w]["data"], want)
    # every worker sends and receives its whole vector once; server s moves W x its slice
    wire = simulate.wire_bytes(scheds, 4)
    for w in range(workers):
        assert wire.sent[w] == wire.received[w] == 4 * count
    for s, (_, n) in enumerate(ps.slices(count, servers)):
        assert wire.sent[workers + s] == wire.received[workers + s] == 4 * workers * n


def test_slices_cover_the_vector_and_balance() -> None:
    for count, servers in [(10, 3), (7, 7), (3, 5), (0, 2), (7_507_850, 4)]:
        parts = ps.slices(count, servers)
        assert [off for off, _ in parts] == list(np.cumsum([0] + [n for _, n in parts[:-1]]))
        assert sum(n for _, n in parts) == count
        assert max(n for _, n in parts) - min(n for _, n in parts) <= 1


@pytest.mark.parametrize("workers,servers", [(2, 1), (4, 1), (4, 2), (3, 3), (8, 16), (64, 8)])
def test_cost_is_the_closed_form(workers: int, servers: int) -> None:
    count = 7_507_850
    p = cost.CostParams(alpha=200e-6, beta=8e-9, gamma=0.12e-9, overhead=100e-6)
    got = cost.schedule_cost(ps.sample(workers, servers, count), 4, p)
    n = 4 * count
    slice_bytes = 4 * -(-count // servers)
    push_server = p.alpha + workers * slice_bytes * (p.beta + p.gamma) + (workers - 1) * p.overhead
    push_worker = p.alpha + n * p.beta + (servers - 1) * p.overhead
    pull_server = p.alpha + workers * slice_bytes * p.beta + (workers - 1) * p.overhead
    assert got == pytest.approx(max(push_server, push_worker) + max(pull_server, push_worker))
    # the sample prices exactly what every rank's schedule prices
    if workers + servers <= 24:
        assert got == pytest.approx(cost.schedule_cost(ps.build_all(workers, servers, count), 4, p))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="servers must be an int >= 1"):
        ps.build(0, 2, 0, 10)
    with pytest.raises(ValueError, match="out of range"):
        ps.build(5, 2, 2, 10)
