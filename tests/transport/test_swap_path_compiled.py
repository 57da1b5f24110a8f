"""The compiled path of repeated small swaps (csrc/swappath.c `SwapPath`) in process: two
TCPTransports over a socket pair, rank 0's calls through SwapPath in front of a stub of
runners/swap.py's SwapFast (which real jobs use: tests/transport/test_swap_path.py), rank 1
exchanging the regular way. A plain call is reduced in C and leaves the transport as
`swap` leaves it; anything else is declined untouched (the stub's all_reduce runs) or,
once started, handed over with what the round left; a field of the transport it reads
that goes missing raises."""

from __future__ import annotations

import threading
import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from tests.transport.test_swap_path import _data_header, _regular, _transports

from pycollective._dtypes import BY_NAME
from pycollective._reduce_ops import ReduceOp, fold_codes
from pycollective.observe.flight import COMPLETED, RUNNING, Entry
from pycollective.observe.timeline import WAIT
from pycollective.transport import _wire
from pycollective.transport._base import OutMessage

_native = pytest.importorskip("pycollective._native")

N = 4  # float32 items a call
NBYTES = 4 * N


class _Fallback:
    """SwapFast's side of the protocol, recording what the compiled path gives it."""

    def __init__(self, t) -> None:
        self.t = t
        self.into = memoryview(bytearray(NBYTES))
        self.declined = 0
        self.handovers: list[tuple] = []
        self.calls = self.handed = self.folded = self.size = 0

    def add(self, obj, key, plan, prepared, entry) -> bool:
        return True

    def compiled_spec(self, obj, key) -> tuple | None:
        conn, fd = self.t.compiled_conn(1, NBYTES)
        h = _data_header(0, NBYTES)
        codes = fold_codes(ReduceOp.SUM, BY_NAME["float32"])
        return ("the sig", self.into, 1, conn, fd, h, h.pack(), *codes)

    def all_reduce(self, obj, op) -> bool:
        self.declined += 1
        return False

    def hand_over(self, sig, obj, header, result, seq, entry, started) -> None:
        self.handovers.append((sig, header, result, seq))

    def forget(self) -> None:
        pass


def _setup():
    t0, t1, _, _ = _transports()
    t0._spin = 1e-3  # at its first call (then at most SPIN_MAX): the peer's frame is there
    fallback = _Fallback(t0)
    group = _native.GroupState()
    engine = _native.EngineState(threading.RLock(), deque(), [])
    path = t0.compiled_path(fallback, group, engine, None, Entry, RUNNING, COMPLETED)
    assert type(path) is _native.SwapPath
    x = np.arange(N, dtype=np.float32)
    assert path.add(x, ReduceOp.SUM, None, None, None) is True
    return t0, t1, fallback, group, engine, path


def _peer(t1, seq: int, payload: np.ndarray) -> tuple[threading.Thread, bytearray]:
    """Rank 1's regular exchange of call `seq`, its frame on the wire before rank 0 calls."""
    got = bytearray(NBYTES)
    h = _data_header(seq, NBYTES)
    th = threading.Thread(
        target=_regular, args=(t1, h, payload.tobytes(), got, time.monotonic() + 10)
    )
    th.start()
    time.sleep(0.05)
    return th, got


def _nothing_sent_to(t1) -> None:
    sock = t1._conns[0].sock
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(1)


@pytest.mark.timeout(30)
def test_repeated_calls_are_reduced_in_c_and_leave_the_transport_as_swap_does() -> None:
    t0, t1, fallback, group, _, path = _setup()
    for seq in range(3):
        x = np.arange(N, dtype=np.float32) + seq
        y = np.full(N, 10.0 * (seq + 1), dtype=np.float32)
        th, got = _peer(t1, seq, y)
        assert path.all_reduce(x, ReduceOp.SUM) is True
        th.join()
        assert np.array_equal(x, np.arange(N, dtype=np.float32) + seq + y)
        assert bytes(got) == (np.arange(N, dtype=np.float32) + seq).tobytes()
        assert group.seq == seq + 1
        conn = t0._conns[1]
        assert conn.last == _data_header(seq, NBYTES) and type(conn.last) is _wire.Header
        assert (conn.rpos, conn.rend) == (0, 0)
        assert t0._calls.current(77) == _data_header(seq, NBYTES)  # the tracker's view
        assert t0.swap_ready(1, _data_header(seq + 1, NBYTES))
    assert (path.compiled, path.calls, path.folded, path.handed) == (3, 3, 3, 0)
    assert fallback.declined == 0 and not fallback.handovers
    assert t0._spin == pytest.approx(200e-6)  # the budget grew to its most, as _took's
    t0.close()
    t1.close()


def _queued(t0, group, engine) -> None:
    h = _data_header(9, 4)
    t0._conns[1].outq.append(OutMessage(1, h, memoryview(bytearray(4))))


DECLINES = {
    "send queued": _queued,
    "bytes unread": lambda t0, g, e: setattr(t0._conns[1], "rend", 5),
    "interrupted": lambda t0, g, e: setattr(t0, "_interrupted", "stop"),
    "frame kept early": lambda t0, g, e: t0._unexpected.setdefault(("k",), deque()),
    "receive posted": lambda t0, g, e: t0._posted.setdefault((1, ("k",)), deque()),
    "abort reported": lambda t0, g, e: t0._aborted.setdefault(77, RuntimeError("x")),
    "swap pending": lambda t0, g, e: setattr(t0, "_swap", ()),
    "timeline on": lambda t0, g, e: setattr(WAIT, "on", True),
    "group failed": lambda t0, g, e: setattr(g, "failed", RuntimeError("x")),
    "engine busy": lambda t0, g, e: setattr(e, "running", True),
    "engine queued": lambda t0, g, e: e.queue.append(object()),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("why", list(DECLINES))
def test_a_call_it_cannot_take_goes_to_swapfast_untouched(why: str) -> None:
    t0, t1, fallback, group, engine, path = _setup()
    DECLINES[why](t0, group, engine)
    try:
        x = np.arange(N, dtype=np.float32)
        assert path.all_reduce(x, ReduceOp.SUM) is False  # what SwapFast said
    finally:
        WAIT.on = False
    assert fallback.declined == 1 and path.compiled == 0
    assert group.seq == 0 and np.array_equal(x, np.arange(N, dtype=np.float32))
    _nothing_sent_to(t1)
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_another_signature_goes_to_swapfast() -> None:
    t0, t1, fallback, group, _, path = _setup()
    for x, op in [
        (np.arange(N + 1, dtype=np.float32), ReduceOp.SUM),  # another length
        (np.arange(N, dtype=np.int32), ReduceOp.SUM),  # another dtype
        (np.arange(N, dtype=np.float32), ReduceOp.MAX),  # another op object
        (np.arange(N, dtype=np.float32).reshape(2, 2), ReduceOp.SUM),  # another shape
        (np.arange(N, dtype=np.float32)[None].repeat(2, 0)[:, 0], ReduceOp.SUM),  # strided
        (np.frombuffer(bytes(NBYTES), np.float32), ReduceOp.SUM),  # read-only
    ]:
        assert path.all_reduce(x, op) is False
    assert fallback.declined == 6 and group.seq == 0
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_round_that_is_not_plain_is_handed_over_with_what_it_left() -> None:
    """No frame from the peer within the budget: the call is started (its sequence number
    taken, our frame sent), the engine is this thread's, and SwapFast.hand_over gets the
    round's result; settled the regular way, the swap finishes when the peer's frame
    comes."""
    t0, t1, fallback, group, engine, path = _setup()
    t0._spin = 0.0  # one read
    x = np.arange(N, dtype=np.float32)
    assert path.all_reduce(x, ReduceOp.SUM) is True
    ((sig, header, result, seq),) = fallback.handovers
    assert sig == "the sig" and seq == 0 and header == _data_header(0, NBYTES)
    sent, end, send_err, recv_status, spun, landed = result
    assert (sent, end, send_err, recv_status, landed) == (_wire.SIZE + NBYTES, 0, 0, 0, 0)
    assert engine.running is True and engine.owner == threading.get_ident()
    assert group.seq == 1 and path.handed == 1
    t0.swap_settle(1, header, memoryview(x).cast("B"), fallback.into, result)
    y = np.full(N, 5.0, dtype=np.float32)
    got = bytearray(NBYTES)
    th = threading.Thread(
        target=_regular, args=(t1, header, y.tobytes(), got, time.monotonic() + 10)
    )
    th.start()
    t0.swap_finish(time.monotonic() + 10)
    th.join()
    assert bytes(fallback.into) == y.tobytes() and bytes(got) == x.tobytes()
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_probe_that_disagrees_hands_the_call_over_with_the_mismatch() -> None:
    """The call tracker's `begin` raises for a peer's PROBE of this call with another
    count: nothing is sent, and SwapFast.hand_over gets the error to raise."""
    t0, t1, fallback, group, _, path = _setup()
    t0._calls._probes[(77, 1)] = _data_header(0, NBYTES)._replace(count=99)
    x = np.arange(N, dtype=np.float32)
    assert path.all_reduce(x, ReduceOp.SUM) is True
    ((_, header, error, _),) = fallback.handovers
    assert header.seq == 0 and "count" in str(error)
    _nothing_sent_to(t1)
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_transport_field_it_reads_that_goes_missing_raises_naming_it() -> None:
    t0, t1, _, _, _, path = _setup()
    del t0.__dict__["_posted_any"]
    with pytest.raises(RuntimeError, match="_posted_any"):
        path.all_reduce(np.arange(N, dtype=np.float32), ReduceOp.SUM)
    t0._posted_any = {}
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_it_is_refused_over_a_transport_without_a_field_it_reads() -> None:
    t0, t1, _, _ = _transports()
    del t0.__dict__["_closed"]
    group = _native.GroupState()
    engine = _native.EngineState(threading.RLock(), deque(), [])
    with pytest.raises(TypeError, match="_closed"):
        t0.compiled_path(_Fallback(t0), group, engine, None, Entry, RUNNING, COMPLETED)
    t0._closed = False
    bad_recorder = SimpleNamespace(capacity=-1, _ring=[])
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        t0.compiled_path(_Fallback(t0), group, engine, bad_recorder, Entry, RUNNING, COMPLETED)
    with pytest.raises(ValueError, match="offset"):
        _native.SwapPath(_Fallback(t0), group, engine, None, Entry, RUNNING, COMPLETED, t0,
                         type(t0._conns[1]), _wire.Header, 60, WAIT, 200e-6)  # fmt: skip
    t0.close()
    t1.close()


class _SettleFails:
    """A transport whose settling raises: what SwapFast.hand_over must still finish."""

    def __init__(self) -> None:
        self.refused: list[tuple] = []

    def swap_settle(self, *args) -> None:
        raise OSError("the settling failed")

    def swap_refused(self, header, error) -> None:
        self.refused.append((header, error))


@pytest.mark.parametrize("settle_fails", [True, False], ids=["settle-raises", "refused"])
def test_hand_over_always_reaches_finish(settle_fails: bool) -> None:
    """`finish` alone frees the engine and fails the call on every rank: SwapFast.hand_over
    reaches it with the error whether the round's settling raised or the call tracker
    refused the call (C passes that error as the result)."""
    from pycollective.runners.swap import SwapFast  # noqa: PLC0415

    transport = _SettleFails()
    finished = []
    group = SimpleNamespace(world=None, state=None)
    fast = SwapFast(group, None, SimpleNamespace(enabled=False),
                    lambda *a: finished.append(a), transport)  # fmt: skip
    g = SimpleNamespace(peer=1, into=memoryview(bytearray(NBYTES)), prepared="prepared")
    header = _data_header(5, NBYTES)
    result = (0, 0, 0, 0, 0, 0) if settle_fails else RuntimeError("a probe disagrees")
    fast.hand_over(g, np.zeros(N, np.float32), header, result, 5, None, 1.0)
    ((h, error),) = transport.refused
    assert h == header
    assert str(error) == ("the settling failed" if settle_fails else "a probe disagrees")
    ((prepared, seq, entry, status, started),) = finished
    assert (prepared, seq, entry, started, status.sig) == ("prepared", 5, None, 1.0, g)
