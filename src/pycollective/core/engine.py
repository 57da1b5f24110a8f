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

from .. import _callstate
from .._errors import UsageError
from .work import Work

Job = Callable[[], Any]


class Engine:
    def __init__(self) -> None:
        # `with self._lock` where `with self._cv` would do: the same lock, without the
        # Python-level Condition.__enter__ (two per call on the hot path).
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        # What a job's path reads and writes (running, owner, stopped, the queue of
        # (job, Work) and the deferred point-to-point operations): one record shared with
        # the compiled per-call path (_callstate.py), changed only under _lock.
        self.state = _callstate.engine_state(self._lock, deque(), [])
        self._thread: threading.Thread | None = None
        self._p2p_runner: Callable[[list[tuple[Any, Work]]], None] | None = None
        self._interrupt: Callable[[str], None] | None = None
        # Threads other than the worker waiting on _cv (run, idle, stop): a job that ends
        # notifies only if one does or work is queued (notify_all costs a microsecond).
        self._waiters = 0

    def set_interrupt(self, interrupt: Callable[[str], None]) -> None:
        """`interrupt(reason)` makes the job in progress (and later ones) fail promptly."""
        self._interrupt = interrupt

    def set_p2p_runner(self, runner: Callable[[list[tuple[Any, Work]]], None]) -> None:
        self._p2p_runner = runner

    # ------------------------------------------------------------------ collectives

    def run(self, job: Job) -> Any:
        """Run `job` in this thread after everything issued before it."""
        st = self.state
        if st.deferred:
            self.flush_p2p()
        me = threading.get_ident()
        entered = False
        # The try starts before the state is set: a KeyboardInterrupt can land between any
        # two calls (releasing the lock is one), and must not leave the engine marked busy
        # for ever (destroy_process_group would then wait its full timeout).
        try:
            with self._lock:
                while st.queue or st.running:
                    self._wait()
                if st.stopped:
                    raise UsageError("the process group was destroyed")
                st.owner = me
                st.running = entered = True
            return job()
        finally:
            if entered:
                with self._lock:
                    st.running = False
                    st.owner = None
                    if st.queue or self._waiters:
                        self._cv.notify_all()

    def end_job(self) -> None:
        """The end of a job this thread took over from a group's compiled path (core/group.py
        `fast`): the finally of `run`. The compiled path runs a call holding `_lock` (taken
        without blocking, when nothing is queued, deferred or running), so no other thread
        starts one meanwhile; a call that needs Python it hands over as a job of `run`'s
        (`state.running` set, `state.owner` this thread, the lock released) and its end comes
        here."""
        with self._lock:
            self.state.running = False
            self.state.owner = None
            if self.state.queue or self._waiters:
                self._cv.notify_all()

    def _wait(self, timeout: float | None = None) -> bool:
        """cv.wait, counted in _waiters (the lock is held)."""
        self._waiters += 1
        try:
            return self._cv.wait(timeout)
        finally:
            self._waiters -= 1

    def _wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """cv.wait_for, counted in _waiters (the lock is held)."""
        self._waiters += 1
        try:
            return self._cv.wait_for(predicate, timeout)
        finally:
            self._waiters -= 1

    def submit(self, job: Job, work: Work) -> Work:
        """Run `job` on the worker thread after everything issued before it (or on the
        thread that waits for `work`, if that thread gets there first: see run_here)."""
        self.flush_p2p()
        work._run_here = self.run_here
        self._enqueue(job, work)
        return work

    def run_here(self, work: Work) -> None:
        """Called by a thread about to wait for `work`: when `work` is next in line and
        nothing is running, run it in this thread rather than wake the worker and sleep
        until it is done (a synchronous call through the torch backend is issued async,
        then waited for at once: this saves it two thread switches)."""
        me = threading.get_ident()
        entered = False
        try:
            with self._lock:
                if self.state.running or self.state.stopped or not self.state.queue:
                    return
                job, head = self.state.queue[0]
                if head is not work:
                    return
                self.state.running = entered = True
                self.state.owner = me
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                work._fail(exc)
            else:
                work._complete()
        finally:
            if entered:
                with self._lock:
                    self.state.queue.popleft()
                    self.state.running = False
                    self.state.owner = None
                    self._cv.notify_all()

    def _enqueue(self, job: Job, work: Work) -> None:
        with self._lock:
            if self.state.stopped:
                raise UsageError("the process group was destroyed")
            self.state.queue.append((job, work))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._worker, name="pycollective-engine", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._lock:
                while not self.state.stopped and (not self.state.queue or self.state.running):
                    self._cv.wait()
                if self.state.stopped and not self.state.queue:
                    return
                job, work = self.state.queue[0]
                self.state.running = True
                self.state.owner = threading.get_ident()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                work._fail(exc)
            else:
                work._complete()
            finally:
                with self._lock:
                    self.state.queue.popleft()
                    self.state.running = False
                    self.state.owner = None
                    if self._waiters:  # the worker itself looks at the queue again
                        self._cv.notify_all()

    # ------------------------------------------------------------------ point-to-point

    def has_deferred_p2p(self) -> bool:
        return bool(self.state.deferred)

    def defer_p2p(self, op: Any, work: Work) -> Work:
        with self._lock:
            self.state.deferred.append((op, work))
        work._on_demand = self.flush_p2p
        return work

    def flush_p2p(self) -> None:
        """Start the deferred point-to-point batch (on the worker thread)."""
        if not self.state.deferred:  # the common case, without taking the lock
            return
        with self._lock:
            deferred = self.state.deferred  # the same list for ever: the compiled path holds it
            batch = deferred[:]
            deferred.clear()
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
        with self._lock:
            while self.state.queue or self.state.running:
                self._wait()

    def stop(self, timeout: float = 5.0, grace: float = 0.5) -> None:
        """Refuse new work; give what was issued `grace` seconds to finish, then interrupt
        the transport so everything still waiting fails at once (each Work with the
        error), and wait (at most `timeout`) for that. Never waits on the calling thread's
        own job (destroy called from a callback or a signal handler)."""
        me = threading.get_ident()
        with self._lock:
            self.state.stopped = True
            self._cv.notify_all()

            def drained() -> bool:
                return (not self.state.queue and not self.state.running) or self.state.owner == me

            if not self._wait_for(drained, grace) and self._interrupt is not None:
                self._interrupt("the process group was destroyed while this was in progress")
            self._wait_for(drained, timeout)
            leftover = [work for _, work in self.state.queue if self.state.owner != me]
        thread = self._thread
        if thread is not None and thread.ident != me:
            thread.join(max(0.1, timeout))
        for work in leftover:  # only if a job outlived the timeout: never leave a waiter hanging
            if not work._future.done():
                work._fail(UsageError("the process group was destroyed before this completed"))
