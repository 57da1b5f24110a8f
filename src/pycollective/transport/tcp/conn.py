"""One TCP connection's state (its receive state machine and send queue) and the poller
that says which connections are ready. No protocol rules here: transport.py drives them."""

from __future__ import annotations

import select
import selectors
import socket
import ssl
from collections import deque
from typing import Any

from ..._netutil import both_ends_loopback
from .._base import InMessage, OutMessage
from .._wire import Header
from .stash import Stash

# Each connection's read buffer: 64 KiB and room for a header, so that a 64 KiB payload's
# frame fits whole and a repeated 64 KiB swap takes the compiled round (swap.py). At 64 KiB
# exactly it went the large swap's Python loop: 0.83-1.06x OpenMPI's time across hosts
# against 1.10-1.30x with the room (2026-12-07, ours and OpenMPI alternating, three jobs).
RBUF_BYTES = (64 << 10) + 64


class Conn:
    """One peer's socket with its receive state machine and its send queue."""

    __slots__ = (
        "peer",
        "sock",
        "rbuf",
        "rpos",
        "rend",
        "window",
        "left",
        "cur",
        "target",
        "stash",
        "view",
        "got",
        "outq",
        "out_hdr",
        "out_sent",
        "writing",
        "lost",
        "last",
        "tls",
        "write_pending",
        "helper",
        "reader",
        "loopback",
    )

    def __init__(self, peer: int, sock: socket.socket) -> None:
        self.peer = peer
        self.sock = sock
        # Incoming bytes are read through this buffer, so one recv takes a header and a
        # small payload (often several frames); payloads bigger than _DIRECT_BYTES are read
        # straight into their destination. rbuf[rpos:rend] is what is read and not used yet.
        self.rbuf = memoryview(bytearray(RBUF_BYTES))
        self.rpos = 0
        self.rend = 0
        self.window: memoryview | None = None  # where a sink's pieces are read (_SINK_BYTES)
        self.left = 0  # bytes of a sink's payload not yet given a piece of the window
        self.cur: Header | None = None  # header of the payload being read
        self.target: InMessage | None = None  # where it goes, if a receive was posted
        self.stash: Stash | None = None  # else, where it is kept
        self.view: memoryview | None = None
        self.got = 0
        self.outq: deque[OutMessage] = deque()
        self.out_hdr = b""
        self.out_sent = 0  # bytes of header+payload of outq[0] already sent
        self.writing = False
        self.lost: str | None = None
        self.last: Header | None = None  # the last frame header read: what the peer was doing
        # TLS (an ssl.SSLSocket): no sendmsg, reads return a record at a time and may leave
        # decrypted bytes inside the SSL object that the poller cannot see (pending()), and
        # a write the socket had no room for must be retried with the same bytes before any
        # other write (write_pending).
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.write_pending = False
        self.helper = False  # the send helper writes the tail of outq[0] (sender.py)
        self.reader = False  # the receive helper reads the current payload (receiver.py)
        # Both ends on loopback addresses: the peer is on this host, as it sees too
        # (TCPTransport.same_host). Read once, while the socket is connected.
        self.loopback = both_ends_loopback(sock)


class Poller:
    """Which sockets are ready: epoll itself where there is one (the selectors module's
    wrapper costs as much again per call, and a small collective polls twice), else a
    selector. `select` yields (data, readable, writable); an error or hang-up counts as
    both, as with selectors, so that the next recv or send finds out what happened."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._selector = None if self._epoll is not None else selectors.DefaultSelector()
        self._data: dict[int, Any] = {}  # fd -> data
        self._fds: dict[socket.socket, int] = {}

    def register(self, sock: socket.socket, data: Any, write: bool = False) -> None:
        fd = sock.fileno()
        self._fds[sock] = fd
        self._data[fd] = data
        if self._epoll is not None:
            self._epoll.register(fd, select.EPOLLIN | (select.EPOLLOUT if write else 0))
        else:
            assert self._selector is not None  # noqa: S101
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
            self._selector.register(sock, events, data)

    def modify(self, sock: socket.socket, data: Any, write: bool, read: bool = True) -> None:
        """Watch `sock` for writing if `write`, and for reading unless `read` is False
        (another thread reads it; an error or hang-up is still reported). Only epoll can
        leave reading out (`unwatches_reads`): a selector always watches it."""
        fd = self._fds[sock]  # KeyError if not registered, as selectors
        self._data[fd] = data
        if self._epoll is not None:
            events = (select.EPOLLIN if read else 0) | (select.EPOLLOUT if write else 0)
            self._epoll.modify(fd, events)
        else:
            assert self._selector is not None  # noqa: S101
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
            self._selector.modify(sock, events, data)

    @property
    def unwatches_reads(self) -> bool:
        return self._epoll is not None

    def unregister(self, sock: socket.socket) -> None:
        """Forget `sock` (nothing happens if it was not registered)."""
        fd = self._fds.pop(sock, None)
        if fd is None:
            return
        self._data.pop(fd, None)
        try:
            if self._epoll is not None:
                self._epoll.unregister(fd)
            else:
                assert self._selector is not None  # noqa: S101
                self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass  # already closed: the kernel forgot it

    def select(self, timeout: float) -> list[tuple[Any, bool, bool]]:
        if self._epoll is not None:
            data = self._data
            out = []
            for fd, ev in self._epoll.poll(timeout):
                if fd in data:
                    out.append((data[fd], bool(ev & _NOT_OUT), bool(ev & _NOT_IN)))
            return out
        assert self._selector is not None  # noqa: S101
        return [
            (key.data, bool(mask & selectors.EVENT_READ), bool(mask & selectors.EVENT_WRITE))
            for key, mask in self._selector.select(timeout)
        ]

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        else:
            assert self._selector is not None  # noqa: S101
            self._selector.close()
        self._data.clear()
        self._fds.clear()


if hasattr(select, "epoll"):
    _NOT_OUT = ~select.EPOLLOUT  # readable: anything but "writable" (in, error, hang-up)
    _NOT_IN = ~select.EPOLLIN  # writable: anything but "readable"
