"""The store server's side of the store protocol (store/_wire.py read_request, and
store/tcp.py's per-connection loop that executes and answers), fed what an
authenticated client sends.

The input is the byte stream of requests on one connection after the handshake (the
handshake has a target of its own). Contract: the connection's loop ends by itself once
the input is read (a bad frame closes the connection; nothing raises out of it and
nothing is logged as a crash), every answer it wrote is a well-formed response, at most
one a request, and the keys and values held stay within the server's byte limit.
"""

from __future__ import annotations

import socket

from pycollective.store import TCPStoreServer
from pycollective.store import _wire as store_wire
from pycollective.store._memory import KVTable

from ._common import SECRET, ErrorLog, tcp_pair

MAX_BYTES = 64 << 10  # the server's limit on what it holds (PYCOLLECTIVE_STORE_MAX_BYTES)


class _NoWaitTable(KVTable):
    """Waits (GET and WAIT of keys nobody sets) end at once: the client's timeout is
    measured by the clock, not parsed, and a wait for a key only this input could set
    would otherwise last its whole timeout (or forever)."""

    def wait(self, keys, timeout, abandoned=None, poll: float = 1.0):  # type: ignore[override]
        return super().wait(keys, 0.0, abandoned, poll)


_errors = ErrorLog()
_server = TCPStoreServer("127.0.0.1", 0, secret=SECRET, max_bytes=MAX_BYTES)
_server._table = _NoWaitTable(MAX_BYTES)
_server._authenticate = lambda conn, addr: conn  # type: ignore[method-assign]


def _requests_in(data: bytes) -> int:
    """An upper bound on the requests in `data`: each takes a full header."""
    return len(data) // store_wire.REQUEST_HEADER.size


def check(data: bytes) -> None:
    server_end, client = tcp_pair()
    try:
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        _server._serve(server_end, ("fuzz", 0))
        assert not _errors.records, _errors.take()
        client.settimeout(5)
        answers = 0
        while True:
            try:
                status, payload = store_wire.read_response(client)
            except (store_wire.PeerClosed, ConnectionResetError):
                break  # the server hung up; with our bytes unread, the kernel says "reset"
            assert status in store_wire.Status, status
            assert len(payload) <= store_wire.MAX_FRAME_BYTES
            answers += 1
        assert answers <= _requests_in(data), (answers, len(data))
        assert _server._table.nbytes <= MAX_BYTES, _server._table.nbytes
    finally:
        client.close()
        server_end.close()
    if _server._table.nbytes > MAX_BYTES // 2:
        _server.clear()  # room for the next inputs to set keys too
