"""Engine.run_here: a thread about to wait for an asynchronous job that has not started
runs it itself (what makes a synchronous call through the torch backend, issued async and
waited for at once, cost no thread switches), without ever changing the order of jobs."""

from __future__ import annotations

import threading

import pytest

from pycollective._errors import CollectiveTimeout
from pycollective.core.engine import Engine
from pycollective.core.work import Work


def _engine_without_worker() -> Engine:
    """An engine whose worker thread never starts, so only waiters can run its jobs."""
    engine = Engine()
    engine._thread = threading.current_thread()  # any non-None: _enqueue starts none
    return engine


def test_the_waiter_runs_a_job_that_has_not_started() -> None:
    engine = _engine_without_worker()
    ran_on = []
    work = engine.submit(lambda: ran_on.append(threading.get_ident()), Work("job"))
    assert work.wait()
    assert ran_on == [threading.get_ident()]


def test_only_the_next_job_in_line_and_only_for_an_unbounded_wait() -> None:
    engine = _engine_without_worker()
    order: list[str] = []
    a = engine.submit(lambda: order.append("a"), Work("a"))
    b = engine.submit(lambda: order.append("b"), Work("b"))
    with pytest.raises(CollectiveTimeout):
        b.wait(0.05)  # b is not next in line (and a bounded wait never runs a job)
    with pytest.raises(CollectiveTimeout):
        a.wait(0.05)  # next in line, but a bounded wait does not run it either
    assert order == []
    a.wait()
    b.wait()
    assert order == ["a", "b"]


def test_a_failing_job_fails_its_work_and_the_engine_goes_on() -> None:
    engine = _engine_without_worker()

    def boom() -> None:
        raise RuntimeError("boom")

    bad = engine.submit(boom, Work("bad"))
    with pytest.raises(RuntimeError, match="boom"):
        bad.wait()
    assert engine.submit(lambda: None, Work("next")).wait()


def test_with_a_worker_every_job_runs_once() -> None:
    engine = Engine()
    count = [0]
    lock = threading.Lock()

    def job() -> None:
        with lock:
            count[0] += 1

    works = [engine.submit(job, Work(f"j{i}")) for i in range(200)]
    for w in works:
        w.wait()
    assert count[0] == 200
    engine.stop()
