"""Mutual HMAC challenge-response over a freshly connected socket.

Both sides prove they hold the job's shared secret without sending it:

    acceptor  -> connector : MAGIC, nonce_a (16 random bytes)
    connector -> acceptor  : nonce_c, HMAC(secret, b"C" + purpose + nonce_a + nonce_c)
    acceptor  -> connector : HMAC(secret, b"A" + purpose + nonce_c + nonce_a)

`purpose` separates the store's connections from the transport's, so a proof made for
one cannot be replayed on the other. With no secret configured the key is empty: the
handshake still runs, so a stray client or junk bytes are refused, but anyone who knows
the protocol can join (the caller warns about that once).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

from . import _config
from ._errors import AuthenticationError

MAGIC = b"PYCOLL\x01\x00"
NONCE_BYTES = 16
DIGEST_BYTES = 32  # sha256


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AuthenticationError("handshake timed out")
        sock.settimeout(remaining)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise AuthenticationError("handshake timed out") from None
        except OSError as exc:
            raise AuthenticationError(f"handshake failed: {exc}") from None
        if k == 0:
            raise AuthenticationError("peer closed the connection during the handshake")
        got += k
    return bytes(buf)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise AuthenticationError("handshake timed out")
    sock.settimeout(remaining)
    try:
        sock.sendall(data)
    except OSError as exc:
        raise AuthenticationError(f"handshake failed: {exc}") from None


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def accept_handshake(
    sock: socket.socket, secret: bytes, purpose: bytes, timeout: float = 10.0
) -> None:
    """Run the acceptor's side; raises AuthenticationError unless the peer knows `secret`."""
    deadline = time.monotonic() + timeout
    nonce_a = os.urandom(NONCE_BYTES)
    _send_all(sock, MAGIC + nonce_a, deadline)
    reply = _recv_exact(sock, NONCE_BYTES + DIGEST_BYTES, deadline)
    nonce_c, proof = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _mac(secret, b"C", purpose, nonce_a, nonce_c)):
        raise AuthenticationError("peer failed the shared-secret challenge (wrong secret?)")
    _send_all(sock, _mac(secret, b"A", purpose, nonce_c, nonce_a), deadline)


def connect_handshake(
    sock: socket.socket, secret: bytes, purpose: bytes, timeout: float = 10.0
) -> None:
    """Run the connector's side; raises AuthenticationError unless the acceptor knows `secret`."""
    deadline = time.monotonic() + timeout
    hello = _recv_exact(sock, len(MAGIC) + NONCE_BYTES, deadline)
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthenticationError("the server is not a pycollective endpoint (bad magic)")
    nonce_a = hello[len(MAGIC) :]
    nonce_c = os.urandom(NONCE_BYTES)
    _send_all(sock, nonce_c + _mac(secret, b"C", purpose, nonce_a, nonce_c), deadline)
    try:
        proof = _recv_exact(sock, DIGEST_BYTES, deadline)
    except AuthenticationError as exc:
        if "closed" not in str(exc):
            raise
        # An acceptor closes at once when our proof fails: its secret is not ours.
        raise AuthenticationError(
            "the server closed the connection after checking our proof (wrong secret? every "
            "node of a job needs the same PYCOLLECTIVE_SECRET)"
        ) from None
    if not hmac.compare_digest(proof, _mac(secret, b"A", purpose, nonce_c, nonce_a)):
        raise AuthenticationError("the server failed the shared-secret challenge (wrong secret?)")


def secret_from_env() -> bytes:
    """The job's secret: PYCOLLECTIVE_SECRET, or the contents of PYCOLLECTIVE_SECRET_FILE."""
    value = _config.get("PYCOLLECTIVE_SECRET")
    if value:
        return value.encode()
    path = _config.get("PYCOLLECTIVE_SECRET_FILE")
    if path:
        with open(path, "rb") as f:
            return f.read().strip()
    return b""
