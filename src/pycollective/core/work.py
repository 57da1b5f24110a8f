"""Work handles and futures returned by asynchronous operations (async_op=True)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

from .._errors import CollectiveTimeout


def _seconds(timeout: float | datetime.timedelta | None) -> float | None:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return timeout


class Future:
    """A value that becomes available later; the subset of torch.futures.Future we need."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._event.wait(timeout):
            raise CollectiveTimeout(f"future not completed within {timeout} s")
        if self._exc is not None:
            raise self._exc
        return self._value

    def value(self) -> Any:
        return self.wait()

    def set_result(self, value: Any) -> None:
        self._finish(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, value: Any, exc: BaseException | None) -> None:
        with self._lock:
            self._value, self._exc = value, exc
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future holding callback(self)'s return value (or its exception)."""
        chained = Future()

        def run(fut: Future) -> None:
            try:
                chained.set_result(callback(fut))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                chained.set_exception(exc)

        self.add_done_callback(run)
        return chained


class Work:
    """The handle of an operation in flight, like torch.distributed's Work."""

    def __init__(self, label: str, result: Any = None, on_demand: Callable[[], None] | None = None):
        self.label = label
        self._future = Future()
        self._result = result
        self._on_demand = on_demand  # starts deferred work (batched point-to-point)
        self._run_here: Callable[[Work], None] | None = None  # set by Engine.submit
        self.src_rank = -1  # set by receives

    # -- completion, called by the engine
    def _complete(self) -> None:
        self._future.set_result(self._result)

    def _fail(self, exc: BaseException) -> None:
        self._future.set_exception(exc)

    def _kick(self) -> None:
        if self._on_demand is not None:
            on_demand, self._on_demand = self._on_demand, None
            on_demand()

    # -- the public interface
    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until done; re-raise the operation's error. Returns True, like torch."""
        self._kick()
        seconds = _seconds(timeout)
        if seconds is None and self._run_here is not None and not self._future.done():
            self._run_here(self)  # no bound to keep: run it here if it has not started
        if not self._future._event.wait(seconds):
            raise CollectiveTimeout(
                f"{self.label} did not complete within {seconds} s", op=self.label
            )
        if self._future._exc is not None:
            raise self._future._exc
        return True

    def is_completed(self) -> bool:
        self._kick()
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future._exc is None

    def exception(self) -> BaseException | None:
        return self._future._exc if self._future.done() else None

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> Future:
        self._kick()
        return self._future

    def _source_rank(self) -> int:
        """For a receive: the global rank the message came from (torch's private name)."""
        self.wait()
        return self.src_rank

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<Work {self.label} {state}>"
