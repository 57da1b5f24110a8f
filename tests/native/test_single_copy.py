"""The compiled arena's single-copy all_reduce, broadcast, all_gather and reduce_scatter
(csrc/arena.c run_single, and run_single_reads: scatter_reads, gather_reads, bcast_reads;
csrc/peermem.c):
results bit for bit the rank-order reference's (every
rank's input in rank order, in place too), calls of every size interleaved with the
arena's other collectives; a peer that announces a buffer we cannot reach fails the call
on every rank, within a bound, with TransportError; the set-up probe reaches only the
process that sent the nonce."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest
from tests._arena_ranks import run_on_new_arena

from pycollective import _dtypes
from pycollective._errors import TransportError
from pycollective._reduce_ops import ReduceOp, fused_reduce
from pycollective.shm import arena, native
from pycollective.transport import _wire

pytestmark = [
    pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm"),
    pytest.mark.skipif(
        os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0", reason="PYCOLLECTIVE_NATIVE=0"
    ),
]

SLOT = 4096
SMALL = 1024  # calls above this many bytes take single copy here
COUNTS = (0, 7, 300, 1000, 9000, 70001)
CASES = (
    ("float32", ReduceOp.SUM),
    ("float16", ReduceOp.SUM),
    ("bfloat16", ReduceOp.AVG),
    ("float64", ReduceOp.PRODUCT),
    ("int64", ReduceOp.MAX),
    ("int8", ReduceOp.AVG),
    ("complex64", ReduceOp.PRODUCT),
)


def _data(rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + n)
    if dtype.kind in "iu":
        return rng.integers(-50, 50, n).astype(dtype.numpy)
    real = rng.uniform(0.5, 1.5, n * (2 if dtype.kind == "c" else 1)).astype(np.float32)
    if dtype.name == "bfloat16":
        return (real.view(np.uint32) >> 16).astype(np.uint16).view(dtype.numpy)
    if dtype.kind == "c":
        return real.view(np.complex64).astype(dtype.numpy)
    return real.astype(dtype.numpy)


class _Rank:
    """One forked rank's compiled arena with single copy on, and its calls."""

    def __init__(self, name: str, nbytes: int, p: int, r: int, piece: int) -> None:
        seg = arena.Segment.attach(name, nbytes)
        self.a = arena.Arena(seg, p, r, SLOT)
        self.na = native.NativeArena(self.a, SMALL, SLOT)
        self.r, self.p, self.seq = r, p, 0
        self.deadline = time.monotonic() + 60
        self.a.ctrl[r * arena.WORDS + arena.PID] = os.getpid()
        self.call("barrier", _dtypes.BY_NAME["float32"], ReduceOp.SUM, -1, None)
        pids = [int(self.a.ctrl[q * arena.WORDS + arena.PID]) for q in range(p)]
        self.na.c.set_single_copy(1, piece, pids)

    def poll(self, target: int) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"rank {self.r} waited for phase {target} too long")

    def check(self, q: int, target: int) -> None:
        raise AssertionError(f"rank {self.r}: peer {q} announced another call")

    def call(self, coll: str, dtype, op, root: int, data, divisor: int = 0, inp=None) -> None:
        """`data`: the buffer, or the output of a call with an input (`inp`, whose count
        the call announces)."""
        count = int((data if inp is None else inp).size) if data is not None else 0
        hdr = (_wire.KIND_CODE[coll], dtype.code, count, root, int(op), 0)
        plan = self.na.plan(hdr[0], dtype.code, int(op), root, divisor, hdr)
        self.na.run(plan, inp, data, self.seq, None, self.poll, self.check, lambda: None)
        self.seq += 1


def _battery(name: str, nbytes: int, p: int, r: int, piece: int, out) -> None:
    try:
        me = _Rank(name, nbytes, p, r, piece)
        for dt_name, op in CASES:
            dtype = _dtypes.BY_NAME[dt_name]
            divisor = p if op is ReduceOp.AVG else 0
            for n in COUNTS:
                every = [_data(q, n, dtype) for q in range(p)]
                want = np.empty(n, dtype.numpy)
                fused_reduce(op, dtype, want, every, divisor)
                x = every[r].copy()
                me.call("all_reduce", dtype, op, -1, x, divisor)
                assert x.tobytes() == want.tobytes(), ("all_reduce", dt_name, n)
                announced = int(me.a.ctrl[r * arena.WORDS + arena.ADDR])  # single copy's
                assert announced == (x.ctypes.data if x.nbytes > SMALL else 0), (dt_name, n)
                # the arena's pipelines between single copies: the phases stay agreed
                x = every[r].copy()
                me.call("reduce", dtype, op, p - 1, x, divisor)
                assert x.tobytes() == (want if r == p - 1 else every[r]).tobytes(), ("reduce", n)
                for root in (0, p - 1):
                    x = every[r].copy()
                    me.call("broadcast", dtype, op, root, x)
                    assert x.tobytes() == every[root].tobytes(), ("broadcast", dt_name, n, root)
                    announced = int(me.a.ctrl[r * arena.WORDS + arena.ADDR])
                    assert announced == (x.ctypes.data if x.nbytes > SMALL else 0), (dt_name, n)
                gathered = np.concatenate(every)
                inp = every[r].copy()
                got = np.full(n * p, 77, dtype.numpy)
                me.call("all_gather", dtype, op, -1, got, inp=inp)
                assert got.tobytes() == gathered.tobytes(), ("all_gather", dt_name, n)
                announced = int(me.a.ctrl[r * arena.WORDS + arena.ADDR])
                assert announced == (inp.ctypes.data if inp.nbytes > SMALL else 0), (dt_name, n)
                got = np.full(n * p, 77, dtype.numpy)
                got[r * n : (r + 1) * n] = every[r]  # in place: the input is our block
                me.call("all_gather", dtype, op, -1, got, inp=got[r * n : (r + 1) * n])
                assert got.tobytes() == gathered.tobytes(), ("all_gather in place", dt_name, n)
                # reduce_scatter: every rank's input is p blocks of n; block r is ours
                inputs = [
                    np.concatenate([_data(10 * q + b, n, dtype) for b in range(p)])
                    for q in range(p)
                ]
                want_block = np.empty(n, dtype.numpy)
                fused_reduce(
                    op, dtype, want_block, [x[r * n : (r + 1) * n] for x in inputs], divisor
                )
                block = np.full(n, 77, dtype.numpy)
                me.call("reduce_scatter", dtype, op, -1, block, divisor, inp=inputs[r])
                assert block.tobytes() == want_block.tobytes(), ("reduce_scatter", dt_name, n)
                announced = int(me.a.ctrl[r * arena.WORDS + arena.ADDR])
                assert announced == (inputs[r].ctypes.data if block.nbytes > SMALL else 0), n
        out.put((r, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p,piece", [(2, 128), (2, 64 << 10), (3, 192)])
def test_single_copy_matches_the_reference(p: int, piece: int) -> None:
    results = run_on_new_arena(p, SLOT, _battery, lambda r: (piece,))
    assert results == {r: None for r in range(p)}


BCAST_SINGLE_MAX = 16 << 20  # csrc/arena.c BCAST_SINGLE_MAX_BYTES


def _announced(me: _Rank, buf: np.ndarray) -> bool:
    """Whether the rank's last call announced `buf` to its peers for single copy."""
    return int(me.a.ctrl[me.r * arena.WORDS + arena.ADDR]) == buf.ctypes.data


def _large_broadcasts(name: str, nbytes: int, p: int, r: int, out) -> None:
    """Broadcasts at single copy's cap and just past it: by single copy, then by the
    arena's pipeline (announced address 0); the root's bits either way."""
    try:
        me = _Rank(name, nbytes, p, r, 64 << 10)
        dtype = _dtypes.BY_NAME["float32"]
        seen = []
        for n in (BCAST_SINGLE_MAX // 4, BCAST_SINGLE_MAX // 4 + 1):
            want = np.arange(n, dtype=np.float32)
            x = want.copy() if r == 0 else np.zeros(n, np.float32)
            me.call("broadcast", dtype, ReduceOp.SUM, 0, x)
            assert x.tobytes() == want.tobytes(), n
            seen.append(_announced(me, x))
        out.put((r, seen))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(120)
def test_a_broadcast_past_the_cap_goes_through_the_arena() -> None:
    results = run_on_new_arena(2, SLOT, _large_broadcasts, lambda r: ())
    assert results == {0: [True, False], 1: [True, False]}


def _all_reduces_about_their_threshold(name: str, nbytes: int, p: int, r: int, out) -> None:
    """With all_reduce's own threshold above the other collectives' (set_single_copy's
    reduce_min_bytes), an all_reduce just below it goes through the arena's pipeline
    (announced address 0) and one at it by single copy, while an all_gather below it still
    goes by single copy; the reference's bits every time."""
    try:
        me = _Rank(name, nbytes, p, r, 4096)
        threshold = 4 * SMALL
        me.na.c.set_single_copy(
            1, 4096, [int(me.a.ctrl[q * arena.WORDS + arena.PID]) for q in range(p)], threshold
        )
        dtype = _dtypes.BY_NAME["float32"]
        seen = []
        for n in (threshold // 4 - 1, threshold // 4):
            every = [_data(q, n, dtype) for q in range(p)]
            want = np.empty(n, dtype.numpy)
            fused_reduce(ReduceOp.SUM, dtype, want, every, 0)
            x = every[r].copy()
            me.call("all_reduce", dtype, ReduceOp.SUM, -1, x)
            assert x.tobytes() == want.tobytes(), n
            seen.append(_announced(me, x))
        inp = _data(r, SMALL, dtype)
        got = np.empty(SMALL * p, np.float32)
        me.call("all_gather", dtype, ReduceOp.SUM, -1, got, inp=inp)
        assert got.tobytes() == np.concatenate([_data(q, SMALL, dtype) for q in range(p)]).tobytes()
        seen.append(_announced(me, inp))
        out.put((r, seen))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(120)
def test_all_reduce_goes_by_single_copy_from_its_own_threshold() -> None:
    results = run_on_new_arena(2, SLOT, _all_reduces_about_their_threshold, lambda r: ())
    assert results == {0: [False, True, True], 1: [False, True, True]}


def _rogue_or_victim(name: str, nbytes: int, p: int, r: int, coll: str, out) -> None:
    """Rank 0 runs single copy; rank 1 speaks the arena's protocol from Python and
    announces the call (`coll`) with a buffer address nothing is mapped at."""
    try:
        dtype = _dtypes.BY_NAME["float32"]
        n = 4096
        if r == 0:
            me = _Rank(name, nbytes, p, r, 4096)
            x = np.ones(n, np.float32)
            t0 = time.monotonic()
            try:
                if coll == "all_gather":
                    me.call(coll, dtype, ReduceOp.SUM, -1, np.ones(n * p, np.float32), inp=x)
                elif coll == "reduce_scatter":
                    me.call(coll, dtype, ReduceOp.SUM, -1, x, inp=np.ones(n * p, np.float32))
                elif coll == "broadcast":  # from the rogue
                    me.call(coll, dtype, ReduceOp.SUM, 1, x)
                else:
                    me.call(coll, dtype, ReduceOp.SUM, -1, x)
            except TransportError as exc:
                out.put((r, ("raised", str(exc), time.monotonic() - t0)))
                return
            out.put((r, ("returned", x[:4].tolist())))
            return
        a = arena.Arena(arena.Segment.attach(name, nbytes), p, r, SLOT)
        a.ctrl[r * arena.WORDS + arena.PID] = os.getpid()
        deadline = time.monotonic() + 30

        def wait(target: int) -> None:
            while a.lagging(target):
                if time.monotonic() > deadline:
                    raise TimeoutError("rank 0 never came")
                time.sleep(0.0001)

        wait(a.bump())  # rank 0's barrier
        count = n * p if coll == "reduce_scatter" else n  # (as _Rank.call announces it)
        root = 1 if coll == "broadcast" else -1
        a.announce(1, _wire.KIND_CODE[coll], dtype.code, count, root, int(ReduceOp.SUM), 0)
        a.ctrl[r * arena.WORDS + arena.ADDR] = 4096  # the first page: never mapped
        wait(a.bump())  # phase 0: announced
        a.ctrl[r * arena.WORDS + arena.SC_ERR] = 0  # it even claims all went well
        wait(a.bump())  # the last phase
        theirs = int(a.ctrl[0 * arena.WORDS + arena.SC_ERR])
        out.put((r, ("rogue saw", theirs)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("coll", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"])
def test_a_peer_announcing_an_unreachable_buffer_fails_the_call_on_every_rank(coll: str) -> None:
    results = run_on_new_arena(2, SLOT, _rogue_or_victim, lambda r: (coll,))
    victim, rogue = results[0], results[1]
    assert victim[0] == "raised", victim
    assert "EFAULT" in victim[1] and "rank 1" in victim[1], victim[1]
    assert f"single-copy {coll}" in victim[1], victim[1]
    assert victim[2] < 10, victim
    # rank 0 told the peer through the last phase why (an honest peer would raise too):
    # the errno, and above it 1 + the rank whose buffer it could not reach (rank 1)
    assert rogue == ("rogue saw", errno.EFAULT | (1 + 1) << 32), rogue


def test_the_probe_reaches_only_the_process_that_holds_the_nonce() -> None:
    nonce = np.frombuffer(os.urandom(8), np.uint8).copy()
    addr = nonce.ctypes.data
    assert native.probe_peer(os.getpid(), addr, nonce.tobytes())
    assert not native.probe_peer(os.getpid(), addr, bytes(8) if nonce.any() else b"\1" * 8)
    assert not native.probe_peer(os.getppid(), addr, nonce.tobytes())  # another process
    assert not native.probe_peer(os.getpid(), 4096, nonce.tobytes())  # nothing mapped there
    for pid in (0, -1, 1 << 40):
        assert not native.probe_peer(pid, addr, nonce.tobytes())
    assert not native.probe_peer(os.getpid(), 0, nonce.tobytes())


def test_peer_read_bounds_what_it_reads() -> None:
    from pycollective import _native

    with pytest.raises(ValueError, match="4096"):
        _native.peer_read(os.getpid(), 4096, 4097)
    with pytest.raises(ValueError):
        _native.peer_read(-5, 4096, 8)
    with pytest.raises(OSError) as info:
        _native.peer_read(os.getpid(), 4096, 8)
    assert info.value.errno == errno.EFAULT


def test_set_single_copy_checks_its_arguments() -> None:
    seg = arena.Segment.create(arena.layout(2, SLOT)[2])
    try:
        a = arena.Arena(seg, 2, 0, SLOT)
        a.init_header()
        c = native.NativeArena(a, SMALL, SLOT).c
        with pytest.raises(ValueError, match="multiple of 64"):
            c.set_single_copy(1, 100, [1, 2])
        with pytest.raises(ValueError, match="expected 2 pids"):
            c.set_single_copy(1, 4096, [1])
        with pytest.raises(ValueError, match="no process"):
            c.set_single_copy(1, 4096, [os.getpid(), 0])
        with pytest.raises(ValueError, match="reduce_min_bytes >= 0"):
            c.set_single_copy(1, 4096, [os.getpid(), os.getpid()], -1)
        with pytest.raises(TypeError, match="reduce_min_bytes"):
            c.set_single_copy(1, 4096, [os.getpid(), os.getpid()], 1, 2)
        c.set_single_copy(0, 4096, [0, 0])  # off: no pids needed
    finally:
        seg.unlink()


def _worker_or_idler(name: str, nbytes: int, p: int, r: int, word: int, out) -> None:
    """Rank 0 runs single copy; rank 1 enters the call (its buffer announced) and then takes
    no piece at all, as a rank the scheduler holds back would not: rank 0 claims every
    piece, and both buffers must hold the reference's result. Rank 1 then writes `word`
    as its error word (0: none; tests/security/test_shm_words.py writes hostile ones), and
    rank 0 reports what it raised, if anything."""
    try:
        dtype = _dtypes.BY_NAME["float32"]
        n = 70001
        every = [_data(q, n, dtype) for q in range(p)]
        want = np.empty(n, np.float32)
        fused_reduce(ReduceOp.SUM, dtype, want, every, 0)
        if r == 0:
            me = _Rank(name, nbytes, p, r, 4096)
            x = every[0].copy()
            try:
                me.call("all_reduce", dtype, ReduceOp.SUM, -1, x)
            except TransportError as exc:
                out.put((r, ("raised", str(exc))))
                return
            out.put((r, x.tobytes() == want.tobytes()))
            return
        a = arena.Arena(arena.Segment.attach(name, nbytes), p, r, SLOT)
        a.ctrl[r * arena.WORDS + arena.PID] = os.getpid()
        deadline = time.monotonic() + 30

        def wait(target: int) -> None:
            while a.lagging(target):
                if time.monotonic() > deadline:
                    raise TimeoutError("rank 0 never came")
                time.sleep(0.0001)

        x = every[1].copy()
        wait(a.bump())  # rank 0's barrier
        a.announce(1, _wire.KIND_CODE["all_reduce"], dtype.code, n, -1, int(ReduceOp.SUM), 0)
        a.ctrl[r * arena.WORDS + arena.ADDR] = x.ctypes.data
        wait(a.bump())  # phase 0; then no piece taken here
        target = a.epoch + 1
        wait(target)  # rank 0 has done every piece and entered the last phase
        a.ctrl[r * arena.WORDS + arena.SC_ERR] = word
        a.bump()
        out.put((r, x.tobytes() == want.tobytes()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(60)
def test_a_rank_that_takes_no_piece_leaves_them_all_to_its_peer() -> None:
    assert run_on_new_arena(2, SLOT, _worker_or_idler, lambda r: (0,)) == {0: True, 1: True}
