"""The receive helper (transport/tcp/receiver.py): a large payload is read by its thread
while the exchange reduces the pieces already in (a sink) or waits (a plain receive, read
in place); the bytes arrive whole and in order, and a peer lost, stalled or interrupted
mid-payload ends the exchange with the usual error within bounds, the helper let go
(nothing reads a closed socket, no thread left after close). Ranks are threads of this
process over loopback."""

from __future__ import annotations

import re
import socket
import threading
import time

import numpy as np
import pytest
from tests.transport.test_conformance import _both, _data

from pycollective import CollectiveTimeout, TransportError, _config
from pycollective._load import MachineLoad
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import receiving


def _started(t, mode: str = "1") -> list[int]:
    """Count the payloads handed to `t`'s receive helper, which `mode` switches as
    PYCOLLECTIVE_TCP_RECV_HELPER does (1: whatever the machine's load)."""
    t._reader_mode = mode
    calls: list[int] = []
    start = t._reader.start

    def counting(sock, nbytes, piece, into=None):
        calls.append(nbytes)
        start(sock, nbytes, piece, into)

    t._reader.start = counting
    return calls


def _sink(n: int, peer: int = 1) -> tuple[InMessage, list[bytes]]:
    """A receive of `n` bytes from `peer` whose pieces are kept, in order, as they come."""
    pieces: list[bytes] = []

    def keep(piece: memoryview) -> None:
        pieces.append(bytes(piece))

    return InMessage(peer, _data(1, 0, n), memoryview(bytearray(n)), sink=keep), pieces


def _let_go(t) -> None:
    assert not t._reader.busy and t._reader_conn is None
    assert all(not c.reader for c in t._conns.values())


@pytest.mark.timeout(60)
def test_large_reduction_both_ways_is_whole_in_order_and_uses_the_helper(pair) -> None:
    t0, t1 = pair
    n = (16 << 20) + 4096  # a short last piece
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 255, n, np.uint8), rng.integers(0, 255, n, np.uint8)
    h = _data(1, 0, n)
    used = _started(t0), _started(t1)
    for _ in range(3):  # repeated: the helper is taken back and handed out again
        (m0, got0), (m1, got1) = _sink(n, 1), _sink(n, 0)
        errs = _both(
            lambda: t0.exchange([OutMessage(1, h, memoryview(a))], [m0],  # noqa: B023
                                time.monotonic() + 20, 77),
            lambda: t1.exchange([OutMessage(0, h, memoryview(b))], [m1],  # noqa: B023
                                time.monotonic() + 20, 77),
        )  # fmt: skip
        assert errs == [None, None]
        assert b"".join(got0) == b.tobytes() and b"".join(got1) == a.tobytes()
        assert all(len(p) % 4096 == 0 for p in got0 + got1)  # whole pieces only
    assert all(used), "a payload did not go through a receive helper"
    for t in pair:
        _let_go(t)


@pytest.mark.timeout(60)
def test_small_payloads_stay_on_the_exchange_thread(pair) -> None:
    t0, t1 = pair
    n = receiving.RECV_HELPER_BYTES - 1
    used = _started(t0)
    m, pieces = _sink(n)
    payload = np.arange(n, dtype=np.uint8)
    errs = _both(
        lambda: t0.exchange([], [m], time.monotonic() + 20, 77),
        lambda: t1.exchange([OutMessage(0, _data(1, 0, n), memoryview(payload))], [],
                            time.monotonic() + 20, 77),
    )  # fmt: skip
    assert errs == [None, None] and b"".join(pieces) == payload.tobytes()
    assert not used


def _one_way(t0, t1, n: int) -> None:
    """`n` bytes from t1 to t0's sink, checked whole."""
    m, pieces = _sink(n)
    payload = np.arange(n, dtype=np.uint8)
    errs = _both(
        lambda: t0.exchange([], [m], time.monotonic() + 20, 77),
        lambda: t1.exchange([OutMessage(0, _data(1, 0, n), memoryview(payload))], [],
                            time.monotonic() + 20, 77),
    )  # fmt: skip
    assert errs == [None, None] and b"".join(pieces) == payload.tobytes()


@pytest.mark.timeout(60)
def test_the_helper_follows_the_machines_load_or_the_switch(pair, tmp_path) -> None:
    t0, t1 = pair
    n = receiving.RECV_HELPER_BYTES * 2
    loadavg = tmp_path / "loadavg"
    t0._reader_load = MachineLoad(cpus=2, path=str(loadavg))
    # auto: more runnable tasks than `cpus` besides the deciding thread itself (and the
    # send helper, idle here for a one-way receive).
    for mode, runnable, wanted in (("0", 9, False), ("auto", 3, False), ("auto", 4, True),
                                   ("1", 1, True)):  # fmt: skip
        loadavg.write_text(f"0.5 0.5 0.5 {runnable}/300 1234\n")
        t0._reader_load._next = 0.0  # read the file again now
        used = _started(t0, mode)
        _one_way(t0, t1, n)
        assert bool(used) is wanted, (mode, runnable)
        _let_go(t0)


@pytest.mark.timeout(60)
def test_pieces_whose_ends_arrive_apart_still_go_to_the_helper(pair) -> None:
    """The sender pauses a few bytes short of every piece boundary (as a loaded machine's
    reads end anywhere): the tail of a piece is read into the piece, not into the read
    buffer with the next piece's start, so a boundary is reached with nothing read ahead
    and the helper takes the rest there."""
    t0, t1 = pair
    n = receiving.RECV_HELPER_BYTES * 2
    used = _started(t0, "1")
    m, pieces = _sink(n)
    payload = np.arange(n, dtype=np.uint8)
    sock = t1._conns[0].sock
    stream = memoryview(_data(1, 0, n).pack() + payload.tobytes())
    head = len(stream) - n
    pauses = [head + k * receiving.SINK_BYTES - 100 for k in range(1, n // receiving.SINK_BYTES)]

    def write() -> None:
        done = 0
        for end in [*pauses, len(stream)]:
            while done < end:
                try:
                    done += sock.send(stream[done:end])
                except BlockingIOError:
                    time.sleep(0.001)
            time.sleep(0.05)  # the reader drains what came and waits in the selector

    w = threading.Thread(target=write)
    w.start()
    t0.exchange([], [m], time.monotonic() + 20, 77)
    w.join(10)
    assert b"".join(pieces) == payload.tobytes()
    assert used, "no piece boundary was reached clean: the helper never took the payload"
    _let_go(t0)


def test_the_switch_is_checked() -> None:
    with pytest.raises(ValueError, match=re.escape("auto | 1 | 0")) as err:
        _config.get("PYCOLLECTIVE_TCP_RECV_HELPER", {"PYCOLLECTIVE_TCP_RECV_HELPER": "maybe"})
    assert "PYCOLLECTIVE_TCP_RECV_HELPER" in str(err.value) and "'maybe'" in str(err.value)
    assert _config.get("PYCOLLECTIVE_TCP_RECV_HELPER", {}) == "auto"
    on = {"PYCOLLECTIVE_TCP_RECV_HELPER": "on"}
    assert _config.get("PYCOLLECTIVE_TCP_RECV_HELPER", on) == "1"


@pytest.mark.timeout(60)
def test_peer_lost_mid_payload_raises_naming_it_and_the_helper_lets_go(pair) -> None:
    t0, t1 = pair
    n = 256 << 20  # t1 sends it and is gone part way
    used = _started(t0)
    m, _ = _sink(n)

    def peer_goes() -> None:
        deadline = time.monotonic() + 20
        while not used and time.monotonic() < deadline:  # the helper reads the payload
            time.sleep(0.005)
        for c in t1._conns.values():
            c.sock.shutdown(socket.SHUT_RDWR)  # t0 reads the end of the stream, as of a crash

    goes = threading.Thread(target=peer_goes)
    goes.start()
    start = time.monotonic()
    errs = _both(
        lambda: t0.exchange([], [m], time.monotonic() + 20, 77),
        lambda: t1.exchange([OutMessage(0, _data(1, 0, n), memoryview(np.zeros(n, np.uint8)))],
                            [], time.monotonic() + 20, 77),
    )  # fmt: skip
    goes.join(30)
    assert used, "the helper never had the payload"
    assert isinstance(errs[0], TransportError) and errs[0].peer == 1, errs
    assert "closed by peer" in str(errs[0]) or "connection error" in str(errs[0])
    assert time.monotonic() - start < 10
    _let_go(t0)
    assert t0._conns[1].lost is not None


def _stall_mid_payload(t1, n: int, sent: int, fill: int = 0) -> threading.Thread:
    """t1 writes a frame's header and `sent` bytes (of `fill`) of its `n`-byte payload,
    then nothing."""
    sock = t1._conns[0].sock

    def write() -> None:
        data = _data(1, 0, n).pack() + bytes([fill]) * sent
        view, done = memoryview(data), 0
        while done < len(data):
            try:
                done += sock.send(view[done:])
            except BlockingIOError:
                time.sleep(0.001)

    w = threading.Thread(target=write)
    w.start()
    return w


@pytest.mark.timeout(60)
def test_a_peer_stalled_mid_payload_times_out_within_bounds(pair) -> None:
    t0, t1 = pair
    n, sent = 16 << 20, (5 << 20) + 1000  # stalls inside a piece
    used = _started(t0)
    m, pieces = _sink(n)
    w = _stall_mid_payload(t1, n, sent)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout):
        t0.exchange([], [m], time.monotonic() + 1.5, 77, "all_reduce")
    assert time.monotonic() - start < 3.0
    w.join(10)
    assert used
    assert sum(map(len, pieces)) == 5 << 20  # the whole pieces were reduced, in order
    _let_go(t0)
    assert "abandoned mid-message" in (t0._conns[1].lost or "")


@pytest.mark.timeout(60)
def test_interrupt_mid_payload_raises_promptly(pair) -> None:
    t0, t1 = pair
    n = 16 << 20
    used = _started(t0)
    m, _ = _sink(n)
    w = _stall_mid_payload(t1, n, 3 << 20)

    def destroy() -> None:
        deadline = time.monotonic() + 20
        while not used and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
        t0.interrupt("the group was destroyed")

    d = threading.Thread(target=destroy)
    d.start()
    start = time.monotonic()
    with pytest.raises(TransportError, match="destroyed"):
        t0.exchange([], [m], time.monotonic() + 20, 77)
    assert time.monotonic() - start < 5
    d.join(10)
    w.join(10)
    _let_go(t0)


@pytest.mark.timeout(60)
def test_close_ends_the_thread(pair) -> None:
    t0, t1 = pair
    n = 16 << 20
    _started(t0)
    m, _ = _sink(n)
    errs = _both(
        lambda: t0.exchange([], [m], time.monotonic() + 20, 77),
        lambda: t1.exchange([OutMessage(0, _data(1, 0, n), memoryview(bytearray(n)))], [],
                            time.monotonic() + 20, 77),
    )  # fmt: skip
    assert errs == [None, None]
    thread = t0._reader._thread
    assert thread is not None and thread.is_alive()
    t0.close()
    thread.join(2)
    assert not thread.is_alive()


@pytest.mark.timeout(60)
def test_large_plain_receive_is_read_in_place_both_ways(pair) -> None:
    t0, t1 = pair
    n = (16 << 20) + 12
    rng = np.random.default_rng(9)
    a, b = rng.integers(0, 255, n, np.uint8), rng.integers(0, 255, n, np.uint8)
    h = _data(1, 0, n)
    used = _started(t0), _started(t1)
    landed: list[int] = []
    for _ in range(2):
        landed.clear()
        got0, got1 = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        m0 = InMessage(1, h, memoryview(got0), on_data=landed.append)
        errs = _both(
            lambda: t0.exchange([OutMessage(1, h, memoryview(a))], [m0],  # noqa: B023
                                time.monotonic() + 20, 77),
            lambda: t1.exchange([OutMessage(0, h, memoryview(b))],
                                [InMessage(0, h, memoryview(got1))],  # noqa: B023
                                time.monotonic() + 20, 77),
        )  # fmt: skip
        assert errs == [None, None]
        assert np.array_equal(got0, b) and np.array_equal(got1, a)
    assert all(used), "a payload did not go through a receive helper"
    assert landed == sorted(landed) and landed[-1] == n  # told as bytes land, in order
    for t in pair:
        _let_go(t)


@pytest.mark.timeout(60)
def test_plain_receive_peer_stalled_keeps_what_landed_and_times_out(pair) -> None:
    t0, t1 = pair
    n, sent = 16 << 20, (3 << 20) + 777
    used = _started(t0)
    dest = np.zeros(n, np.uint8)
    landed: list[int] = []
    m = InMessage(1, _data(1, 0, n), memoryview(dest), on_data=landed.append)
    w = _stall_mid_payload(t1, n, sent, fill=7)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout):
        t0.exchange([], [m], time.monotonic() + 1.5, 77, "all_reduce")
    assert time.monotonic() - start < 3.0
    w.join(10)
    assert used
    assert landed[-1] == sent and (dest[:sent] == 7).all() and not dest[sent:].any()
    _let_go(t0)
    assert "abandoned mid-message" in (t0._conns[1].lost or "")


@pytest.mark.timeout(60)
def test_plain_receive_peer_lost_raises_naming_it(pair) -> None:
    t0, t1 = pair
    n = 64 << 20
    used = _started(t0)
    m = InMessage(1, _data(1, 0, n), memoryview(np.empty(n, np.uint8)))
    w = _stall_mid_payload(t1, n, 4 << 20)

    def peer_goes() -> None:
        w.join(20)
        deadline = time.monotonic() + 20
        while not used and time.monotonic() < deadline:
            time.sleep(0.005)
        t1._conns[0].sock.shutdown(socket.SHUT_RDWR)

    goes = threading.Thread(target=peer_goes)
    goes.start()
    start = time.monotonic()
    with pytest.raises(TransportError) as err:
        t0.exchange([], [m], time.monotonic() + 20, 77)
    assert err.value.peer == 1 and time.monotonic() - start < 10
    goes.join(30)
    assert used
    _let_go(t0)
