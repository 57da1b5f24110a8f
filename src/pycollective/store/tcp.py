"""TCPStoreServer and TCPStore: the rendezvous store over TCP.

The server gives each authenticated connection its own thread that reads a request,
answers it and loops; blocking `get`/`wait` park that thread on the shared table's
Condition, so one client's wait never holds up another client. Rendezvous means one
connection per rank, which threads serve comfortably; the accept loop itself never blocks
on a peer (handshakes run in the connection's thread, bounded by a timeout).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from .. import _auth, _config
from .._errors import AuthenticationError, StoreError, UsageError
from .._netutil import connect_with_retry
from ._base import Store, Timeout, check_keys, encode_key, encode_value, timeout_error, to_seconds
from ._memory import KVTable, StoreClosed
from ._wire import (
    MAX_FRAME_BYTES,
    Op,
    PeerClosed,
    ProtocolError,
    Status,
    encode_request,
    encode_response,
    pack_args,
    read_request,
    read_response,
    unpack_args,
)

logger = logging.getLogger("pycollective.store")

PURPOSE = b"store"
# How long past a request's own timeout a client waits for the answer before it decides
# the server is hung: a live server always answers a timed-out wait by itself.
_IO_MARGIN = 30.0


def _peer_gone(conn: socket.socket) -> bool:
    """True if the client hung up (checked without consuming anything it sent: on the raw
    socket, under TLS too)."""
    try:
        return socket.socket.recv(conn, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class TCPStoreServer:
    """Hosts a store on (host, port) from a daemon thread. port=0 picks a free port.

    Every client proves the job's key first (_auth.py): `secret=None` is the job's key
    (PYCOLLECTIVE_SECRET, PYCOLLECTIVE_SECRET_FILE or the per-user key file), so a server
    and its clients agree by default. Connections still in the handshake take slots of a
    HandshakeGate, not of `max_connections` (a flood of half-open ones cannot lock clients
    out); the keys and values held stay within `max_bytes`
    (PYCOLLECTIVE_STORE_MAX_BYTES by default).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | str | _auth.Credentials | None = None,
        *,
        handshake_timeout: float = 10.0,
        max_connections: int = 8192,
        max_bytes: int | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._creds = secret if isinstance(secret, _auth.Credentials) else _auth.credentials(secret)
        self._handshake_timeout = handshake_timeout
        self._max_connections = max_connections
        limit = max_bytes if max_bytes is not None else _config.get("PYCOLLECTIVE_STORE_MAX_BYTES")
        self._table = KVTable(limit)
        self._gate = _auth.HandshakeGate()
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._authenticated = 0
        self.refused: list[str] = []  # why recent handshakes failed (the last 16), for timeouts
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The bound port (the real one once started, even if 0 was asked for)."""
        return self._port

    @property
    def connections(self) -> int:
        """How many clients are connected now."""
        with self._lock:
            return len(self._conns)

    def clear(self) -> None:
        """Forget every key."""
        self._table.clear()

    def start(self) -> TCPStoreServer:
        """Bind, listen and serve from a daemon thread. Returns self."""
        if self._thread is not None:
            return self
        if self._closed:
            raise StoreError("this store server was closed")
        infos = socket.getaddrinfo(
            self._host or None, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _, _, _, addr = infos[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(addr)
            listener.listen(1024)
        except OSError as exc:
            listener.close()
            raise StoreError(f"cannot listen on {self._host}:{self._port}: {exc}") from exc
        self._listener = listener
        bound = listener.getsockname()
        self._port = bound[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"pycollective-store-{self._port}", daemon=True
        )
        self._thread.start()
        logger.debug("store server listening on %s:%d", bound[0], self._port)
        return self

    def close(self) -> None:
        """Close the listening socket and every connection, and join every thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join()
        if self._listener is not None:
            self._listener.close()
        self._table.close()  # releases handler threads parked in get/wait
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # unblocks a handler's recv
            except OSError:
                pass
        deadline = time.monotonic() + 10.0
        for _, thread in conns:
            thread.join(max(0.0, deadline - time.monotonic()))
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    def __enter__(self) -> TCPStoreServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TCPStoreServer(host={self._host!r}, port={self._port})"

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_r is not None
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closed:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        conn, addr = self._listener.accept()
                    except OSError as exc:
                        # EMFILE and friends: back off rather than spin; the client retries.
                        logger.warning("store accept failed: %s", exc)
                        time.sleep(0.05)
                        continue
                    self._admit(conn, addr)
        finally:
            sel.close()

    def _admit(self, conn: socket.socket, addr: object) -> None:
        with self._lock:
            if self._closed:
                conn.close()
                return
            thread = threading.Thread(
                target=self._serve, args=(conn, addr), name="pycollective-store-conn", daemon=True
            )
            self._conns[conn] = thread
        thread.start()

    def _authenticate(self, conn: socket.socket, addr: object) -> socket.socket | None:
        """The handshake, in a slot of the gate; the socket to serve, or None."""
        slot = self._gate.enter(conn, _auth.source_of(addr))
        try:
            with self._lock:
                full = self._authenticated >= self._max_connections
            if full:
                logger.warning("store refused connection from %s: too many connections", addr)
                conn.sendall(_auth.busy_hello())
                return None
            sock = _auth.accept_handshake(conn, self._creds, PURPOSE, self._handshake_timeout)
        except (AuthenticationError, OSError) as exc:
            if not self._closed:
                logger.warning("store refused connection from %s: %s", addr, exc)
                self.refused = [*self.refused[-15:], f"{_auth.source_of(addr)}: {exc}"]
            return None
        finally:
            self._gate.leave(slot)
        with self._lock:
            self._authenticated += 1
            if sock is not conn:  # TLS: close() must reach the wrapped socket
                self._conns[sock] = self._conns.pop(conn)
        return sock

    def _serve(self, conn: socket.socket, addr: object) -> None:
        leases: dict[bytes, bytes] = {}  # keys this connection holds (Op.SET_LEASE)
        authed = False
        try:
            sock = self._authenticate(conn, addr)
            if sock is None:
                return
            conn, authed = sock, True
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._closed:
                try:
                    op, args, timeout = read_request(conn)
                except PeerClosed:
                    logger.debug("store client %s disconnected", addr)
                    return
                except ProtocolError as exc:
                    logger.warning("store closed connection from %s: bad frame: %s", addr, exc)
                    return
                try:
                    status, payload = self._execute(op, args, timeout, lambda: _peer_gone(conn))
                except StoreClosed:
                    return
                if op is Op.SET_LEASE and status is Status.OK:
                    leases[args[0]] = args[1]
                conn.sendall(encode_response(status, payload))
        except OSError as exc:
            if not self._closed:
                logger.debug("store connection from %s failed: %s", addr, exc)
        except Exception:  # a bug here must not take the server down with it
            logger.exception("store connection from %s crashed", addr)
        finally:
            conn.close()
            for key, value in leases.items():
                self._table.delete_if(key, value)  # unless someone set it since
            with self._lock:
                self._conns.pop(conn, None)
                if authed:
                    self._authenticated -= 1

    def _execute(
        self, op: Op, args: list[bytes], timeout: float | None, abandoned: Callable[[], bool]
    ) -> tuple[Status, bytes]:
        table = self._table
        if op in (Op.SET, Op.SET_LEASE):
            try:
                table.set(args[0], args[1])
            except StoreError as exc:
                return Status.ERROR, str(exc).encode()
            return Status.OK, b""
        if op is Op.GET:
            value = table.get(args[0], timeout, abandoned)
            if value is None:
                return Status.TIMEOUT, pack_args(args)
            return Status.OK, value
        if op is Op.ADD:
            try:
                amount = int(args[1].decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return Status.ERROR, b"add: the amount is not an integer"
            try:
                return Status.OK, str(table.add(args[0], amount)).encode("ascii")
            except StoreError as exc:
                return Status.ERROR, str(exc).encode()
        if op is Op.COMPARE_SET:
            try:
                return Status.OK, table.compare_set(args[0], args[1], args[2])
            except StoreError as exc:
                return Status.ERROR, str(exc).encode()
        if op is Op.WAIT:
            missing = table.wait(args, timeout, abandoned)
            return (Status.TIMEOUT, pack_args(missing)) if missing else (Status.OK, b"")
        if op is Op.CHECK:
            return Status.OK, b"1" if table.check(args) else b"0"
        if op is Op.DELETE:
            return Status.OK, b"1" if table.delete(args[0]) else b"0"
        if op is Op.NUM_KEYS:
            return Status.OK, str(table.num_keys()).encode("ascii")
        raise AssertionError(f"unhandled op {op}")  # _wire.ARITY lists every op


class TCPStore(Store):
    """A client of a TCPStoreServer; with is_master=True it also hosts the server.

    Connects with retries until the server is up (bounded by `connect_timeout`, which
    defaults to `timeout`), then proves the job's key (`secret=None`: the job's key, see
    TCPStoreServer), retrying while the server is busy. Safe to share between threads:
    requests are serialized on one connection. With is_master=True the server listens on
    `host` itself (a loopback address keeps it off the network).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | str | _auth.Credentials | None = None,
        timeout: Timeout = 300.0,
        connect_timeout: Timeout = None,
        *,
        is_master: bool = False,
    ) -> None:
        super().__init__(timeout)
        self._host = host
        self._creds = secret if isinstance(secret, _auth.Credentials) else _auth.credentials(secret)
        self._server: TCPStoreServer | None = None
        if is_master:
            bind = "" if host in ("", "0.0.0.0", "::") else host
            self._server = TCPStoreServer(bind, port, self._creds).start()
            port = self._server.port
        elif not 0 < port < 65536:
            raise UsageError(f"store port must be in 1..65535, got {port}")
        self._port = port
        self._lock = threading.Lock()
        self._broken: str | None = None
        connect_seconds = self.timeout if connect_timeout is None else to_seconds(connect_timeout)
        try:
            self._sock: socket.socket | None = self._connect(connect_seconds)
        except BaseException:
            if self._server is not None:
                self._server.close()
            raise

    @classmethod
    def create(
        cls,
        host: str,
        port: int,
        is_master: bool,
        secret: bytes | str | None = None,
        timeout: Timeout = 300.0,
    ) -> TCPStore:
        """A client of host:port that, on the master, first starts the server there."""
        return cls(host, port, secret, timeout, is_master=is_master)

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def server(self) -> TCPStoreServer | None:
        """The server this store hosts (is_master=True), else None."""
        return self._server

    def _where(self) -> str:
        return f"the store at {self._host}:{self._port}"

    def _connect(self, budget: float | None) -> socket.socket:
        deadline = float("inf") if budget is None else time.monotonic() + budget

        def dial(seconds: float) -> socket.socket:
            # refused, unreachable, unresolvable yet: the server may be starting up
            until = None if budget is None else time.monotonic() + seconds
            try:
                sock = connect_with_retry(self._host, self._port, until, attempt_timeout=10.0)
            except OSError as exc:
                raise StoreError(
                    f"could not connect to {self._where()} within {budget:g} s: {exc}"
                ) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

        try:
            return _auth.connect_retrying(
                dial, self._creds, PURPOSE, deadline, self._where(), min_handshake=5.0
            )
        except AuthenticationError as exc:
            raise AuthenticationError(f"{self._where()} refused us: {exc}") from None

    def _request(
        self, op: Op, args: list[bytes], timeout: float | None = None
    ) -> tuple[Status, bytes]:
        frame = encode_request(op, args, timeout)
        if len(frame) > MAX_FRAME_BYTES:
            raise UsageError(f"store request of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
        budget = timeout if op in (Op.GET, Op.WAIT) else self.timeout
        io_timeout = None if budget is None else budget + _IO_MARGIN
        with self._lock:
            sock = self._sock
            if sock is None:
                raise StoreError(self._broken or f"{self._where()}: client is closed")
            try:
                sock.settimeout(io_timeout)
                sock.sendall(frame)
                status, payload = read_response(sock)
            except TimeoutError:
                self._fail(f"{self._where()} did not answer within {io_timeout:g} s")
            except PeerClosed:
                self._fail(f"lost the connection to {self._where()} (server gone?)")
            except ProtocolError as exc:
                self._fail(f"{self._where()} sent a bad frame: {exc}")
            except OSError as exc:
                self._fail(f"lost the connection to {self._where()}: {exc}")
        if status is Status.ERROR:
            raise StoreError(payload.decode("utf-8", "replace"))
        return status, payload

    def _integer(self, op: Op, payload: bytes) -> int:
        """The integer a server answered `op` with; anything else is a broken server."""
        try:
            return int(payload.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            self._fail(f"{self._where()} answered {op.name} with {payload[:32]!r}, not an integer")

    def _fail(self, reason: str) -> NoReturn:
        # The stream may be mid-frame, so the connection cannot be reused: every later
        # call fails with the same reason instead of reading a stale answer.
        self._broken = reason
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        raise StoreError(reason)

    def set(self, key: str, value: bytes | str) -> None:
        self._request(Op.SET, [encode_key(key), encode_value(value)])

    def set_lease(self, key: str, value: bytes | str) -> None:
        """Set `key`, which the server deletes when this client's connection closes: when
        the client closes it, or its process dies (the kernel closes its socket). A
        liveness lease: other clients `check` for the key to learn whether it is alive.
        A later set of the same key by anyone keeps it (the lease only removes its value)."""
        self._request(Op.SET_LEASE, [encode_key(key), encode_value(value)])

    def get(self, key: str, timeout: Timeout = None) -> bytes:
        seconds = self._resolve(timeout)
        status, payload = self._request(Op.GET, [encode_key(key)], seconds)
        if status is Status.TIMEOUT:
            raise timeout_error([key], seconds, self._where())
        return payload

    def add(self, key: str, amount: int) -> int:
        _, payload = self._request(Op.ADD, [encode_key(key), str(int(amount)).encode("ascii")])
        return self._integer(Op.ADD, payload)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        args = [encode_key(key), encode_value(expected), encode_value(desired)]
        return self._request(Op.COMPARE_SET, args)[1]

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        names = check_keys(keys)
        seconds = self._resolve(timeout)
        status, payload = self._request(Op.WAIT, [encode_key(k) for k in names], seconds)
        if status is Status.TIMEOUT:
            try:
                missing = [m.decode("utf-8", "replace") for m in unpack_args(payload)]
            except ProtocolError as exc:
                self._fail(f"{self._where()} sent a bad list of missing keys: {exc}")
            raise timeout_error(names, seconds, self._where(), missing)

    def check(self, keys: Sequence[str]) -> bool:
        names = check_keys(keys)
        return self._request(Op.CHECK, [encode_key(k) for k in names])[1] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._request(Op.DELETE, [encode_key(key)])[1] == b"1"

    def num_keys(self) -> int:
        return self._integer(Op.NUM_KEYS, self._request(Op.NUM_KEYS, [])[1])

    def close(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                # Wakes a thread blocked in get/wait (it holds the lock) so close never waits.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            sock, self._sock = self._sock, None
            self._broken = f"{self._where()}: client is closed"
        if sock is not None:
            sock.close()
        if self._server is not None:
            self._server.close()

    def __repr__(self) -> str:
        return (
            f"TCPStore(host={self._host!r}, port={self._port}, master={self._server is not None})"
        )


__all__ = ["TCPStore", "TCPStoreServer"]
