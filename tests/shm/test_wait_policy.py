"""The waits' policy on a busy machine: the load view (_load.py), and the arena's waits,
Python and compiled, taking the busy schedule (spin less, yield less, sleep sooner) only
while the machine has more runnable tasks than CPUs. No timing is asserted: what a wait
did is counted (yields) or read back (the compiled arena's `busy`)."""

from __future__ import annotations

import os

import pytest

from pycollective import _load
from pycollective.shm import arena, native

pytestmark = pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm")

native_only = pytest.mark.skipif(
    native._native is None or os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0",
    reason="the compiled arena is not in use",
)


def _loadavg(tmp_path, runnable: int | str) -> str:
    path = tmp_path / "loadavg"
    path.write_text(f"7.50 6.20 5.10 {runnable}/612 40312\n")
    return str(path)


def test_runnable_is_the_fourth_field_before_the_slash() -> None:
    assert _load.runnable(b"0.52 0.58 0.59 3/467 12345\n") == 3
    assert _load.runnable(b"12.00 9.00 8.00 14/800 1") == 14
    for bad in (b"", b"0.5 0.5 0.5", b"0.5 0.5 0.5 x/4 1", b"0.5 0.5 0.5 4 1", b"0.5 0.5 0.5 /4 1"):
        assert _load.runnable(bad) is None, bad


def test_this_machine_reads_as_some_count() -> None:
    # the reader itself is running: at least one, wherever /proc/loadavg exists
    count = _load.read_runnable()
    assert count is None or count >= 1
    assert _load.read_runnable("/nonexistent/loadavg") is None
    assert _load.online_cpus() >= 1


def test_busy_only_with_more_runnable_tasks_than_cpus(tmp_path) -> None:
    assert _load.MachineLoad(2, _loadavg(tmp_path, 3)).check(0.0)
    assert not _load.MachineLoad(2, _loadavg(tmp_path, 2)).check(0.0)
    assert not _load.MachineLoad(-1, _loadavg(tmp_path, 300)).check(0.0)  # switched off
    assert not _load.MachineLoad(2, str(tmp_path / "missing")).check(0.0)
    assert not _load.MachineLoad(2, _loadavg(tmp_path, "x")).check(0.0)


def test_the_callers_own_runnable_tasks_do_not_make_it_busy(tmp_path) -> None:
    view = _load.MachineLoad(4, _loadavg(tmp_path, 6))
    assert view.check(0.0) and view.check(0.0, own=1)
    assert not view.check(0.0, own=2)  # the reading kept; only the verdict changes
    assert not view.busy
    assert view.check(0.0, own=1)


def test_the_view_is_read_again_only_after_check_seconds(tmp_path) -> None:
    path = _loadavg(tmp_path, 9)
    view = _load.MachineLoad(2, path)
    assert view.check(100.0)
    _loadavg(tmp_path, 1)  # the machine calms down ...
    assert view.check(100.0 + _load.CHECK_SECONDS / 2)  # ... unseen until the next reading
    assert not view.check(100.0 + _load.CHECK_SECONDS)
    assert not view.busy


@pytest.fixture
def pair():
    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    other = arena.Segment.attach(seg.name, seg.nbytes)
    a0, a1 = arena.Arena(seg, 2, 0, 4096), arena.Arena(other, 2, 1, 4096)
    a0.init_header()
    a1.check_header()
    seg.unlink()
    yield a0, a1


def test_busy_schedule_never_keeps_the_core_longer(pair, monkeypatch) -> None:
    a0, _ = pair
    for cores in (1, 2, 64):
        a0.set_cores(cores)
        assert a0.busy_spins <= a0.pure_spins
        assert a0.busy_yield_seconds <= a0.yield_seconds
    # a rank pinned to a core of its own waits alike on a busy machine: its peer has
    # another core
    monkeypatch.setattr(arena, "affinity", lambda: {3})
    a0.set_cores(2)
    assert a0.pinned
    assert (a0.busy_spins, a0.busy_yield_seconds) == (a0.pure_spins, a0.yield_seconds)
    monkeypatch.setattr(arena, "affinity", lambda: {0, 1})
    a0.set_cores(2)
    assert not a0.pinned and a0.busy_spins < a0.pure_spins
    monkeypatch.setenv("PYCOLLECTIVE_LOAD_AWARE", "0")
    off = arena.Arena(a0.segment, 2, 0, 4096)
    assert off.load.cpus == -1 and not off.load.check(1e9)
    monkeypatch.delenv("PYCOLLECTIVE_LOAD_AWARE")
    assert arena.Arena(a0.segment, 2, 0, 4096).load.cpus == _load.online_cpus()


def _yields_in_one_wait(a0, a1, monkeypatch) -> int:
    """Yields rank 0 makes waiting for rank 1, which arrives at rank 0's first poll (the
    wait sleeps on the futex once its yielding is over: the poll ends that sleep)."""
    count = 0
    real = os.sched_yield

    def counting() -> None:
        nonlocal count
        count += 1
        real()

    monkeypatch.setattr(arena.os, "sched_yield", counting)
    try:
        a0.wait_all(a0.bump(), lambda target: a1.epoch_of(1) < target and a1.bump())
    finally:
        monkeypatch.setattr(arena.os, "sched_yield", real)
    return count


@pytest.mark.timeout(30)
def test_python_wait_sleeps_without_yielding_while_busy(pair, monkeypatch, tmp_path) -> None:
    a0, a1 = pair
    a0.yield_seconds = 60.0  # quiet: yield until the peer comes (at the first poll)
    a0.busy_yield_seconds = 0.0  # busy: sleep at once
    a0.load = _load.MachineLoad(2, _loadavg(tmp_path, 1))
    assert _yields_in_one_wait(a0, a1, monkeypatch) > 0
    a0.load = _load.MachineLoad(2, _loadavg(tmp_path, 8))
    assert _yields_in_one_wait(a0, a1, monkeypatch) == 0
    assert a0.load.busy


@native_only
@pytest.mark.timeout(30)
def test_compiled_wait_reads_the_machines_load(pair) -> None:
    a0, _ = pair
    c = native.NativeArena(a0, 1024, 4096).c
    target = c.bump()  # the peer never comes: each wait gives up at its budget

    def busy_after_a_wait(load_cpus: int) -> bool:
        c.set_spin(16, 0, False, 0, 16, 0, load_cpus)
        assert not c.busy  # set_spin forgets the last reading
        assert c.wait(target, 200_000) is False
        return c.busy

    # the reader is running: more than 0 runnable tasks, never more than 2**30
    assert busy_after_a_wait(0) is True
    assert busy_after_a_wait(1 << 30) is False
    assert busy_after_a_wait(-1) is False  # switched off: never read


@native_only
@pytest.mark.timeout(30)
def test_compiled_arena_takes_the_python_arenas_view(pair) -> None:
    a0, _ = pair
    for cpus, busy in ((0, True), (-1, False)):  # 0: any runnable task is too many
        a0.load = _load.MachineLoad(cpus)
        na = native.NativeArena(a0, 1024, 4096)  # set_spin passes the view's threshold
        assert na.c.wait(na.c.bump(), 200_000) is False
        assert na.c.busy is busy
