"""Building the mesh: every pair of ranks connects once, authenticated (_auth.py: the job's
key, bound to the connection, in TLS when asked), with addresses exchanged through the
rendezvous store. A store we do not authenticate (torchrun's) can at worst point a rank at
a wrong address: the handshake then fails, nobody gets in."""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable

from ... import _auth
from ..._errors import AuthenticationError, CollectiveTimeout, TransportError
from ..._netutil import connect_with_retry
from .transport import TCPTransport

log = logging.getLogger("pycollective.transport")

_HELLO = struct.Struct("<4sII")  # b"HELO", rank, world size
_PURPOSE = b"transport"


Abort = Callable[[], str | None] | None  # a reason to give up now, or None to go on


def _check(abort: Abort) -> None:
    reason = abort() if abort is not None else None
    if reason:
        raise TransportError(f"the mesh set-up was abandoned: {reason}")


def _connect_with_retry(
    host: str, port: int, deadline: float, abort: Abort = None
) -> socket.socket:
    while True:
        _check(abort)
        # with an abort check, retry in short slices and ask it between them
        part = deadline if abort is None else min(deadline, time.monotonic() + 0.25)
        try:
            return connect_with_retry(host, port, part)
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TransportError(f"could not connect to {host}:{port}: {exc}") from None


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect_mesh(
    rank: int,
    size: int,
    store,
    prefix: str,
    creds: _auth.Credentials,
    bind_host: str,
    advertise_host: str,
    timeout: float,
    abort: Abort = None,
) -> TCPTransport:
    """Connect every pair of ranks: rank i dials every j < i and accepts every j > i.

    Addresses are exchanged through the rendezvous store. Rank i only dials ranks that are
    already listening, and every rank listens before it dials, so this cannot deadlock.
    A dial whose handshake the peer refused for now (busy, evicted by a flood) is tried
    again until the deadline; one whose key differs fails at once. A connection that fails
    the handshake on the accepting side is logged and dropped; the mesh goes on.
    `abort`, if given, is asked while waiting for peers: a reason it returns ends the
    set-up at once with TransportError (pycollective.elastic: a member's lease ended).
    """
    deadline = time.monotonic() + timeout
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conns: dict[int, socket.socket] = {}
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind_host, 0))
        listener.listen(max(64, size))
        port = listener.getsockname()[1]
        store.set(f"{prefix}/tcp/{rank}", f"{advertise_host}:{port}".encode())
        for peer in range(rank):
            addr = store.get(f"{prefix}/tcp/{peer}").decode()
            host, _, peer_port = addr.rpartition(":")
            try:
                port_number = int(peer_port)
            except ValueError:
                raise TransportError(
                    f"rank {rank} found no usable address for rank {peer} in the store "
                    f"({addr[:80]!r})",
                    peer,
                ) from None

            def dial(seconds: float, host: str = host, port: int = port_number) -> socket.socket:
                return _connect_with_retry(host, port, time.monotonic() + seconds, abort)

            try:
                sock = _auth.connect_retrying(
                    dial, creds, _PURPOSE, deadline, f"rank {peer} at {addr}",
                    abort=lambda: _check(abort),
                )  # fmt: skip
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.sendall(_HELLO.pack(b"HELO", rank, size))
            except (AuthenticationError, OSError) as exc:
                raise TransportError(
                    f"rank {rank} could not join rank {peer} at {addr}: {exc}", peer
                ) from None
            _tune(sock)
            conns[peer] = sock
        expected = set(range(rank + 1, size))
        if expected:
            _accept_all(listener, rank, size, creds, expected, deadline, conns, abort)
    except BaseException:
        for sock in conns.values():
            sock.close()
        raise
    finally:
        listener.close()
    return TCPTransport(rank, size, conns)


_ACCEPT_POLL = 0.05  # seconds between looks at finished handshakes


def _accept_all(
    listener: socket.socket,
    rank: int,
    size: int,
    creds: _auth.Credentials,
    expected: set[int],
    deadline: float,
    conns: dict[int, socket.socket],
    abort: Abort = None,
) -> None:
    """Accept until every rank in `expected` has joined, authenticating each incoming
    connection on its own short-lived thread in a slot of a HandshakeGate, so a client that
    connects and then says nothing (or dribbles, or floods) cannot hold up the real ranks:
    it times out on its own or newer connections push it out."""
    results: queue.SimpleQueue[tuple[socket.socket, int | None]] = queue.SimpleQueue()
    lock = threading.Lock()
    state = {"open": True}
    gate = _auth.HandshakeGate()
    refused: list[str] = []

    def handshake(raw: socket.socket, addr: tuple) -> None:
        slot = gate.enter(raw, _auth.source_of(addr))
        try:
            sock, peer = _accept_peer(raw, addr, rank, size, creds, deadline, refused)
        finally:
            gate.leave(slot)
        with lock:
            if state["open"]:
                results.put((sock, peer))
                return
        sock.close()  # the mesh is done (or gave up): nobody will take this one

    try:
        while expected:
            while True:  # collect finished handshakes
                try:
                    sock, peer = results.get_nowait()
                except queue.Empty:
                    break
                if peer is None:
                    continue  # refused and closed by _accept_peer
                if peer not in expected:
                    log.warning(
                        "rank %d refused a second connection claiming to be rank %d", rank, peer
                    )
                    sock.close()
                    continue
                _tune(sock)
                conns[peer] = sock
                expected.discard(peer)
            if not expected:
                break
            _check(abort)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                why = f" (refused meanwhile: {'; '.join(refused[-3:])})" if refused else ""
                raise CollectiveTimeout(
                    f"rank {rank} timed out waiting for rank(s) {sorted(expected)} to connect{why}",
                    op="init",
                    waiting_on=sorted(expected),
                )
            listener.settimeout(min(remaining, _ACCEPT_POLL))
            try:
                sock, addr = listener.accept()
            except (TimeoutError, BlockingIOError, InterruptedError):
                continue
            threading.Thread(
                target=handshake,
                args=(sock, addr),
                name=f"pycollective-handshake-{rank}",
                daemon=True,
            ).start()
    finally:
        with lock:
            state["open"] = False
        while True:  # finished but not taken: close them
            try:
                sock, peer = results.get_nowait()
            except queue.Empty:
                break
            if conns.get(peer) is not sock:
                sock.close()


def _accept_peer(
    sock: socket.socket,
    addr: tuple,
    rank: int,
    size: int,
    creds: _auth.Credentials,
    deadline: float,
    refused: list[str] | None = None,
) -> tuple[socket.socket, int | None]:
    """Authenticate an incoming connection: (the socket to use, its rank), or (it, None)
    once it is refused and closed."""
    try:
        sock = _auth.accept_handshake(
            sock, creds, _PURPOSE, timeout=min(5.0, max(0.1, deadline - time.monotonic()))
        )
        sock.settimeout(min(5.0, max(0.1, deadline - time.monotonic())))
        data = b""
        while len(data) < _HELLO.size:
            chunk = sock.recv(_HELLO.size - len(data))
            if not chunk:
                raise AuthenticationError("closed before saying which rank it is")
            data += chunk
        magic, peer, peer_size = _HELLO.unpack(data)
        if magic != b"HELO" or peer_size != size or not rank < peer < size:
            raise AuthenticationError(f"unexpected hello (rank {peer}, world size {peer_size})")
        return sock, peer
    except (AuthenticationError, OSError) as exc:
        log.warning("rank %d refused a connection from %s: %s", rank, addr, exc)
        if refused is not None:
            refused.append(f"{_auth.source_of(addr)}: {exc}")
        sock.close()
        return sock, None
