"""Orders the operations of one process.

All groups of a process share one transport, which is driven by one thread at a time.
Operations run in the order they were issued: a synchronous call runs inline in the
caller's thread once everything issued before it is done; an asynchronous one runs on a
single worker thread. Point-to-point operations are batched: isend/irecv only record what
to do, and the whole batch runs as one concurrent exchange when one of its handles is
waited on or another operation is issued, so the common "irecv then isend" pattern on
two ranks cannot deadlock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ._work import Work

Job = Callable[[], Any]


class Engine:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[tuple[Job, Work]] = deque()
        self._running = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._p2p: list[tuple[Any, Work]] = []  # deferred point-to-point operations
        self._p2p_runner: Callable[[list[tuple[Any, Work]]], None] | None = None

    def set_p2p_runner(self, runner: Callable[[list[tuple[Any, Work]]], None]) -> None:
        self._p2p_runner = runner

    # ------------------------------------------------------------------ collectives

    def run(self, job: Job) -> Any:
        """Run `job` in this thread after everything issued before it."""
        self.flush_p2p()
        with self._cv:
            while self._queue or self._running:
                self._cv.wait()
            self._running = True
        try:
            return job()
        finally:
            with self._cv:
                self._running = False
                self._cv.notify_all()

    def submit(self, job: Job, work: Work) -> Work:
        """Run `job` on the worker thread after everything issued before it."""
        self.flush_p2p()
        self._enqueue(job, work)
        return work

    def _enqueue(self, job: Job, work: Work) -> None:
        with self._cv:
            if self._stopped:
                raise RuntimeError("the process group was destroyed")
            self._queue.append((job, work))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._worker, name="pycollective-engine", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and (not self._queue or self._running):
                    self._cv.wait()
                if self._stopped and not self._queue:
                    return
                job, work = self._queue[0]
                self._running = True
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                work._fail(exc)
            else:
                work._complete()
            finally:
                with self._cv:
                    self._queue.popleft()
                    self._running = False
                    self._cv.notify_all()

    # ------------------------------------------------------------------ point-to-point

    def defer_p2p(self, op: Any, work: Work) -> Work:
        with self._cv:
            self._p2p.append((op, work))
        work._on_demand = self.flush_p2p
        return work

    def flush_p2p(self) -> None:
        """Start the deferred point-to-point batch (on the worker thread)."""
        with self._cv:
            batch, self._p2p = self._p2p, []
        if not batch:
            return
        for _, work in batch:
            work._on_demand = None
        runner = self._p2p_runner
        assert runner is not None  # noqa: S101 - set by the group that owns this engine
        done = Work("p2p batch")

        def job() -> None:
            try:
                runner(batch)
            except BaseException as exc:
                for _, work in batch:
                    work._fail(exc)
                raise
            for _, work in batch:
                work._complete()

        self._enqueue(job, done)

    def idle(self) -> None:
        """Wait for everything issued so far."""
        self.flush_p2p()
        with self._cv:
            while self._queue or self._running:
                self._cv.wait()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopped = True
            pending = list(self._queue)
            self._cv.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        for _, work in pending[1:] if self._running else pending:
            if not work._future.done():
                work._fail(RuntimeError("the process group was destroyed before this ran"))
