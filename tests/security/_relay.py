"""Tools of the attacker in the attack tests: a relay that forwards (and may change) the
bytes of a connection, a squatter that answers on a port with a hello of its choosing, and
a flood of half-open connections."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable


class Relay:
    """Listens on 127.0.0.1 and forwards every connection to `target`, both ways, through
    `tamper(direction, data) -> data` ("up": client to target). Records what clients sent."""

    def __init__(
        self,
        target: tuple[str, int],
        tamper: Callable[[str, bytes], bytes] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.target = target
        self.tamper = tamper or (lambda direction, data: data)
        self.sent_up: list[bytes] = []
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._pipes: list[threading.Thread] = []
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._open += [client, upstream]
            for args in ((client, upstream, "up"), (upstream, client, "down")):
                pipe = threading.Thread(target=self._pipe, args=args, daemon=True)
                self._pipes.append(pipe)
                pipe.start()

    def _pipe(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if direction == "up":
                    self.sent_up.append(data)
                dst.sendall(self.tamper(direction, data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Stops every thread before any descriptor is freed: a thread still in recv on a
        closed socket's number could read the next test's connection that reuses it."""
        self._closed = True
        _shut(self._listener)  # wakes accept()
        self._acceptor.join(5)  # then no connection is added while the pipes stop
        for s in self._open:
            _shut(s)  # wakes the pipes' recv()
        for pipe in self._pipes:
            pipe.join(5)
        self._listener.close()
        for s in self._open:
            s.close()


class Squatter:
    """Holds a port and greets every connection with `hello` (then reads what comes)."""

    def __init__(self, hello: bytes, port: int = 0, hang_up: bool = False) -> None:
        self.hello = hello
        self.hang_up = hang_up  # after reading what the client sent, instead of staying
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self.heard: list[bytes] = []
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            try:
                conn.sendall(self.hello)
                conn.settimeout(2)
                heard = b""
                while len(heard) < 60:  # the client's verdict and proof
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    heard += chunk
                self.heard.append(heard)
                if self.hang_up:
                    conn.close()
            except OSError:
                pass

    def close(self) -> None:
        """As Relay.close: the thread ends before the descriptors are freed."""
        _shut(self._listener)
        for c in self._conns:
            _shut(c)
        self._thread.join(5)
        self._listener.close()
        for c in self._conns:
            c.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or closed already


class Flood:
    """Keeps up to `n` connections to `port` open that never say a word, opening new ones
    as the server drops old ones, until stopped."""

    def __init__(self, port: int, n: int = 300, host: str = "127.0.0.1") -> None:
        self.port, self.n, self.host = port, n, host
        self.opened = 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._socks = [s for s in self._socks if not _dead(s)]
            if len(self._socks) >= self.n:
                time.sleep(0.01)
                continue
            try:
                s = socket.create_connection((self.host, self.port), timeout=1)
            except OSError:
                time.sleep(0.01)  # not listening yet, or the backlog is full
                continue
            s.setblocking(False)
            self._socks.append(s)
            self.opened += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self._socks:
            s.close()


def _dead(s: socket.socket) -> bool:
    try:
        while True:
            data = s.recv(4096)  # the server's hello, then its hang-up
            if not data:
                s.close()
                return True
    except BlockingIOError:
        return False
    except OSError:
        s.close()
        return True
