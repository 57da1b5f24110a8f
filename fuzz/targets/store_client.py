"""The store client's side of the store protocol (store/_wire.py read_response and
unpack_args, and what TCPStore makes of an answer), fed what a server sends.

The input's first byte picks the request (set, set_lease, get, add, compare_set, wait,
check, delete_key, num_keys); the rest is the byte stream the server answers with after
the handshake. Contract: the call returns what its signature says (None, bytes, an int,
a bool) or raises StoreError, whatever the server sent, and so does the next call on the
same client.
"""

from __future__ import annotations

from pycollective._errors import StoreError
from pycollective.store import TCPStore

from ._common import SECRET, tcp_pair


class _FedStore(TCPStore):
    """A TCPStore whose connection is the one handed to it (the handshake has a target of
    its own): everything after is the real client."""

    def __init__(self, sock, *args, **kwargs) -> None:
        self._fed = sock
        super().__init__(*args, **kwargs)

    def _connect(self, budget: float | None):
        return self._fed


_CALLS = (
    ("set", ("k", b"v"), type(None)),
    ("set_lease", ("k", b"v"), type(None)),
    ("get", ("k", 1.0), bytes),
    ("add", ("k", 3), int),
    ("compare_set", ("k", b"a", b"b"), bytes),
    ("wait", (["k", "l"], 1.0), type(None)),
    ("check", (["k", "l"],), bool),
    ("delete_key", ("k",), bool),
    ("num_keys", (), int),
)


def check(data: bytes) -> None:
    if not data:
        return
    name, args, returns = _CALLS[data[0] % len(_CALLS)]
    server, client = tcp_pair()
    try:
        server.sendall(data[1:])
        server.shutdown(1)  # SHUT_WR: the answers end here
        store = _FedStore(client, "127.0.0.1", 1, secret=SECRET, timeout=5)
        for call, call_args, want in ((name, args, returns), _CALLS[-1]):
            try:
                result = getattr(store, call)(*call_args)
            except StoreError:
                continue
            assert type(result) is want, (call, result)
        store.close()
    finally:
        client.close()
        server.close()
