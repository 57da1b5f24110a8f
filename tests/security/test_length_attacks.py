"""Lengths a peer announces decide no allocation beyond what it actually sent, and every
one of them has a bound: the store's frames and its total, the transport's early frames,
object payloads, the parameter server's set-up.

Finding 7 of the security review: four 21-byte store frames claiming 64 MiB values grew
the server from 43 to 299 MiB; the transport kept up to 8 GiB of early frames;
`np.empty(sizes.sum())` in object collectives and `spec["total"]` in the parameter
server allocated what a peer claimed.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from tests._launch import REPO, run_ranks

from pycollective import _auth
from pycollective._errors import CollectiveError, StoreError
from pycollective.ps._setup import check_spec
from pycollective.store import TCPStore, TCPStoreServer
from pycollective.store import _wire as store_wire
from pycollective.transport import _wire
from pycollective.transport.tcp import TCPTransport
from pycollective.transport.tcp import transport as tcp

pytestmark = pytest.mark.timeout(60)
SECRET = b"length-tests-" + os.urandom(8).hex().encode()
WORKER = REPO / "tests" / "security" / "_attack_worker.py"


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_store_frames_claiming_huge_values_cost_only_what_was_sent() -> None:
    code = textwrap.dedent(
        f"""
        import sys, time
        from pycollective.store import TCPStoreServer
        s = TCPStoreServer("127.0.0.1", 0, {SECRET!r}).start()
        print(s.port, flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proc.stdout.readline())
        time.sleep(0.3)
        before = _rss(proc.pid)
        socks = []
        for i in range(8):  # SET key=k<i>, value claiming 64 MiB; 1 byte of it sent
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            _auth.connect_handshake(s, SECRET, b"store", 5)
            frame = store_wire.REQUEST_HEADER.pack(store_wire.Op.SET, 2, -1)
            frame += struct.pack("!I", 2) + f"k{i}".encode()
            frame += struct.pack("!I", store_wire.MAX_FRAME_BYTES // 2 - 1) + b"x"
            s.sendall(frame)
            socks.append(s)
        time.sleep(0.5)
        grown = _rss(proc.pid) - before
        assert grown < 24 << 20, f"the server grew {grown >> 20} MiB for 8 lying frames"
        for s in socks:
            s.close()
        store = TCPStore("127.0.0.1", port, SECRET, timeout=5)
        assert store.num_keys() == 0  # nothing half-sent was stored
        store.close()
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_the_store_holds_at_most_its_bound() -> None:
    with TCPStoreServer("127.0.0.1", 0, SECRET, max_bytes=1 << 20) as srv:
        s = TCPStore("127.0.0.1", srv.port, SECRET, timeout=5)
        s.set("a", bytes(600 << 10))
        with pytest.raises(StoreError, match="PYCOLLECTIVE_STORE_MAX_BYTES"):
            s.set("b", bytes(600 << 10))
        with pytest.raises(StoreError, match="limit"):
            s.compare_set("c", "", bytes(600 << 10))
        s.set("a", bytes(10))  # replacing shrinks
        s.set("b", bytes(600 << 10))
        assert s.get("a") == bytes(10) and len(s.get("b")) == 600 << 10
        s.close()


def _pair() -> tuple[TCPTransport, socket.socket]:
    """Rank 0's transport, and the raw socket rank 1 would write on (a peer that proved
    the key and then lies about lengths)."""
    a, b = socket.socketpair()
    return TCPTransport(0, 2, {1: a}), b


def _header(nbytes: int, seq: int = 5) -> bytes:
    return _wire.Header(_wire.DATA, 1, 0, 0, 0, 9, seq, 0, 0, nbytes, nbytes).pack()


def test_an_early_frame_claiming_a_gigabyte_allocates_what_arrived() -> None:
    t, peer = _pair()
    try:
        peer.sendall(_header(1 << 30) + bytes(1000))
        deadline = time.monotonic() + 5
        conn = t._conns[1]
        while conn.got < 1000 and time.monotonic() < deadline:
            t.check_group(3)
        assert conn.stash is not None and conn.stash.allocated <= tcp.STASH_FIRST
        assert conn.lost is None
        more = threading.Thread(target=peer.sendall, args=(bytes(3 << 20),))
        more.start()  # more comes: the stash grows as it does
        # (conn.got counts the start read before a stash; the stash holds the rest)
        total = 1000 + (3 << 20)
        while (more.is_alive() or conn.stash.allocated < total) and time.monotonic() < deadline:
            t.check_group(3)
        more.join(5)
        assert tcp.STASH_FIRST < conn.stash.allocated <= 8 << 20
    finally:
        t.close()
        peer.close()


@pytest.mark.parametrize(
    "nbytes, why",
    [((3 << 30), "PYCOLLECTIVE_MAX_EARLY_BYTES"), (tcp.MAX_FRAME_BYTES + 1, "over the limit")],
)
def test_an_early_frame_beyond_the_bounds_loses_that_peer(nbytes: int, why: str) -> None:
    t, peer = _pair()
    try:
        peer.sendall(_header(nbytes))
        deadline = time.monotonic() + 5
        while t._conns[1].lost is None and time.monotonic() < deadline:
            t.check_group(3)
        assert why in (t._conns[1].lost or ""), t._conns[1].lost
    finally:
        t.close()
        peer.close()


def test_the_bound_on_early_frames_is_configurable(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_MAX_EARLY_BYTES", str(1 << 20))
    t, peer = _pair()
    try:
        assert t.max_unexpected == 1 << 20
    finally:
        t.close()
        peer.close()


@pytest.mark.timeout(90)
def test_an_object_size_beyond_the_bound_is_refused_before_allocating() -> None:
    """Rank 0 announces a terabyte object to broadcast_object_list's receivers."""
    results = run_ranks(WORKER, 3, ("claim-huge",), timeout=80)
    for r in results[1:]:
        assert "PYCOLLECTIVE_MAX_OBJECT_BYTES" in r.stdout, (r.stdout, r.stderr)
        assert '"error": "CollectiveError"' in r.stdout


@pytest.mark.timeout(90)
def test_object_payloads_travel_in_pieces_and_within_the_bound() -> None:
    """A 3 MiB object in 1 MiB pieces, and one over a 2 MiB bound refused on the root."""
    env = {"PYCOLLECTIVE_MAX_OBJECT_BYTES": str(2 << 20), "OBJECT_CHUNK_BYTES": str(1 << 20)}
    results = run_ranks(WORKER, 3, ("objects-bounded",), env=env, timeout=80)
    for r in results:
        assert r.returncode == 0, r.stderr
        assert '"ok": true' in r.stdout, r.stdout


@pytest.mark.parametrize(
    "spec",
    [
        {"total": 1 << 40, "optimizer": {}, "mode": "sync"},
        {"total": -1, "optimizer": {}, "mode": "sync"},
        {"total": 1.5, "optimizer": {}, "mode": "sync"},
        {"total": 10, "optimizer": {}, "mode": "sync", "extra": 1},
        {"total": 10, "optimizer": [], "mode": "sync"},
        {"total": 10, "optimizer": {}, "mode": "chaos"},
        ["not", "a", "dict"],
    ],
)
def test_a_parameter_server_spec_is_checked_before_anything_is_allocated(spec) -> None:
    with pytest.raises(CollectiveError, match="worker 0"):
        check_spec(spec)
    assert check_spec({"total": 10, "optimizer": {"name": "sgd"}, "mode": "async"})


def test_a_frame_of_the_receivers_own_size_is_taken_whole() -> None:
    """Not an attack: a message of exactly its receive's size still goes straight into the
    destination (no stash in the way)."""
    a, b = socket.socketpair()
    t0, t1 = TCPTransport(0, 2, {1: a}), TCPTransport(1, 2, {0: b})
    try:
        from pycollective.transport._base import InMessage, OutMessage

        h = _wire.Header(_wire.DATA, 1, 0, 0, 0, 9, 1, 0, 0, 8, 64)
        src = np.arange(8, dtype=np.float64)
        dst = np.zeros(8)
        th = threading.Thread(
            target=t1.exchange,
            args=([OutMessage(0, h, memoryview(src).cast("B"))], [], time.monotonic() + 5, 9),
        )
        th.start()
        t0.exchange([], [InMessage(1, h, memoryview(dst).cast("B"))], time.monotonic() + 5, 9)
        th.join(5)
        assert np.array_equal(dst, src)
    finally:
        t0.close()
        t1.close()
