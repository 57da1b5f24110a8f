"""The arena without a job: segment lifecycle, the stale sweep, futexes, announcements, and
every arena collective run by forked processes against numpy (small slots, so calls span
many chunks and both halves)."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import stat
import threading
import time

import numpy as np
import pytest
from tests._arena_ranks import run_on_new_arena

from pycollective._dtypes import from_numpy
from pycollective._reduce_ops import ReduceOp
from pycollective.shm import _futex, _hostid, arena, collectives

pytestmark = pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm")


def _ours() -> set[str]:
    return {n for n in os.listdir(arena.SHM_DIR) if n.startswith("pycollective-")}


@pytest.mark.timeout(30)
def test_segment_lives_as_long_as_a_mapping_not_the_name() -> None:
    before = _ours()
    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    assert stat.S_IMODE(os.stat(seg.path).st_mode) == 0o600
    other = arena.Segment.attach(seg.name, seg.nbytes)
    a0, a1 = arena.Arena(seg, 2, 0, 4096), arena.Arena(other, 2, 1, 4096)
    a0.init_header()
    a1.check_header()
    seg.unlink()
    assert _ours() == before  # the name is gone ...
    a0.data[:5] = 7
    assert list(a1.data[:5]) == [7] * 5  # ... the memory is still shared
    with pytest.raises(FileNotFoundError):
        arena.Segment.attach(seg.name, seg.nbytes)


@pytest.mark.timeout(30)
def test_rank_0_chooses_the_chunk_for_its_arena(monkeypatch) -> None:
    monkeypatch.delenv("PYCOLLECTIVE_SHM_CHUNK_BYTES", raising=False)
    assert arena.chunk_bytes_for(True) == arena.CHUNK_BYTES_COMPILED == 256 << 10
    assert arena.chunk_bytes_for(False) == arena.CHUNK_BYTES_PYTHON == 1 << 20
    monkeypatch.setenv("PYCOLLECTIVE_SHM_CHUNK_BYTES", "65536")
    assert arena.chunk_bytes_for(True) == arena.chunk_bytes_for(False) == 65536


@pytest.mark.timeout(30)
def test_attach_checks_name_size_and_layout() -> None:
    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    try:
        with pytest.raises(OSError):
            arena.Segment.attach("../etc/passwd", 10)
        with pytest.raises(OSError):
            arena.Segment.attach(seg.name, seg.nbytes + 1)
        arena.Arena(seg, 2, 0, 4096).init_header()
        other = arena.Segment.attach(seg.name, seg.nbytes)
        with pytest.raises(ValueError):
            arena.Arena(other, 3, 1, 4096)  # too small for 3 ranks
        with pytest.raises(ValueError):
            arena.Arena(other, 1, 0, 4096).check_header()  # says 2 ranks
    finally:
        seg.unlink()


def _create_and_die(conn) -> None:
    seg = arena.Segment.create(4096)
    conn.send(seg.name)  # synchronous, unlike a Queue's feeder thread
    os._exit(0)  # dies without unlinking, as kill -9 would


@pytest.mark.timeout(30)
def test_sweep_removes_segments_of_dead_creators_only() -> None:
    ctx = mp.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_create_and_die, args=(writer,))
    proc.start()
    assert reader.poll(10)
    stale = reader.recv()
    proc.join(10)
    live = arena.Segment.create(4096)  # sweeps first: ours is alive and stays
    try:
        assert stale not in _ours()
        assert live.name in _ours()
        assert arena.sweep_stale() == []
    finally:
        live.unlink()


@pytest.mark.timeout(30)
def test_futex_times_out_and_wakes() -> None:
    buf = np.zeros(2, np.int64)
    addr = buf.ctypes.data
    t0 = time.monotonic()
    _futex.wait(addr, 0, 0.05)
    assert 0.02 < time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    _futex.wait(addr, 5, 1.0)  # value differs: returns at once
    assert time.monotonic() - t0 < 0.5
    if not _futex.AVAILABLE:
        return
    woke = []

    def sleeper() -> None:
        t = time.monotonic()
        _futex.wait(addr, 0, 5.0)
        woke.append(time.monotonic() - t)

    th = threading.Thread(target=sleeper)
    th.start()
    time.sleep(0.1)
    buf[0] = 1
    _futex.wake(addr)
    th.join(5)
    assert woke and woke[0] < 2.0


def test_announcements_round_trip() -> None:
    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    seg.unlink()
    a = arena.Arena(seg, 2, 0, 4096)
    b = arena.Arena(seg, 2, 1, 4096)
    assert b.announced(0) is None
    a.announce(5, 1, 2, 300, 1, 0, 9)
    assert b.announced(0) == (5, 1, 2, 300, 1, 0, 9)
    assert a.announced(1) is None


def test_host_id_is_stable_and_overridable(monkeypatch) -> None:
    assert _hostid.host_id() == _hostid.host_id()
    assert len(_hostid.host_id()) == 16
    mine = _hostid.host_id()
    monkeypatch.setenv("PYCOLLECTIVE_HOST_ID", "elsewhere")
    assert _hostid.host_id() != mine


def test_shares_cover_the_chunk_on_cache_lines() -> None:
    for m in (0, 1, 15, 16, 17, 1000, 4096):
        for p in (1, 2, 3, 7):
            cuts = collectives._shares(m, p, 4)
            assert cuts[0] == 0 and cuts[-1] == m and list(cuts) == sorted(cuts)
            assert all(c % 16 == 0 for c in cuts[:-1])


# ---------------------------------------------------------------------- collectives, forked

SLOT = 4096  # bytes: 1024 float32 per slot, so most counts below take many chunks
COUNTS = (0, 1, 7, 1000, 1500, 3000, 9000)


def _data(rank: int, n: int, dt) -> np.ndarray:
    if np.dtype(dt) == np.bool_:
        return (np.arange(n) + rank) % 3 == 0
    return ((np.arange(n) * 7 + rank * 3) % 11 + 1).astype(dt)


def _rank_main(name: str, nbytes: int, p: int, r: int, out) -> None:
    try:
        seg = arena.Segment.attach(name, nbytes)
        a = arena.Arena(seg, p, r, SLOT)

        phase = collectives.Sync(a, lambda t: None)

        for dt, op in (
            (np.float32, ReduceOp.SUM),
            (np.int64, ReduceOp.MAX),
            (np.bool_, ReduceOp.BOR),
            (np.float64, ReduceOp.PRODUCT),
        ):
            k = collectives.reducer(op, from_numpy(np.dtype(dt)))
            ref = {
                ReduceOp.SUM: np.add,
                ReduceOp.MAX: np.maximum,
                ReduceOp.BOR: np.logical_or,
                ReduceOp.PRODUCT: np.multiply,
            }[op]
            for n in COUNTS:
                every = [_data(q, n, dt) for q in range(p)]
                want = every[0].copy()
                for x in every[1:]:
                    want = ref(want, x)
                x = every[r].copy()
                collectives.all_reduce(a, x, k, phase)
                assert np.array_equal(x, want), ("all_reduce", dt, n)
                for root in {0, p - 1}:
                    x = every[r].copy()
                    collectives.reduce(a, x, k, phase, root)
                    assert np.array_equal(x, want if r == root else every[r]), ("reduce", n)
                    x = every[r].copy()
                    collectives.broadcast(a, x, phase, root)
                    assert np.array_equal(x, every[root]), ("broadcast", dt, n)
                out_g = np.zeros(n * p, dt)
                collectives.all_gather(a, every[r], out_g, phase)
                assert np.array_equal(out_g, np.concatenate(every)), ("all_gather", dt, n)
                big = [np.concatenate([_data(q + b, n, dt) for b in range(p)]) for q in range(p)]
                want_rs = big[0][r * n : (r + 1) * n].copy()
                for q in range(1, p):
                    want_rs = ref(want_rs, big[q][r * n : (r + 1) * n])
                got = np.zeros(n, dt)
                collectives.reduce_scatter(a, big[r], got, k, phase)
                assert np.array_equal(got, want_rs), ("reduce_scatter", dt, n)
                collectives.barrier(a, phase)
        out.put((r, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_arena_collectives_match_numpy(p: int) -> None:
    results = run_on_new_arena(p, SLOT, _rank_main)
    assert results == {r: None for r in range(p)}


def test_peer_announcements_judged_with_its_counter() -> None:
    """A peer that announced a later call is fine if it already passed our phase (it
    checked us and moved on), a mismatch if it did not; an earlier call is fine while it
    has not arrived; the same call with other metadata is always a mismatch."""
    from pycollective._errors import MismatchError
    from pycollective.runners.arena import LocalGroup
    from pycollective.transport._wire import DATA, Header

    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    seg.unlink()
    me, peer = arena.Arena(seg, 2, 0, 4096), arena.Arena(seg, 2, 1, 4096)
    group = LocalGroup(me, (0, 1), 7, None)
    mine = Header(DATA, 1, 2, 0, 3, 7, 10, 0, 0, 100, 0)
    me.announce(10, 1, 2, 100, 0, 0, 3)
    target = me.bump()

    peer.announce(11, 2, 2, 100, 0, 0, 3)  # later call, not arrived: it skipped ours
    with pytest.raises(MismatchError, match="sequence number"):
        group._check_peer(1, mine, target)
    peer.bump()  # ... but once it has passed our phase, it checked us and moved on
    group._check_peer(1, mine, target)

    peer.announce(9, 1, 2, 100, 0, 0, 3)  # earlier call, not arrived: not there yet
    group._check_peer(1, mine, target + 1)
    peer.announce(10, 1, 2, 101, 0, 0, 3)  # same call, another count
    with pytest.raises(MismatchError, match="count"):
        group._check_peer(1, mine, target + 1)
    peer.announce(10, 1, 2, 100, 0, 0, 3)
    group._check_peer(1, mine, target + 1)


# ---------------------------------------------------------------------- shared arrays


def test_empty_arrays_are_shared_blocks_freed_with_the_array() -> None:
    import gc

    import pycollective as dist
    from pycollective._errors import UsageError
    from pycollective.shm import shared

    before = len(shared._REGISTRY)
    a = dist.empty((4, 1000), np.float64)
    assert a.shape == (4, 1000) and a.flags.c_contiguous and a.flags.writeable
    fd1, ino, off, length = shared.describe(a)
    assert fd1 > 0 and off == 0 and length >= a.nbytes
    assert shared.describe(a[2])[2] == 2 * 1000 * 8  # a view: same block, its offset
    assert shared.describe(np.zeros(10)) == shared.NOT_SHARED
    assert dist.empty_like(a).shape == a.shape
    # A peer (here: this process, through /proc) maps the block and sees our writes.
    maps = shared.PeerMaps()
    peer = maps.view(os.getpid(), fd1, ino, 8000, length, np.dtype(np.float64), 1000)
    a[1] = 7.0
    assert (peer == 7.0).all()
    with pytest.raises(OSError, match="not the announced block"):
        shared.PeerMaps().view(os.getpid(), fd1, ino + 1, 0, length, np.dtype(np.uint8), 1)
    with pytest.raises(OSError, match="exceeds"):
        maps.view(os.getpid(), fd1, ino, 0, length, np.dtype(np.float64), length)
    del a, peer
    gc.collect()
    assert len(shared._REGISTRY) == before  # the owner's fd is closed with its last array
    maps._prune(os.getpid())
    assert len(maps) == 0  # and a peer drops its mapping at its next miss
    with pytest.raises(UsageError, match="negative"):
        dist.empty((2, -1))
    with pytest.raises(UsageError, match="ProcessGroup"):
        dist.empty(3, group="world")


def test_non_temporal_threshold_is_the_l3_or_the_override(monkeypatch) -> None:
    from pycollective.shm import native

    monkeypatch.delenv("PYCOLLECTIVE_SHM_NT_BYTES", raising=False)
    l3 = native.l3_bytes()
    assert l3 is None or l3 >= 1 << 20
    assert native.nt_threshold() == (l3 or native.NT_FALLBACK_BYTES)
    monkeypatch.setenv("PYCOLLECTIVE_SHM_NT_BYTES", "4096")
    assert native.nt_threshold() == 4096
    monkeypatch.setattr(native, "_CACHES", "/nonexistent")
    assert native.l3_bytes() is None


class _LeavingPeer:
    """A transport whose peer (rank 1) is gone; `arrive` runs when the loss is first read,
    as a peer that passed the phase and then exited would have done just before."""

    def __init__(self, arrive) -> None:
        self.arrive = arrive

    def check_group(self, *args) -> None:
        pass

    def lost_peers(self) -> dict[int, str]:
        if self.arrive is not None:
            self.arrive()
            self.arrive = None
        return {1: "connection closed by peer"}


def test_a_peer_that_arrived_and_then_exited_is_not_lost_to_the_call() -> None:
    """The wait's poll reads who lags, then who is lost: a peer that passed the phase in
    between and exited (a job's last barrier) must not fail the call; one that still lags
    when its loss is seen must."""
    from pycollective._errors import TransportError
    from pycollective.runners.arena import LocalGroup
    from pycollective.transport._wire import DATA, Header

    seg = arena.Segment.create(arena.layout(2, 4096)[2])
    seg.unlink()
    me, peer = arena.Arena(seg, 2, 0, 4096), arena.Arena(seg, 2, 1, 4096)
    header = Header(DATA, 9, 2, 0, 3, 7, 10, 0, 0, 1, 0)
    target = me.bump()

    group = LocalGroup(me, (0, 1), 7, _LeavingPeer(peer.bump))
    group._poller(header, time.monotonic() + 60, "barrier", check_calls=False)(target)

    target = me.bump()  # the next phase, which the peer never reaches
    group = LocalGroup(me, (0, 1), 7, _LeavingPeer(None))
    with pytest.raises(TransportError, match="rank 0 lost rank 1"):
        group._poller(header, time.monotonic() + 60, "barrier", check_calls=False)(target)


class _FailedCall:
    """A compiled call that failed in single copy with arena rank 2 (FAILED, c.failure)."""

    failure = (errno.ESRCH, 2)


class _Told:
    """A transport that has read `notice` (an abort notice) and sees `lost` gone."""

    def __init__(self, lost: dict[int, str], notice: Exception | None = None) -> None:
        self.lost, self.notice = lost, notice

    def check_group(self, *args) -> None:
        if self.notice is not None:
            raise self.notice

    def lost_peers(self) -> dict[int, str]:
        return self.lost


@pytest.mark.parametrize(
    "lost,notice,expected",
    [
        # rank 2 raised for rank 0's loss and exited while rank 1 read its buffer
        ({0: "closed by peer", 2: "closed by peer"}, None, "rank 1 lost rank 0"),
        ({2: "closed by peer"}, "rank 2 lost rank 0", "rank 2 lost rank 0"),
        # nothing else known: the single copy's own error, naming the rank it read
        ({2: "closed by peer"}, None, "single-copy all_reduce with rank 2 failed: ESRCH"),
        ({}, None, "single-copy all_reduce with rank 2 failed: ESRCH"),
    ],
)
def test_a_single_copy_that_found_its_peer_gone_names_the_first_failure(
    lost, notice, expected
) -> None:
    """A peer's process gone in the middle of a single copy (ESRCH) is most often a peer
    that raised for another member's loss and exited: every survivor must name the rank
    that failed first, not the one that left after it."""
    from pycollective._errors import CollectiveError, TransportError
    from pycollective.runners.arena import LocalGroup
    from pycollective.runners.native import finish_call
    from pycollective.shm.native import FAILED
    from pycollective.transport._wire import DATA, Header

    seg = arena.Segment.create(arena.layout(3, 4096)[2])
    seg.unlink()
    me = arena.Arena(seg, 3, 1, 4096)
    told = _Told(lost, None if notice is None else CollectiveError(notice))
    group = LocalGroup(me, (0, 1, 2), 7, told)  # type: ignore[arg-type]
    header = Header(DATA, 1, 2, 0, 3, 7, 10, 0, 0, 1 << 18, 0)
    with pytest.raises((TransportError, CollectiveError), match=expected):
        finish_call(
            _FailedCall(), FAILED, group, header, time.monotonic() + 60, "all_reduce",
            "all_reduce", None,
        )  # fmt: skip
