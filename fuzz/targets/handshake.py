"""The handshake every connection starts with (_auth.py), from both ends, and the
transport's hello that follows it (transport/tcp/mesh.py), fed what a peer sends.

The input's first byte picks the side: 0 the acceptor reading a connector's verdict and
proof, 1 the connector reading an acceptor's hello, result and proof, 2 a transport's
acceptor reading the rank hello of a peer that did prove the key. Contract: without the
job's key nobody gets through: the handshake raises HandshakeError (an
AuthenticationError) and never returns a socket; the mesh's acceptor takes a peer only
for a well-formed hello naming a rank above its own and the world size, and refuses
anything else without raising.
"""

from __future__ import annotations

import socket
import threading
import time

from pycollective import _auth
from pycollective.transport.tcp.mesh import _HELLO, _PURPOSE, _accept_peer

from ._common import SECRET, ErrorLog

CREDS = _auth.credentials(SECRET, environ={})
RANK, SIZE = 0, 3
_quiet = ErrorLog()  # refusals are logged at WARNING: kept out of the fuzzer's output


def _a_side(data: bytes, connector: bool) -> None:
    mine, theirs = socket.socketpair()
    try:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        shake = _auth.connect_handshake if connector else _auth.accept_handshake
        try:
            shake(mine, CREDS, b"store", timeout=5)
        except _auth.HandshakeError:
            return
        raise AssertionError("a handshake succeeded against bytes that hold no key")
    finally:
        mine.close()
        theirs.close()


def _mesh_hello(data: bytes) -> None:
    acceptor, peer = socket.socketpair()

    def honest_then_data() -> None:
        try:
            _auth.connect_handshake(peer, CREDS, _PURPOSE, timeout=5)
            peer.sendall(data)
            peer.shutdown(socket.SHUT_WR)
        except (OSError, _auth.HandshakeError):
            pass  # refused already

    th = threading.Thread(target=honest_then_data)
    th.start()
    try:
        _sock, got = _accept_peer(acceptor, ("fuzz", 0), RANK, SIZE, CREDS, time.monotonic() + 5)
    finally:
        th.join(10)
        acceptor.close()
        peer.close()
    valid = len(data) >= _HELLO.size and data[:4] == b"HELO"
    if valid:
        _, rank, size = _HELLO.unpack(data[: _HELLO.size])
        valid = size == SIZE and RANK < rank < SIZE
    assert got is None or (valid and got == _HELLO.unpack(data[: _HELLO.size])[1]), (got, data)
    assert got is not None or not valid, ("refused a good hello", data)


def check(data: bytes) -> None:
    if not data:
        return
    side = data[0] % 3
    if side == 2:
        _mesh_hello(data[1:])
    else:
        _a_side(data[1:], connector=side == 1)
