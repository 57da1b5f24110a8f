"""The handshake every connection of a job starts with (store, transport, and so the
parameter server and elastic training built on them): both ends prove they hold the job's
key (_keys.py) without sending it, bound to this very connection, optionally inside TLS.

    acceptor  -> connector   HELLO   magic "PYCOLL\\x02\\x00", status (0 go on, 1 busy: try
                                     again), flags (TLS, addresses bound), key id, nonce_a
    connector -> acceptor    VERDICT verdict (0 go on, 1 keys differ, 2 TLS differs),
                                     key id, flags                       (in the clear)
             [both wrap the socket in TLS 1.3 here when the HELLO says so]
    connector -> acceptor    PROOF   nonce_c, its view of the connection (its address >
                                     the acceptor's), the TLS channel binding, and
                                     HMAC(k, "C" | purpose | everything above)
    acceptor  -> connector   RESULT  0 and HMAC(k, "A" | purpose | transcript | proof), or
                                     why not (bad proof, relayed, keys differ)

`k` is derived from the job's key for the handshake alone. `purpose` separates the store's
connections from the transport's. Fresh nonces on both sides make every proof good for one
connection only (a replayed one fails), and the view of the connection makes a proof good
only between the two sockets that made it: a relay in between (someone who squatted an
address and forwards both ways) shows each end other addresses than the ends themselves
see, and is refused as such. Only an attacker on the path who can also forge addresses
gets past that, and TLS is the answer to that one (docs/security.md).

Where NAT or a proxy between ranks rewrites addresses (a Kubernetes Service in front of the
store, say) the views cannot agree: PYCOLLECTIVE_BIND_ADDRESSES=0 (on the acceptors) leaves
them out of the proof, and TLS then binds the proof to the TLS channel instead.

Acceptors hand out handshake slots through a HandshakeGate: connections that have not
proved anything yet are few and short-lived, and a flood of them evicts the oldest rather
than locking real ranks out; connectors retry what a busy or evicting acceptor refused.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import _config, _keys, _tls
from ._errors import AuthenticationError

log = logging.getLogger("pycollective.auth")

MAGIC = b"PYCOLL\x02\x00"
_OLD_MAGIC = b"PYCOLL\x01\x00"
NONCE_BYTES = 32
DIGEST_BYTES = 32
KEY_ID_BYTES = 8
MAX_VIEW_BYTES = 200  # "host:port>host:port" of two IPv6 addresses fits many times
MAX_BINDING_BYTES = 128
_LATE_DROPS = 5  # connect_retrying gives up on an acceptor that drops this many proofs

_HELLO = struct.Struct(f"<{len(MAGIC)}sBB{KEY_ID_BYTES}s{NONCE_BYTES}s")
_VERDICT = struct.Struct(f"<B{KEY_ID_BYTES}sB")
HELLO_BYTES = _HELLO.size

# HELLO status
GO_ON, BUSY = 0, 1
# HELLO and VERDICT flags
TLS_FLAG, BOUND_FLAG = 1, 2
# VERDICT
KEYS_DIFFER, TLS_DIFFERS = 1, 2
# RESULT
OK, BAD_PROOF, RELAYED = 0, 1, 2
_RESULT_TEXT = {
    BAD_PROOF: "the peer failed the job-key challenge (its key differs, or it is not of this job)",
    RELAYED: "the connection is relayed or its addresses translated: the two ends see "
    "different addresses (a relay in between, or NAT/a proxy: see PYCOLLECTIVE_BIND_ADDRESSES)",
}


class HandshakeError(AuthenticationError):
    """A handshake that failed. `transient` ones (the acceptor was busy or dropped us
    before judging our proof) are worth another try; the rest are final."""

    def __init__(self, message: str, transient: bool = False, late: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        self.late = late  # after our proof: a real acceptor answers it


@dataclass(frozen=True)
class Credentials:
    """What a process brings to every handshake: the job's key, TLS or not, and whether
    its proofs name the connection's addresses."""

    key: _keys.JobKey
    tls: _tls.TLSConfig | None = None
    bind_addresses: bool = True

    @property
    def flags(self) -> int:
        return (TLS_FLAG if self.tls is not None else 0) | (
            BOUND_FLAG if self.bind_addresses else 0
        )

    def handshake_key(self) -> bytes:
        return self.key.derive(b"handshake")


def credentials(
    secret: bytes | str | _keys.JobKey | None = None,
    environ: Mapping[str, str] | None = None,
) -> Credentials:
    """This process's credentials: `secret` (None: the job's key, see _keys) and the
    TLS and address-binding settings of `environ` (default: os.environ)."""
    return Credentials(
        _keys.as_key(secret, environ=environ),
        _tls.from_env(environ),
        _config.get("PYCOLLECTIVE_BIND_ADDRESSES", environ) == "1",
    )


# ---------------------------------------------------------------------- bytes


def _recv_exact(sock: socket.socket, n: int, deadline: float, stage: str) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HandshakeError(f"handshake timed out ({stage})", transient=True)
        sock.settimeout(remaining)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise HandshakeError(f"handshake timed out ({stage})", transient=True) from None
        except ssl.SSLError as exc:  # an alert: the peer refused our certificate, say
            raise HandshakeError(f"TLS handshake failed ({stage}): {exc.reason or exc}") from None
        except OSError as exc:
            raise HandshakeError(f"handshake failed ({stage}): {exc}", transient=True) from None
        if k == 0:
            raise HandshakeError(
                f"the peer closed the connection during the handshake ({stage})", transient=True
            )
        got += k
    return bytes(buf)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise HandshakeError("handshake timed out", transient=True)
    sock.settimeout(remaining)
    try:
        sock.sendall(data)
    except OSError as exc:
        raise HandshakeError(f"handshake failed: {exc}", transient=True) from None


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _addr(name: object) -> str:
    if not isinstance(name, tuple) or len(name) < 2:
        return f"local:{name!r}"  # a Unix socket (tests' socket pairs): no address to bind
    host = str(name[0])
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:") :]  # an IPv4 peer on a dual-stack socket
    return f"{host}:{name[1]}"


def _view(sock: socket.socket, connector: bool) -> bytes:
    """This end's view of the connection, written the same on both ends when nothing
    stands between them: "connector address>acceptor address"."""
    try:
        here, there = _addr(sock.getsockname()), _addr(sock.getpeername())
    except OSError as exc:
        raise HandshakeError(f"handshake failed: {exc}", transient=True) from None
    text = f"{here}>{there}" if connector else f"{there}>{here}"
    return text.encode("ascii", "replace")[:MAX_VIEW_BYTES]


def _channel(sock: socket.socket) -> bytes:
    if isinstance(sock, ssl.SSLSocket):
        return (sock.get_channel_binding("tls-unique") or b"")[:MAX_BINDING_BYTES]
    return b""


def _wrap(sock: socket.socket, creds: Credentials, server: bool, deadline: float) -> ssl.SSLSocket:
    assert creds.tls is not None  # noqa: S101 - only called with TLS on
    ctx = _tls.context(creds.tls, creds.key, server)
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return ctx.wrap_socket(sock, server_side=server)
    except TimeoutError:
        raise HandshakeError("TLS handshake timed out", transient=True) from None
    except ssl.SSLError as exc:
        raise HandshakeError(f"TLS handshake failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise HandshakeError(f"TLS handshake failed: {exc}", transient=True) from None


def _proof_part(nonce: bytes, view: bytes, binding: bytes) -> bytes:
    return nonce + bytes([len(view)]) + view + bytes([len(binding)]) + binding


# ---------------------------------------------------------------------- the two sides


def busy_hello() -> bytes:
    """What an acceptor with no room for another connection says before it closes."""
    return _HELLO.pack(MAGIC, BUSY, 0, bytes(KEY_ID_BYTES), bytes(NONCE_BYTES))


Secret = Credentials | _keys.JobKey | bytes | str | None


def _as_credentials(creds: Secret) -> Credentials:
    return creds if isinstance(creds, Credentials) else credentials(creds)


def accept_handshake(
    sock: socket.socket, creds: Secret, purpose: bytes, timeout: float = 10.0
) -> socket.socket:
    """The acceptor's side. Returns the socket to use from now on (a TLS one with TLS);
    raises HandshakeError unless the peer proved the job's key on this connection.
    `creds`: Credentials, or a secret for credentials()."""
    creds = _as_credentials(creds)
    deadline = time.monotonic() + timeout
    key_id = creds.key.derive(b"key id")[:KEY_ID_BYTES]
    hello = _HELLO.pack(MAGIC, GO_ON, creds.flags, key_id, os.urandom(NONCE_BYTES))
    _send_all(sock, hello, deadline)
    verdict, their_id, their_flags = _VERDICT.unpack(
        _recv_exact(sock, _VERDICT.size, deadline, "waiting for the peer's verdict")
    )
    if verdict == KEYS_DIFFER:
        raise HandshakeError(
            f"a peer whose key differs from ours tried to connect (its key id "
            f"{their_id.hex()}, ours {key_id.hex()}); {creds.key.hint()}"
        )
    if verdict == TLS_DIFFERS:
        raise HandshakeError(
            "a peer tried to connect with TLS "
            + ("off while this side requires it" if creds.tls else "on while this side has it off")
            + ": set PYCOLLECTIVE_TLS the same on every rank"
        )
    if verdict != GO_ON:
        raise HandshakeError(f"the peer sent an unknown verdict {verdict}")
    verdict_bytes = _VERDICT.pack(verdict, their_id, their_flags)
    # Our view of the connection, taken now: once TLS has failed, a reset socket has none.
    view = _view(sock, connector=False) if creds.bind_addresses else b""
    tls = creds.tls is not None
    return _second_half(
        _judge, sock, creds, tls, True, purpose, deadline, hello, verdict_bytes, view
    )


def _second_half(
    half: Callable[[socket.socket, Credentials, bytes, float, bytes, bytes, bytes], socket.socket],
    sock: socket.socket,
    creds: Credentials,
    tls: bool,
    server: bool,
    purpose: bytes,
    deadline: float,
    hello: bytes,
    verdict_bytes: bytes,
    view: bytes,
) -> socket.socket:
    """The handshake's second half (`_judge` or `_prove`), over TLS when agreed: a socket
    that TLS wrapped is closed if that half fails."""
    if not tls:
        return half(sock, creds, purpose, deadline, hello, verdict_bytes, view)
    wrapped = _wrap(sock, creds, server, deadline)
    try:
        return half(wrapped, creds, purpose, deadline, hello, verdict_bytes, view)
    except BaseException:
        wrapped.close()
        raise


def _judge(
    sock: socket.socket,
    creds: Credentials,
    purpose: bytes,
    deadline: float,
    hello: bytes,
    verdict_bytes: bytes,
    view: bytes,
) -> socket.socket:
    """The acceptor's second half: read the connector's proof and judge it."""
    key = creds.handshake_key()
    nonce_c = _recv_exact(sock, NONCE_BYTES + 1, deadline, "waiting for the peer's proof")
    n_view = nonce_c[-1]
    if n_view > MAX_VIEW_BYTES:
        raise HandshakeError(f"the peer's proof claims a {n_view}-byte address view")
    rest = _recv_exact(sock, n_view + 1, deadline, "reading the peer's proof")
    claimed_view, n_bind = rest[:n_view], rest[-1]
    if n_bind > MAX_BINDING_BYTES:
        raise HandshakeError(f"the peer's proof claims a {n_bind}-byte channel binding")
    tail = _recv_exact(sock, n_bind + DIGEST_BYTES, deadline, "reading the peer's proof")
    claimed_bind, proof = tail[:n_bind], tail[n_bind:]
    nonce = nonce_c[:NONCE_BYTES]
    bound = creds.bind_addresses
    mine = _proof_part(nonce, view, _channel(sock))
    expected = _mac(key, b"C", purpose, hello, verdict_bytes, mine)
    if not hmac.compare_digest(proof, expected):
        claimed = _proof_part(nonce, claimed_view if bound else b"", claimed_bind)
        status = (
            RELAYED
            if hmac.compare_digest(proof, _mac(key, b"C", purpose, hello, verdict_bytes, claimed))
            else BAD_PROOF
        )
        try:
            _send_all(sock, bytes([status]), deadline)
        except HandshakeError:
            pass
        detail = ""
        if status == RELAYED:
            detail = f" (the peer sees {claimed_view.decode('ascii', 'replace')}, we see "
            detail += f"{view.decode('ascii', 'replace')})"
        raise HandshakeError(_RESULT_TEXT[status] + detail)
    answer = _mac(key, b"A", purpose, hello, verdict_bytes, mine, proof)
    _send_all(sock, bytes([OK]) + answer, deadline)
    return sock


def connect_handshake(
    sock: socket.socket, creds: Secret, purpose: bytes, timeout: float = 10.0
) -> socket.socket:
    """The connector's side. Returns the socket to use from now on (a TLS one with TLS);
    raises HandshakeError unless the acceptor proved the job's key on this connection.
    `creds`: Credentials, or a secret for credentials()."""
    creds = _as_credentials(creds)
    deadline = time.monotonic() + timeout
    key_id = creds.key.derive(b"key id")[:KEY_ID_BYTES]
    # The magic first: an older server's hello is shorter, and is named as such.
    magic = _recv_exact(sock, len(MAGIC), deadline, "waiting for the server's hello")
    if magic == MAGIC:
        rest = _recv_exact(sock, _HELLO.size - len(MAGIC), deadline, "reading the hello")
        hello = magic + rest
        magic, status, flags, their_id, _nonce_a = _HELLO.unpack(hello)
    if magic == _OLD_MAGIC:
        raise HandshakeError(
            "the server runs an older pycollective (handshake version 1): every rank and the "
            "launcher need the same version"
        )
    if magic != MAGIC:
        raise HandshakeError(
            f"the server is not a pycollective endpoint (it sent {magic[:8]!r}): another "
            "program holds that address?"
        )
    if status == BUSY:
        raise HandshakeError("the server has no room for another connection now", transient=True)
    if status != GO_ON:
        raise HandshakeError(f"the server sent an unknown hello status {status}")
    verdict = GO_ON
    if their_id != key_id:
        verdict = KEYS_DIFFER
    elif bool(flags & TLS_FLAG) != (creds.tls is not None):
        verdict = TLS_DIFFERS
    verdict_bytes = _VERDICT.pack(verdict, key_id, creds.flags)
    _send_all(sock, verdict_bytes, deadline)
    if verdict == KEYS_DIFFER:
        raise HandshakeError(
            f"the server's key differs from ours (its key id {their_id.hex()}, ours "
            f"{key_id.hex()}); {creds.key.hint()}"
        )
    if verdict == TLS_DIFFERS:
        raise HandshakeError(
            "the server "
            + (
                "does not use TLS but this rank does"
                if creds.tls
                else "uses TLS but this rank does not"
            )
            + ": set PYCOLLECTIVE_TLS (and the certificates) the same on every rank"
        )
    view = _view(sock, connector=True) if flags & BOUND_FLAG else b""
    tls = bool(flags & TLS_FLAG)
    return _second_half(
        _prove, sock, creds, tls, False, purpose, deadline, hello, verdict_bytes, view
    )


def _prove(
    sock: socket.socket,
    creds: Credentials,
    purpose: bytes,
    deadline: float,
    hello: bytes,
    verdict_bytes: bytes,
    view: bytes,
) -> socket.socket:
    """The connector's second half: send our proof, check the acceptor's."""
    key = creds.handshake_key()
    mine = _proof_part(os.urandom(NONCE_BYTES), view, _channel(sock))
    proof = _mac(key, b"C", purpose, hello, verdict_bytes, mine)
    # Our view goes in the clear too (the proof covers it), so that the acceptor can tell a
    # relay from a wrong key.
    _send_all(sock, mine + proof, deadline)
    try:
        result = _recv_exact(sock, 1, deadline, "waiting for the server's judgement")[0]
    except HandshakeError as exc:
        exc.late = True
        raise
    if result != OK:
        text = _RESULT_TEXT.get(result, f"the server refused us (status {result})")
        if result == BAD_PROOF:
            text = "the server did not accept our proof of the job's key: " + creds.key.hint()
        raise HandshakeError(text)
    answer = _recv_exact(sock, DIGEST_BYTES, deadline, "waiting for the server's proof")
    if not hmac.compare_digest(answer, _mac(key, b"A", purpose, hello, verdict_bytes, mine, proof)):
        raise HandshakeError(
            "the server failed the job-key challenge: it is not this job's (another program "
            "holds that address?)"
        )
    return sock


def connect_retrying(
    dial: Callable[[float], socket.socket],
    creds: Credentials,
    purpose: bytes,
    deadline: float,
    where: str,
    abort: Callable[[], None] | None = None,
    min_handshake: float = 1.0,
) -> socket.socket:
    """Dial (`dial(seconds)` returns a connected socket) and shake hands until it works or
    `deadline` passes; a transient refusal (busy, evicted, dropped) is retried with a
    growing pause, a final one raises at once. Each handshake may take `min_handshake`
    seconds even past the deadline (a short deadline is for finding the server). `abort()`
    may raise to give up early."""
    pause = 0.01
    late = 0  # drops after our proof: a real acceptor answers a proof, a squatter may not
    while True:
        if abort is not None:
            abort()
        sock = dial(max(0.0, deadline - time.monotonic()))
        try:
            budget = min(30.0, max(min_handshake, deadline - time.monotonic()))
            return connect_handshake(sock, creds, purpose, timeout=budget)
        except HandshakeError as exc:
            sock.close()
            late += exc.late
            if not exc.transient or late >= _LATE_DROPS:
                if exc.transient:
                    raise HandshakeError(
                        f"{where} dropped our handshake {late} times after our proof instead "
                        "of judging it: it is not this job's (another program holds that "
                        f"address?); last: {exc}"
                    ) from None
                raise
            if time.monotonic() + pause >= deadline:
                raise HandshakeError(
                    f"could not authenticate with {where} in time: {exc}"
                ) from None
            log.debug("handshake with %s failed (%s); retrying", where, exc)
        except BaseException:
            sock.close()
            raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


# ---------------------------------------------------------------------- acceptor slots


class HandshakeGate:
    """Slots for connections that have not proved anything yet. There are `limit` of them,
    at most `per_source` for one address; when they are full the oldest pending handshake
    (of the same address, if that one is over its share) is cut off for the newcomer. A real
    peer finishes within a round trip, so a flood must outpace that to delay it, and the
    connector retries (connect_retrying); a peer that connects and says nothing holds a
    slot only until newer ones push it out or its timeout ends.

    A slot names its connection by descriptor and socket inode (TLS wraps the socket object
    during the handshake; the descriptor stays), so a connection closed meanwhile, whose
    descriptor another one took, is never cut off by mistake."""

    def __init__(self, limit: int = 256, per_source: int = 64) -> None:
        self.limit = limit
        self.per_source = per_source
        self.evicted = 0
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], str] = {}  # slot -> source, in arrival order

    def enter(self, sock: socket.socket, source: str) -> tuple[int, int]:
        """Give `sock` (from `source`) a slot, evicting an older one if need be; returns
        the slot, for `leave`."""
        fd = sock.fileno()
        slot = (fd, os.fstat(fd).st_ino)
        with self._lock:
            victim = None
            same = [k for k, src in self._pending.items() if src == source]
            if len(same) >= self.per_source:
                victim = same[0]
            elif len(self._pending) >= self.limit:
                victim = next(iter(self._pending))
            if victim is not None:
                del self._pending[victim]
                self.evicted += 1
            self._pending[slot] = source
        if victim is not None:
            _cut_off(*victim)  # its handshake fails at once
        return slot

    def leave(self, slot: tuple[int, int]) -> None:
        with self._lock:
            self._pending.pop(slot, None)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)


def _cut_off(fd: int, inode: int) -> None:
    """Shut down the connection `fd` names if it is still the socket `inode` (checked on a
    duplicate, which cannot change under us), without closing the holder's descriptor."""
    try:
        dup = os.dup(fd)
    except OSError:
        return
    try:
        if os.fstat(dup).st_ino == inode:
            sock = socket.socket(fileno=dup)
            dup = -1  # the socket object owns it now
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()
    finally:
        if dup >= 0:
            os.close(dup)


def source_of(addr: object) -> str:
    """The address part of a peer's socket address (its port aside)."""
    if isinstance(addr, tuple) and addr:
        return _addr(addr).rpartition(":")[0]
    return str(addr)


# The job's key as bytes, for callers that need only that (see _keys.secret_from_env).
secret_from_env = _keys.secret_from_env

__all__ = [
    "Credentials",
    "HandshakeError",
    "HandshakeGate",
    "accept_handshake",
    "busy_hello",
    "connect_handshake",
    "connect_retrying",
    "credentials",
    "secret_from_env",
    "source_of",
]
