"""Fuzzing the store and the transport with garbage, truncated frames, wrong secrets and
oversized lengths: nothing crashes, memory stays bounded, and a job running beside the
fuzzer keeps giving correct results.

The number of inputs per test is PYCOLLECTIVE_FUZZ_EXAMPLES (default 100; `make faults`
runs 2,000 per test, 12,000 in all). The store tests fuzz the store server of a real
2-rank job that loops all_reduce and store operations the whole time (the `side_job`
fixture); the transport tests fuzz one peer's connection of an in-process transport while
its other peer, in another group, keeps exchanging checked data with it. A real job's
transport cannot be fuzzed from outside at all: its listener closes once the mesh is up
(test_a_formed_mesh_accepts_no_connections).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._launch import REPO

from pycollective import _auth
from pycollective._errors import AuthenticationError, CollectiveError
from pycollective.store import TCPStore, TCPStoreServer
from pycollective.store import _wire as store_wire
from pycollective.transport import _wire
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import TCPTransport
from pycollective.transport.tcp import transport as tcp
from pycollective.transport.tcp.mesh import _HELLO, _PURPOSE, _accept_peer

EXAMPLES = int(os.environ.get("PYCOLLECTIVE_FUZZ_EXAMPLES", "100"))
SECRET = b"fuzz-secret-" + os.urandom(8).hex().encode()
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
COUNTS: Counter[str] = Counter()
RSS_GROWTH_LIMIT = 64 << 20  # bytes the fuzzing process may grow in all


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# ---------------------------------------------------------------------- the job beside


@pytest.fixture(scope="module")
def side_job():
    """A store server in this process and a 2-rank job that uses it (rendezvous, then a
    loop of checked all_reduces and store operations) while the tests fuzz the server."""
    server = TCPStoreServer("127.0.0.1", 0, secret=SECRET).start()
    env = dict(os.environ)
    env.update(
        WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port),
        PYCOLLECTIVE_STORE_HOSTED="1", PYCOLLECTIVE_SECRET=SECRET.decode(),
        PYCOLLECTIVE_TIMEOUT="120", PYTHONUNBUFFERED="1",
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "security" / "_side_worker.py")],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=60)
    state = {"server": server, "procs": procs, "client": client, "rss0": _rss()}
    client.wait(["side/count/0", "side/count/1"], timeout=60)  # the loop is running
    try:
        yield state
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.communicate()
        client.close()
        server.close()


def _store_still_serves(state) -> None:
    client = state["client"]
    n = client.add("fuzz/alive", 1)
    assert int(client.get("fuzz/alive")) == n


# ---------------------------------------------------------------------- store fuzzing


@FUZZ
@given(data=st.binary(max_size=600))
def test_store_refuses_garbage_before_the_handshake(side_job, data: bytes) -> None:
    COUNTS["store-garbage"] += 1
    with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(4096):  # the server's hello, then it closes on us
                pass
        except OSError:  # the server hung up first: that is its right
            pass
    if COUNTS["store-garbage"] % 50 == 0:
        _store_still_serves(side_job)


@FUZZ
@given(secret=st.binary(min_size=1, max_size=64).filter(lambda b: b != SECRET))
def test_store_refuses_wrong_secrets(side_job, secret: bytes) -> None:
    COUNTS["store-secret"] += 1
    with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
        with pytest.raises(AuthenticationError):
            _auth.connect_handshake(s, secret, b"store", timeout=5)
    if COUNTS["store-secret"] % 50 == 0:
        _store_still_serves(side_job)


_LENGTHS = st.one_of(
    st.integers(0, 64),
    st.sampled_from([store_wire.MAX_FRAME_BYTES, (64 << 20) + 1, (1 << 32) - 1, 65537]),
)


@st.composite
def _store_requests(draw) -> bytes:
    """Request frames, mostly plausible, with lying lengths and cut at random points."""
    op = draw(st.integers(0, 12))
    nargs = draw(st.one_of(st.integers(0, 4), st.sampled_from([65537, (1 << 32) - 1])))
    timeout_ms = draw(st.one_of(st.integers(-3, 40), st.sampled_from([-(1 << 63)])))
    if op in (store_wire.Op.GET, store_wire.Op.WAIT) and timeout_ms < 0:
        timeout_ms = 5  # a wait for a key nobody sets would only measure the poll interval
    frame = store_wire.REQUEST_HEADER.pack(op, nargs, timeout_ms)
    for _ in range(min(nargs, 4)):
        claimed = draw(_LENGTHS)
        body = b"fuzz/" + draw(st.binary(max_size=24))
        frame += store_wire.LENGTH.pack(claimed) + body[: min(claimed, len(body))]
    frame += draw(st.binary(max_size=16))
    cut = draw(st.integers(0, len(frame)))
    return frame[: cut if draw(st.booleans()) else len(frame)]


@FUZZ
@given(frame=_store_requests())
def test_store_survives_bad_frames_from_an_authenticated_client(side_job, frame: bytes) -> None:
    COUNTS["store-frames"] += 1
    with socket.create_connection(("127.0.0.1", side_job["server"].port), timeout=5) as s:
        _auth.connect_handshake(s, SECRET, b"store", timeout=5)
        try:
            s.sendall(frame)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(65536):  # answers, if any, then the server closes
                pass
        except OSError:  # the server hung up first: that is its right
            pass
    if COUNTS["store-frames"] % 50 == 0:
        _store_still_serves(side_job)


@FUZZ
@given(data=st.binary(max_size=64))
def test_store_client_refuses_bad_responses(data: bytes) -> None:
    COUNTS["store-responses"] += 1
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        try:
            store_wire.read_response(b)
        except (store_wire.ProtocolError, store_wire.PeerClosed):
            pass


# ---------------------------------------------------------------------- transport fuzzing


@pytest.fixture(autouse=True)
def _no_linger(monkeypatch):
    """Transports here close one after the other in one thread: none would ever see its
    peer hang up while it lingers, so each close would wait the whole linger for nothing."""
    monkeypatch.setattr(tcp, "CLOSE_LINGER", 0.0)


_HDR = struct.Struct("<2sBBBBBBIQIiQQ")  # transport/_wire.py's header layout
EXPECT = _wire.Header(_wire.DATA, 1, 2, 0, 1, 1, 0, 0, 0, 4, 16)  # group 1, #0, 4 x float32


@st.composite
def _transport_frames(draw) -> bytes:
    """Header-shaped frames (right magic mostly, lying fields) with short or long
    payloads, or plain garbage. Group 2 is left alone: it is the group beside."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        fields = [
            draw(st.sampled_from([b"PC", b"PC", b"PC", b"XX"])),
            draw(st.sampled_from([1, 1, 1, 0, 2, 255])),
            draw(st.sampled_from([1, 2, 3, 4, 0, 5, 255])),
            draw(st.integers(0, 12)), draw(st.integers(0, 30)), draw(st.integers(0, 9)),
            draw(st.integers(0, 40)),
            draw(st.sampled_from([1, 1, 0, 3, 0xFFFFFFFF])),
            draw(st.sampled_from([0, 0, 1, (1 << 64) - 1])),
            draw(st.sampled_from([0, 0, 1, 1 << 20])),
            draw(st.integers(-(1 << 31), (1 << 31) - 1)),
            draw(st.sampled_from([4, 4, 0, (1 << 64) - 1])),
            draw(st.sampled_from(
                [16, 16, 0, 15, 17, (1 << 20) + 1, _wire.MAX_ABORT_PAYLOAD + 1, (1 << 40) + 1,
                 (1 << 63), (1 << 64) - 1]
            )),
        ]  # fmt: skip
        out += _HDR.pack(*fields) + draw(st.binary(max_size=40))
    return out


def _trio() -> tuple[TCPTransport, socket.socket, TCPTransport, list[socket.socket]]:
    """Rank 0's transport with a hostile peer 1 (the returned socket) and an honest peer 2."""
    a1, hostile = socket.socketpair()
    a2, b0 = socket.socketpair()
    b1, spare = socket.socketpair()
    t0 = TCPTransport(0, 3, {1: a1, 2: a2})
    t0.max_unexpected = 1 << 20  # the bound that oversized frames run into
    t2 = TCPTransport(2, 3, {0: b0, 1: b1})
    return t0, hostile, t2, [spare]


def _beside(t0: TCPTransport, t2: TCPTransport, seq: int) -> None:
    """Group 2 exchanges checked data between ranks 0 and 2, concurrently both ways."""
    h = _wire.Header(_wire.DATA, 1, 1, 0, 1, 2, seq, 0, 0, 64, 64)
    out0, out2 = os.urandom(64), os.urandom(64)
    in0, in2 = bytearray(64), bytearray(64)
    errors: list[BaseException] = []

    def rank2() -> None:
        try:
            t2.exchange(
                [OutMessage(0, h, memoryview(out2))],
                [InMessage(0, h, memoryview(in2))],
                time.monotonic() + 10,
                2,
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=rank2)
    th.start()
    t0.exchange(
        [OutMessage(2, h, memoryview(out0))],
        [InMessage(2, h, memoryview(in0))],
        time.monotonic() + 10,
        2,
    )
    th.join(10)
    assert not errors, errors
    assert bytes(in0) == out2 and bytes(in2) == out0


@FUZZ
@given(frames=_transport_frames(), close=st.booleans())
def test_transport_survives_a_hostile_peer_beside_a_working_group(frames: bytes, close) -> None:
    COUNTS["transport-frames"] += 1
    t0, hostile, t2, extra = _trio()
    try:
        try:
            hostile.sendall(frames)
        except OSError:
            pass
        if close:
            hostile.close()
        else:
            hostile.shutdown(socket.SHUT_WR)
        dest = bytearray(16)
        try:
            t0.exchange(
                [],
                [InMessage(1, EXPECT, memoryview(dest))],
                time.monotonic() + (5 if close else 0.05),
                1,
            )
        except CollectiveError:
            pass  # refused, lost, mismatched or timed out: all fine; a crash is not
        assert t0._unexpected_bytes <= t0.max_unexpected
        _beside(t0, t2, 0)
        _beside(t0, t2, 1)
    finally:
        t0.close()
        t2.close()
        hostile.close()
        for s in extra:
            s.close()


@FUZZ
@given(data=st.binary(max_size=120), authenticated=st.booleans())
def test_transport_handshake_refuses_garbage(data: bytes, authenticated: bool) -> None:
    """The acceptor of connect_mesh against junk: before the handshake, or as the hello
    of a peer that knows the secret. It refuses (None) and never raises."""
    COUNTS["transport-handshake"] += 1
    a, b = socket.socketpair()
    with a, b:

        def peer() -> None:
            try:
                if authenticated:
                    _auth.connect_handshake(b, SECRET, _PURPOSE, timeout=5)
                b.sendall(data)
                b.shutdown(socket.SHUT_WR)
            except (OSError, AuthenticationError):
                pass

        th = threading.Thread(target=peer)
        th.start()
        _sock, got = _accept_peer(a, ("fuzz", 0), 0, 3, SECRET, time.monotonic() + 5)
        th.join(10)
        valid_hello = authenticated and data[: _HELLO.size] in (
            _HELLO.pack(b"HELO", 1, 3),
            _HELLO.pack(b"HELO", 2, 3),
        )
        assert got is None or valid_hello, (got, data)


def test_a_formed_mesh_accepts_no_connections(side_job) -> None:
    """The transport's listener closes once the mesh is built, so after rendezvous only the
    store can be reached from outside, and it is fuzzed above."""
    host, _, port = side_job["client"].get("pycollective/1/tcp/1").decode().rpartition(":")
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_zz_the_job_beside_kept_working_and_memory_stayed_bounded(side_job) -> None:
    """Runs last in this module: every fuzz input ran; the job gave only correct results."""
    side_job["client"].set("side/stop", b"1")
    outs = []
    for p in side_job["procs"]:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr[-3000:]
        line = next(x for x in stdout.splitlines() if x.startswith("SIDE "))
        outs.append(json.loads(line[5:]))
    for o in outs:
        assert o["bad"] == 0 and o["iterations"] > 0 and o["counted"] == o["store_ops"], o
    grew = _rss() - side_job["rss0"]
    assert grew < RSS_GROWTH_LIMIT, f"the fuzzing process grew by {grew} bytes"
    total = sum(COUNTS.values())
    report = os.environ.get("PYCOLLECTIVE_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump(
                {
                    "inputs": total,
                    "per_target": dict(COUNTS),
                    "side_job": outs,
                    "rss_growth_bytes": grew,
                },
                f,
            )
    assert total >= 6 * EXAMPLES * 0.9, COUNTS  # hypothesis may stop a little short
