"""Writes the seeds in fuzz/corpus/<target>/ from real traffic: frames a real transport
sends, requests and answers of a real store client and server, both halves of a real
handshake, the serializer's own payloads, and control blocks real arena ranks wrote.

    python -m fuzz.make_corpus [--out fuzz/corpus]

Each seed is named by the SHA-1 of its bytes (libFuzzer's naming), so running this again
adds only seeds whose bytes differ (a real handshake's nonces are fresh each time). The
inputs the fuzzers found, which became regression tests, live beside them (regression-*:
the fuzzer's artifact renamed, or a smallest input of the same bug) and are left
alone here.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

from pycollective import _auth, _serialize
from pycollective._errors import MismatchError, TransportError
from pycollective.shm import arena as _arena
from pycollective.store import TCPStore, TCPStoreServer
from pycollective.transport import _wire
from pycollective.transport._base import OutMessage
from pycollective.transport.tcp import TCPTransport
from pycollective.transport.tcp.mesh import _HELLO, _PURPOSE

from .targets import arena_words, store_client, transport_frames
from .targets._common import SECRET

HERE = Path(__file__).resolve().parent


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


# ---------------------------------------------------------------------- transport


def transport_frames_seeds() -> list[bytes]:
    """What a real rank 1 sends rank 0: the call rank 0 waits for, an early one of the
    next call, another collective, a send, an abort."""
    want = transport_frames.EXPECT
    sends = {
        "expected": [(want, np.arange(4, dtype=np.float32).tobytes())],
        "early then expected": [
            (want._replace(seq=1), b"\x01" * 16),
            (want, b"\x02" * 16),
        ],
        "other collective": [(want._replace(kind=_wire.KIND_CODE["broadcast"]), b"\x00" * 16)],
        "other count": [(want._replace(count=8, nbytes=32), b"\x00" * 32)],
        "send": [
            (want._replace(frame=_wire.P2P, kind=_wire.KIND_CODE["send_recv"], tag=7), b"x" * 16)
        ],
        "other group": [(want._replace(group=2), b"\x00" * 16), (want, b"\x00" * 16)],
    }
    seeds = []
    for messages in sends.values():
        a, b = socket.socketpair()
        t1 = TCPTransport(1, 2, {0: a})
        for header, payload in messages:
            t1.exchange([OutMessage(0, header, memoryview(payload))], [], time.monotonic() + 5, 1)
        seeds.append(_drain(b))
        t1.close()
        b.close()
    a, b = socket.socketpair()
    t1 = TCPTransport(1, 2, {0: a})
    t1.abort([0], 1, TransportError("rank 1 lost rank 3: connection reset", peer=3), seq=0)
    t1.abort([0], 1, MismatchError("collective mismatch"), seq=0)
    seeds.append(_drain(b))
    t1.close()
    b.close()
    probe = want._replace(frame=_wire.PROBE, nbytes=0)  # what a waiting rank sends
    seeds.append(probe.pack() + want.pack() + b"\x00" * 16)
    return seeds


# ---------------------------------------------------------------------- store


class _Recorder:
    """A socket that keeps what passes through it both ways."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sent = bytearray()
        self.received = bytearray()

    def sendall(self, data: bytes) -> None:
        self.sent += data
        self._sock.sendall(data)

    def recv_into(self, buf, n: int = 0) -> int:
        k = self._sock.recv_into(buf, n)
        self.received += bytes(memoryview(buf)[:k])
        return k

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def store_seeds() -> tuple[list[bytes], list[bytes]]:
    """(requests a real client sent, answers a real server gave, each after the first
    byte that picks the call in store_client)."""
    server = TCPStoreServer("127.0.0.1", 0, secret=SECRET).start()
    client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=5)
    names = [name for name, _, _ in store_client._CALLS]
    calls = [
        ("set", ("k", b"v")), ("set_lease", ("k", b"v")), ("get", ("k", 1.0)),
        ("add", ("n", 3)), ("add", ("n", -1)), ("compare_set", ("k", b"v", b"w")),
        ("compare_set", ("k", b"x", b"y")), ("wait", (["k", "n"], 1.0)), ("check", (["k"],)),
        ("check", (["k", "missing"],)), ("delete_key", ("k",)), ("num_keys", ()),
        ("get", ("missing", 0.01)), ("wait", (["missing", "n"], 0.01)),
        ("set", ("big", b"\x00" * 600)), ("get", ("big", 1.0)),
    ]  # fmt: skip
    requests, answers = [], []
    everything = b""
    for name, args in calls:
        rec = _Recorder(client._sock)
        client._sock = rec  # type: ignore[assignment]
        try:
            getattr(client, name)(*args)
        except Exception:  # noqa: BLE001 - the timeouts asked for above
            pass
        client._sock = rec._sock
        requests.append(bytes(rec.sent))
        everything += rec.sent
        answers.append(bytes([names.index(name)]) + bytes(rec.received))
    requests.append(everything)
    client.close()
    server.close()
    return requests, answers


# ---------------------------------------------------------------------- handshake


def _recorded_handshake(connector_secret: bytes, purpose: bytes) -> tuple[bytes, bytes]:
    """(what the connector sent, what the acceptor sent) in one real handshake."""
    a, c = socket.socketpair()
    ra, rc = _Recorder(a), _Recorder(c)
    creds_a = _auth.credentials(SECRET, environ={})
    creds_c = _auth.credentials(connector_secret, environ={})

    def accept() -> None:
        try:
            _auth.accept_handshake(ra, creds_a, purpose, timeout=5)  # type: ignore[arg-type]
        except _auth.HandshakeError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    try:
        _auth.connect_handshake(rc, creds_c, purpose, timeout=5)  # type: ignore[arg-type]
    except _auth.HandshakeError:
        pass
    th.join(10)
    a.close()
    c.close()
    return bytes(rc.sent), bytes(ra.sent)


def handshake_seeds() -> list[bytes]:
    seeds = []
    for secret in (SECRET, b"another job's key"):
        for purpose in (b"store", _PURPOSE):
            connector_sent, acceptor_sent = _recorded_handshake(secret, purpose)
            seeds.append(b"\x00" + connector_sent)
            seeds.append(b"\x01" + acceptor_sent)
    seeds.append(b"\x01" + _auth.busy_hello())
    for rank, size in ((1, 3), (2, 3), (0, 3), (1, 4)):
        seeds.append(b"\x02" + _HELLO.pack(b"HELO", rank, size))
    return seeds


# ---------------------------------------------------------------------- serializer


def serialize_seeds() -> list[bytes]:
    values: list[object] = [
        None, True, False, 0, -1, 1 << 70, 1.5, float("nan"), 2 - 3j, "text", "é\u2603",
        b"raw", bytearray(b"ba"), [1, [2, [3]]], (1, "a"), {1, 2}, frozenset({"x"}),
        {"a": 1, 2: [None]}, collections.OrderedDict(a=1),
        np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 4), np.int64),
        np.array([True, False]), np.complex128(1 + 2j), np.int16(-3), np.uint8(7),
    ]  # fmt: skip
    meta = collections.OrderedDict(w=np.ones(2))
    meta._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    values.append(meta)
    try:
        import torch

        values += [
            torch.arange(4, dtype=torch.float32), torch.ones(2, 2, dtype=torch.bfloat16),
            torch.tensor(3.0), torch.empty(0, 2), {"model": torch.nn.Linear(2, 2).state_dict()},
        ]  # fmt: skip
    except ImportError:
        pass
    seeds = [_serialize.dumps(v, pickling=False)[len(_serialize.MAGIC) :] for v in values]
    arr = _serialize.dumps(np.arange(3, dtype=np.float64), pickling=False)
    seeds.append(b"x" + arr[len(_serialize.MAGIC) + 1 :])  # the same array as a tensor ("x")
    return seeds


# ---------------------------------------------------------------------- arena


def arena_words_seeds() -> list[bytes]:
    """Control blocks real ranks wrote: peers that announced rank 0's call and passed the
    phase, peers not there yet, peers in another call or an earlier one."""
    seeds = []
    collectives = arena_words.COLLECTIVES
    for i, collective in enumerate(collectives):
        for size in arena_words.SIZES:
            for case in ("same, ahead", "same, behind", "other call", "earlier call"):
                code = (2, 6, 3)[(i + size) % 3]
                dtype_i = tuple(arena_words.DTYPES).index(code)
                count, seq, epoch = 16 + 8 * i, 5, 40
                root = 1 % size
                head = bytes([arena_words.SIZES.index(size), i, dtype_i, 0, root])
                head += struct.pack("<H", count) + bytes([seq]) + struct.pack("<H", epoch)
                kind = _wire.KIND_CODE[collective]
                op = 0 if collective in ("all_reduce", "reduce", "reduce_scatter") else 0
                croot = root if collective in ("reduce", "broadcast") else 0
                seg = _arena.Segment.create(_arena.layout(size, 4096)[2])
                seg.unlink()
                blocks = b""
                for q in range(1, size):
                    a = _arena.Arena(seg, size, q, 4096, cores=1)
                    their_seq, their_kind = seq, kind
                    if case == "other call":
                        their_kind = _wire.KIND_CODE["all_gather" if kind != 4 else "broadcast"]
                    if case == "earlier call":
                        their_seq = seq - 1
                    a.announce(
                        their_seq, their_kind, code, count, croot, op, _wire.ALGO_CODE["shm"]
                    )
                    for _ in range(epoch + (50 if case != "same, behind" else 0)):
                        a.bump()
                    lo = q * _arena.WORDS
                    blocks += np.frombuffer(a.ctrl, dtype=np.int64)[
                        lo : lo + _arena.WORDS
                    ].tobytes()
                seeds.append(head + blocks + bytes(range(64)))  # the first data bytes
                del a  # the segment is unlinked: its memory goes with the last view
    return seeds


# ---------------------------------------------------------------------- writing


def write(out: Path) -> dict[str, int]:
    store_requests, store_answers = store_seeds()
    made = {
        "transport_frames": transport_frames_seeds(),
        "store_server": store_requests,
        "store_client": store_answers,
        "handshake": handshake_seeds(),
        "serialize": serialize_seeds(),
        "arena_words": arena_words_seeds(),
    }
    counts = {}
    for target, seeds in made.items():
        folder = out / target
        folder.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        counts[target] = len(list(folder.iterdir()))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "corpus")
    args = ap.parse_args()
    for target, n in write(args.out).items():
        print(f"{target}: {n} seeds in {args.out / target}")


if __name__ == "__main__":
    main()
