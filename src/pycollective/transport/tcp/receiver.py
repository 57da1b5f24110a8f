"""A thread that reads the rest of one large payload, piece by piece, while the exchange's
own thread reduces the pieces already in: each recv_into is a copy out of the kernel with
the GIL released, so a rank's reading and reducing run at once, and both threads sleep
and wake as pieces come instead of one thread running long bursts (which a busy machine's
scheduler preempts at the end of its slice: docs/tcp.md, "Under load").

It owns nothing between exchanges: the progress loop hands it the rest of the payload at
the head of one connection's stream, exactly that many bytes (receiving.py), and takes it
back, finished or not, before the exchange returns or raises (progress.py). Pieces go back
to the loop in order through `take`, each read into one of a few windows (a reduction's
payload) or straight into the destination (a plain one), and the loop gives each back with
`give_back` once it has used it: at most `WINDOWS` pieces are read ahead of the loop."""

from __future__ import annotations

import select
import socket
from collections import deque

from .helper_thread import OneJobThread

POLL_MS = 20  # a stop request is seen within this (each wait for bytes)
WINDOWS = 4  # pieces read ahead of the reduction at most


class RecvHelper(OneJobThread):
    """Reads one payload's rest at a time: `start` it, `take` its pieces, `wait_stopped`."""

    def __init__(self, wake: socket.socket) -> None:
        super().__init__(wake, "pycollective-tcp-recv")
        self._piece = 0
        self._windows: list[memoryview] = []  # made at the first job, kept
        # Where the next pieces may go: free windows, or None for each piece that may be
        # read into the destination (`_into`) before the loop has taken the earlier ones.
        self._free: list[memoryview | None] = []
        self._into: memoryview | None = None
        self._ready: deque[memoryview] = deque()  # whole pieces, in stream order
        self.partial: memoryview | None = None  # a piece stopped part way: its bytes
        self.error: str | None = None  # why the connection failed, as the loop says it

    def start(
        self, sock: socket.socket, nbytes: int, piece: int, into: memoryview | None = None
    ) -> None:
        """Read `nbytes` from `sock` in pieces of `piece` bytes (the last may be short),
        into the windows, or into `into` (bytes, at least `nbytes` long) if given."""
        with self._cv:
            self._into = into
            if into is not None:
                self._free = [None] * WINDOWS
                self._piece = piece
            elif piece != self._piece or len(self._windows) != WINDOWS:
                self._windows = [memoryview(bytearray(piece)) for _ in range(WINDOWS)]
                self._piece = piece
            if into is None:
                self._free = list(self._windows)
            self._ready.clear()
            self.partial, self.error = None, None
            self._launch((sock, nbytes))

    def take(self) -> list[memoryview]:
        """The whole pieces read since the last call, in order."""
        with self._cv:
            out = list(self._ready)
            self._ready.clear()
        return out

    def give_back(self, piece: memoryview) -> None:
        """A piece `take` gave is used: its window may be read into again (or one more
        piece into the destination)."""
        with self._cv:
            if self._into is not None:
                self._free.append(None)
            else:
                for w in self._windows:
                    if w.obj is piece.obj:
                        self._free.append(w)
                        break
            self._cv.notify_all()

    def _work(self, job: tuple[socket.socket, int]) -> None:
        sock, nbytes = job
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        left, at = nbytes, 0
        while left and not self._stop:
            with self._cv:
                while not self._free and not self._stop:
                    self._cv.wait()  # the loop is WINDOWS pieces behind
                if self._stop:
                    return
                window = self._free.pop()
            size = min(self._piece, left)
            if window is None:  # straight into the destination
                assert self._into is not None  # noqa: S101
                view = self._into[at : at + size]
            else:
                view = window[:size]
            got = 0
            while got < size and not self._stop:
                try:
                    n = sock.recv_into(view[got:])
                except (BlockingIOError, InterruptedError):
                    poller.poll(POLL_MS)
                    continue
                except OSError as exc:
                    self.error = f"connection error: {exc.strerror or exc}"
                    break
                if n == 0:
                    self.error = "connection closed by peer (process exited or crashed?)"
                    break
                got += n
            if got < size:  # stopped or failed part way: the loop keeps what came
                self.partial = view[:got]
                return
            left -= size
            at += size
            with self._cv:
                self._ready.append(view)
            self._poke()
