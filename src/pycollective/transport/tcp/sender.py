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
import threading

POLL_MS = 20  # a stop request is seen within this (each wait for room in the socket)


class SendHelper:
    """One daemon thread; `start` a payload tail, `wait_stopped` to take it back."""

    def __init__(self, wake: socket.socket) -> None:
        self._wake = wake  # written when a tail is finished: the progress loop's poller wakes
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._job: tuple[socket.socket, memoryview] | None = None
        self._stop = False
        self._closed = False
        self.busy = False  # a tail is being written (read by the loop under the GIL)
        self.sent = 0  # bytes of the tail written so far
        self.error: OSError | None = None

    def start(self, sock: socket.socket, tail: memoryview) -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pycollective-tcp-send", daemon=True
                )
                self._thread.start()
            self._job = (sock, tail)
            self.sent, self.error, self._stop, self.busy = 0, None, False, True
            self._cv.notify_all()

    def wait_stopped(self) -> None:
        """Stop writing (within POLL_MS) and wait until the thread has let go."""
        with self._cv:
            self._stop = True
            while self.busy:
                self._cv.wait()

    def close(self) -> None:
        """End the thread (it holds no job between exchanges: it ends at once)."""
        with self._cv:
            self._closed = self._stop = True
            self._cv.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                sock, tail = self._job
                self._job = None
            self._write(sock, tail)
            with self._cv:
                self.busy = False
                self._cv.notify_all()
            try:
                self._wake.send(b"\0")
            except OSError:
                pass  # the loop is woken already (buffer full) or closed

    def _write(self, sock: socket.socket, tail: memoryview) -> None:
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
