"""A thread that writes the rest of one large payload while the exchange's own thread
reads and reduces: each send() is a copy into the kernel with the GIL released, so a
rank's sending and receiving copies run at once (on two cores when there are two, and as
two threads with two shares of a core when other jobs compete for it, as gloo's I/O
thread and caller do).

It owns nothing between exchanges: the progress loop hands it the tail of the frame at
the head of one connection's queue (sending.py) and takes it back, finished or not,
before the exchange returns or raises (progress.py), so the queue, the stream position
and every failure rule stay the single-threaded ones."""

from __future__ import annotations

import select
import socket

from .helper_thread import OneJobThread

POLL_MS = 20  # a stop request is seen within this (each wait for room in the socket)


class SendHelper(OneJobThread):
    """Writes one payload tail at a time: `start` it, `wait_stopped` to take it back."""

    def __init__(self, wake: socket.socket) -> None:
        super().__init__(wake, "pycollective-tcp-send")
        self.sent = 0  # bytes of the tail written so far
        self.error: OSError | None = None

    def start(self, sock: socket.socket, tail: memoryview) -> None:
        with self._cv:
            self.sent, self.error = 0, None
            self._launch((sock, tail))

    def _work(self, job: tuple[socket.socket, memoryview]) -> None:
        sock, tail = job
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLOUT)
        size, sent = tail.nbytes, 0
        while sent < size and not self._stop:
            try:
                sent += sock.send(tail[sent:])
            except (BlockingIOError, InterruptedError):
                poller.poll(POLL_MS)
            except OSError as exc:
                self.error = exc
                break
            self.sent = sent
