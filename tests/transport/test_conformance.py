"""The conformance kit every transport must pass (ordering per peer and tag, zero-byte and
large messages, peer death, use after close), run here on TCP: ranks are threads of this
process, each with its own transport, over real sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from tests._threads import run_in_threads

from pycollective import CollectiveTimeout, MismatchError, TransportError
from pycollective.store import HashStore
from pycollective.transport import _wire
from pycollective.transport._base import ANY_SOURCE, InMessage, OutMessage
from pycollective.transport._wire import Header
from pycollective.transport.tcp import connect_mesh

GROUP = 77


def _mesh(n: int) -> list:
    store = HashStore(timeout=20)
    return run_in_threads(
        lambda rank: connect_mesh(rank, n, store, "t", b"secret", "127.0.0.1", "127.0.0.1", 20),
        n,
        30,
    )


def _p2p(tag: int, nbytes: int, dtype_code: int = 2) -> Header:
    return Header(
        _wire.P2P, _wire.KIND_CODE["send_recv"], dtype_code, 0, 0, GROUP, 0, tag, 0, 0, nbytes
    )


def _data(seq: int, tag: int, nbytes: int, count: int = 10) -> Header:
    return Header(
        _wire.DATA, _wire.KIND_CODE["all_reduce"], 2, 0, 1, GROUP, seq, tag, 0, count, nbytes
    )


def _both(a: Callable[[], None], b: Callable[[], None]) -> list[BaseException | None]:
    """Run a and b at once (two ranks); return their exceptions."""
    errs: list[BaseException | None] = [None, None]

    def run(i: int, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            errs[i] = exc

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errs


def _deadline(s: float = 10.0) -> float:
    return time.monotonic() + s


@pytest.mark.timeout(30)
@pytest.mark.parametrize("nbytes", [0, 1, 4096, 8 << 20])
def test_sizes_and_full_duplex(pair, nbytes: int) -> None:
    a, b = pair
    src = [np.random.default_rng(i).integers(0, 255, nbytes, dtype=np.uint8) for i in range(2)]
    dst = [np.zeros(nbytes, dtype=np.uint8) for _ in range(2)]

    def side(t, me: int) -> Callable[[], None]:
        other = 1 - me
        return lambda: t.exchange(
            [OutMessage(other, _p2p(3, nbytes), memoryview(src[me]))],
            [InMessage(other, _p2p(3, nbytes), memoryview(dst[me]))],
            _deadline(),
            GROUP,
        )

    assert _both(side(a, 0), side(b, 1)) == [None, None]
    assert np.array_equal(dst[0], src[1]) and np.array_equal(dst[1], src[0])


@pytest.mark.timeout(30)
def test_order_per_peer_and_tag(pair) -> None:
    """Messages of one tag arrive in send order; different tags can be received in any order."""
    a, b = pair
    payloads = [np.full(1000, i, dtype=np.uint8) for i in range(6)]
    tags = [1, 2, 1, 2, 1, 2]
    a.exchange(
        [OutMessage(1, _p2p(t, 1000), memoryview(p)) for t, p in zip(tags, payloads, strict=True)],
        [],
        _deadline(),
        GROUP,
    )
    got = [np.zeros(1000, dtype=np.uint8) for _ in range(6)]
    # receive all tag-2 messages first, then tag 1
    order = [1, 3, 5, 0, 2, 4]
    for i in order:
        b.exchange([], [InMessage(0, _p2p(tags[i], 1000), memoryview(got[i]))], _deadline(), GROUP)
    for i in range(6):
        assert got[i][0] == i


@pytest.mark.timeout(30)
def test_any_source_reports_sender() -> None:
    ts = _mesh(3)
    try:
        buf = np.zeros(4, dtype=np.uint8)
        m = InMessage(ANY_SOURCE, _p2p(9, 4), memoryview(buf))
        ts[2].exchange(
            [OutMessage(0, _p2p(9, 4), memoryview(np.full(4, 2, np.uint8)))], [], _deadline(), GROUP
        )
        ts[0].exchange([], [m], _deadline(), GROUP)
        assert m.source == 2 and buf[0] == 2
    finally:
        for t in ts:
            t.close()


@pytest.mark.timeout(30)
def test_early_message_completed_after_post(pair) -> None:
    """A message whose receive is posted while it is still arriving is still delivered."""
    a, b = pair
    n = 32 << 20
    src = np.ones(n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    first = np.zeros(1, dtype=np.uint8)

    def sender() -> None:
        a.exchange(
            [
                OutMessage(1, _data(5, 1, 1), memoryview(np.ones(1, np.uint8))),
                OutMessage(1, _data(5, 2, n), memoryview(src)),
            ],
            [],
            _deadline(),
            GROUP,
        )

    def receiver() -> None:
        b.exchange([], [InMessage(0, _data(5, 1, 1), memoryview(first))], _deadline(), GROUP)
        b.exchange([], [InMessage(0, _data(5, 2, n), memoryview(dst))], _deadline(), GROUP)

    assert _both(sender, receiver) == [None, None]
    assert dst.all()


@pytest.mark.timeout(30)
def test_header_mismatch_raises(pair) -> None:
    a, b = pair
    a.exchange(
        [OutMessage(1, _data(0, 0, 40, count=10), memoryview(np.zeros(40, np.uint8)))],
        [],
        _deadline(),
        GROUP,
    )
    with pytest.raises(MismatchError, match="count"):
        b.exchange(
            [],
            [InMessage(0, _data(0, 0, 40, count=11), memoryview(np.zeros(40, np.uint8)))],
            _deadline(),
            GROUP,
        )


@pytest.mark.timeout(30)
def test_timeout_names_the_peer(pair) -> None:
    _, b = pair
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        b.exchange(
            [],
            [InMessage(0, _p2p(1, 4), memoryview(np.zeros(4, np.uint8)))],
            time.monotonic() + 0.3,
            GROUP,
            "test recv",
        )
    assert time.monotonic() - start < 3
    assert info.value.waiting_on == (0,)


@pytest.mark.timeout(30)
def test_peer_death_raises_transport_error(pair) -> None:
    a, b = pair
    threading.Timer(0.2, a.close).start()
    with pytest.raises(TransportError) as info:
        b.exchange(
            [], [InMessage(0, _p2p(1, 4), memoryview(np.zeros(4, np.uint8)))], _deadline(), GROUP
        )
    assert info.value.peer == 0


@pytest.mark.timeout(30)
def test_use_after_close(pair) -> None:
    a, _ = pair
    a.close()
    a.close()  # idempotent
    with pytest.raises(TransportError, match="closed"):
        a.exchange(
            [OutMessage(1, _p2p(1, 1), memoryview(np.zeros(1, np.uint8)))], [], _deadline(), GROUP
        )
