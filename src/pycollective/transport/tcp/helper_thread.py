"""The life of a TCP helper thread (sender.py, receiver.py): one daemon thread that takes
one job at a time from the progress loop, does it with the GIL released in its socket
calls, and gives it back. The loop starts a job, may ask it to stop (seen within the
helper's poll), and waits until the thread has let go, before the exchange returns or
raises: between exchanges a helper owns nothing, so it needs no other shutdown than
`close`."""

from __future__ import annotations

import socket
import threading
from typing import Any


class OneJobThread:
    """A daemon thread started at the first job; subclasses do one job in `_work`."""

    def __init__(self, wake: socket.socket, name: str) -> None:
        self._wake = wake  # written when there is news: the progress loop's poller wakes
        self._name = name
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._job: Any = None
        self._stop = False
        self._closed = False
        self.busy = False  # a job is under way (read by the loop under the GIL)

    def _launch(self, job: Any) -> None:
        """Hand the thread `job` (called with `_cv` held, the job's state already reset)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._job = job
        self._stop, self.busy = False, True
        self._cv.notify_all()

    def wait_stopped(self) -> None:
        """Stop the job (within the helper's poll) and wait until the thread has let go."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()  # a helper waiting on the loop (receiver's windows) sees it
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

    def _work(self, job: Any) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            self._work(job)
            with self._cv:
                self.busy = False
                self._cv.notify_all()
            self._poke()

    def _poke(self) -> None:
        try:
            self._wake.send(b"\0")
        except OSError:
            pass  # the loop is woken already (buffer full) or closed
