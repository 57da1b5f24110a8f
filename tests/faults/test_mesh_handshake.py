"""connect_mesh under hostile connections: junk, wrong secrets and silent clients that
reach a rank's transport listener while the real ranks are still connecting are dropped
(and logged); the mesh still forms, within its deadline."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

import numpy as np
import pytest
from tests._threads import run_in_threads

from pycollective import _auth
from pycollective.store import HashStore
from pycollective.transport import _wire
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import connect_mesh
from pycollective.transport.tcp.mesh import _HELLO, _PURPOSE

SECRET = b"mesh-secret"
PREFIX = "test"


def _address(store: HashStore, rank: int) -> tuple[str, int]:
    host, _, port = store.get(f"{PREFIX}/tcp/{rank}", timeout=5).decode().rpartition(":")
    return host, int(port)


def _junk(addr) -> None:
    with socket.create_connection(addr, timeout=2) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 4)
        time.sleep(0.05)


def _wrong_secret(addr) -> None:
    with socket.create_connection(addr, timeout=2) as s:
        try:
            _auth.connect_handshake(s, b"not-the-secret", _PURPOSE, timeout=2)
        except Exception:  # noqa: BLE001 - refused, as it should be
            pass


def _impostor(addr) -> None:
    """Right secret (a confused job sharing it) but an impossible rank and world size."""
    with socket.create_connection(addr, timeout=2) as s:
        _auth.connect_handshake(s, SECRET, _PURPOSE, timeout=2)
        s.sendall(_HELLO.pack(b"HELO", 99, 1234))
        time.sleep(0.05)


def _closer(addr) -> None:
    socket.create_connection(addr, timeout=2).close()


_release = threading.Event()


def _silent(addr, hold: float) -> None:
    """Connects and says nothing (until the test is done): must not stall the real ranks."""
    with socket.create_connection(addr, timeout=2):
        _release.wait(hold)


def _build(size: int, attack, timeout: float = 10.0):
    store = HashStore(timeout=10)
    results: dict[int, object] = {}

    def rank_main(rank: int) -> None:
        try:
            results[rank] = connect_mesh(
                rank, size, store, PREFIX, SECRET, "127.0.0.1", "127.0.0.1", timeout
            )
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            results[rank] = exc

    # the last rank dials everyone else; it starts only after the attack has connected
    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for t in threads[:-1]:
        t.start()
    attackers = attack(store)
    threads[-1].start()
    t0 = time.monotonic()
    for t in threads:
        t.join(timeout + 5)
    elapsed = time.monotonic() - t0
    _release.set()
    for a in attackers:
        a.join(10)
    _release.clear()
    return results, elapsed


def _attack_all(store: HashStore, hold: float = 4.0) -> list[threading.Thread]:
    addr = _address(store, 0)
    kinds = [_junk, _wrong_secret, _impostor, _closer]
    threads = [threading.Thread(target=k, args=(addr,), daemon=True) for k in kinds]
    threads.append(threading.Thread(target=_silent, args=(addr, hold), daemon=True))
    for t in threads:
        t.start()
    time.sleep(0.3)  # let them all land in rank 0's accept queue first
    return threads


def _check_mesh(results: dict, size: int) -> None:
    for rank in range(size):
        assert not isinstance(results.get(rank), BaseException), results
    transports = [results[r] for r in range(size)]
    try:
        # one message along every pair, both ways, to prove the connections are the real ones
        def job(rank: int) -> None:
            t = transports[rank]
            hdr = _wire.Header(_wire.P2P, 10, 0, 0, 0, 7, 0, 5, 0, 0, 8)
            sends = [
                OutMessage(p, hdr, memoryview(np.full(8, rank, np.uint8)))
                for p in range(size)
                if p != rank
            ]
            bufs = {p: np.zeros(8, np.uint8) for p in range(size) if p != rank}
            recvs = [InMessage(p, hdr, memoryview(bufs[p])) for p in bufs]
            t.exchange(sends, recvs, time.monotonic() + 5, 7)
            for p, b in bufs.items():
                assert (b == p).all()

        run_in_threads(job, size, 10)
    finally:
        for t in transports:
            t.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [2, 3])
def test_hostile_connections_are_dropped_and_logged(size, caplog):
    caplog.set_level(logging.WARNING, logger="pycollective.transport")
    results, elapsed = _build(size, _attack_all)
    _check_mesh(results, size)
    # a silent client holds its connection open: the real ranks must not wait on it
    assert elapsed < 2.0, f"mesh took {elapsed:.1f} s with a silent client connected"
    refused = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refused) >= 3, [r.getMessage() for r in caplog.records]


@pytest.mark.timeout(30)
def test_silent_clients_cannot_exhaust_the_deadline():
    """Many silent clients at once still do not keep the real peer out."""

    def attack(store):
        addr = _address(store, 0)
        threads = [
            threading.Thread(target=_silent, args=(addr, 6.0), daemon=True) for _ in range(8)
        ]
        for t in threads:
            t.start()
        time.sleep(0.3)
        return threads

    results, elapsed = _build(2, attack, timeout=8.0)
    _check_mesh(results, 2)
    assert elapsed < 2.0


@pytest.mark.timeout(20)
def test_missing_peer_times_out_naming_it():
    store = HashStore(timeout=10)
    from pycollective import CollectiveTimeout

    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        connect_mesh(0, 2, store, PREFIX, SECRET, "127.0.0.1", "127.0.0.1", 1.0)
    assert time.monotonic() - t0 < 3
    assert info.value.waiting_on == (1,)
    assert "1" in str(info.value)


def test_hello_struct_is_what_the_acceptor_reads():
    assert _HELLO.size == struct.calcsize("<4sII")
