"""The send helper (transport/tcp/sender.py): a large payload's tail is written by its
thread while the exchange reads, the bytes arrive whole and in order, and a peer lost
mid-payload ends the exchange with TransportError within bounds, the helper let go
(nothing writes on a closed socket). Ranks are threads of this process over loopback."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from tests.transport.test_conformance import _both, _data

from pycollective import TransportError
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import sending


def _started(t) -> list[int]:
    """Count the tails handed to `t`'s helper."""
    calls: list[int] = []
    start = t._helper.start

    def counting(sock, tail):
        calls.append(tail.nbytes)
        start(sock, tail)

    t._helper.start = counting
    return calls


@pytest.mark.timeout(60)
def test_large_exchange_both_ways_is_whole_and_uses_the_helper(pair) -> None:
    t0, t1 = pair
    n = 16 << 20
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 255, n, np.uint8), rng.integers(0, 255, n, np.uint8)
    got0, got1 = np.empty(n, np.uint8), np.empty(n, np.uint8)
    h = _data(1, 0, n)
    used = _started(t0), _started(t1)
    for _ in range(3):  # repeated: the helper is taken back and handed out again
        errs = _both(
            lambda: t0.exchange([OutMessage(1, h, memoryview(a))],
                                [InMessage(1, h, memoryview(got0))], time.monotonic() + 20, 77),
            lambda: t1.exchange([OutMessage(0, h, memoryview(b))],
                                [InMessage(0, h, memoryview(got1))], time.monotonic() + 20, 77),
        )  # fmt: skip
        assert errs == [None, None]
        assert np.array_equal(got0, b) and np.array_equal(got1, a)
    assert sum(map(len, used)) >= 1, "no tail went through a helper"
    for t in pair:
        assert not t._helper.busy and t._helper_conn is None
        assert all(not c.helper and not c.outq for c in t._conns.values())


@pytest.mark.timeout(60)
def test_peer_lost_mid_payload_raises_and_the_helper_lets_go(pair, monkeypatch) -> None:
    monkeypatch.setattr(sending, "HELPER_BYTES", 64 << 10)
    t0, t1 = pair
    n = 256 << 20  # t1 reads it (so t0's helper gets the tail) and goes half way
    h = _data(1, 0, n)
    used = _started(t0)
    payload = np.zeros(n, np.uint8)

    def peer_goes() -> None:
        deadline = time.monotonic() + 20
        while not used and time.monotonic() < deadline:  # the helper has the tail
            time.sleep(0.005)
        for c in t1._conns.values():
            c.sock.shutdown(socket.SHUT_RDWR)  # t0 reads the end of the stream, as of a crash

    goes = threading.Thread(target=peer_goes)
    goes.start()
    start = time.monotonic()
    errs = _both(
        lambda: t0.exchange([OutMessage(1, h, memoryview(payload))], [],
                            time.monotonic() + 20, 77),
        lambda: t1.exchange([], [InMessage(0, h, memoryview(np.empty(n, np.uint8)))],
                            time.monotonic() + 20, 77),
    )  # fmt: skip
    goes.join(30)
    assert used, "the helper never had the tail"
    assert isinstance(errs[0], TransportError) and errs[0].peer == 1, errs
    assert time.monotonic() - start < 10
    assert not t0._helper.busy and t0._helper_conn is None
    assert t0._conns[1].lost is not None and not t0._conns[1].helper
