"""torch.distributed Work handles backed by pycollective's asynchronous operations.

torch's own `_create_work_from_future` makes a Work whose wait() returns True even when the
future holds an error, so a failed collective would pass silently; this subclass of
torch's Work (a pybind trampoline, so C++ callers such as DDP's reducer see it too) waits
on our operation, re-raises its error, and hands out a torch Future for `then()` chains.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as tdist

import torch

from ..core.work import Future as _OurFuture
from ..core.work import Work as _OurWork


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    return None if seconds <= 0 else seconds  # torch's kNoTimeout is 0 ms


class TorchWork(tdist.Work):
    """Completes when every pycollective operation in `works` has; its value is `result`.

    `finish` (optional) runs once, after all of them succeed and before the future
    completes: copies out of scratch buffers for list-shaped collectives.
    """

    def __init__(
        self,
        works: list[_OurWork],
        result: Any,
        finish: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._works = works
        self._result = result
        self._finish = finish
        self._future: torch.futures.Future = torch.futures.Future()
        self._exc: BaseException | None = None
        self._source = -1
        self._pending = len(works)
        self._lock = threading.Lock()
        self._settled = False
        if not works:
            self._complete(None)
            return
        for w in works:
            w.get_future().add_done_callback(self._one_done)

    # Runs on pycollective's engine thread, in issue order.
    def _one_done(self, fut: _OurFuture) -> None:
        exc = fut._exc
        with self._lock:
            self._pending -= 1
            if self._settled or (exc is None and self._pending > 0):
                return
            self._settled = True
        self._complete(exc)

    def _complete(self, exc: BaseException | None) -> None:
        if exc is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                exc = err
        if self._works:
            self._source = self._works[-1].src_rank
        if exc is None:
            self._future.set_result(self._result)
        else:
            self._exc = exc
            self._future.set_exception(exc)

    def wait(self, timeout: Any = None) -> bool:
        seconds = _seconds(timeout)
        for w in self._works:
            w.wait(seconds)  # raises the operation's own error (CollectiveError)
        self._future.wait()  # also raises an error from `finish`
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        for w in self._works:
            w._kick()  # deferred point-to-point starts when someone asks for its future
        return self._future

    def source_rank(self) -> int:
        self.wait()
        return self._source

    _source_rank = source_rank

    def synchronize(self) -> None:  # CPU only: nothing to order against a device stream
        pass


def completed(result: Any) -> TorchWork:
    """A Work that is already done (e.g. an empty list of tensors)."""
    return TorchWork([], result)
