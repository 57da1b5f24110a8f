"""torch.distributed Work handles backed by pycollective's asynchronous operations.

torch's own `_create_work_from_future` makes a Work whose wait() returns True even when the
future holds an error, so a failed collective would pass silently; this subclass of
torch's Work (a pybind trampoline, so C++ callers such as DDP's reducer see it too) waits
on our operation, re-raises its error, and hands out a torch Future for `then()` chains.

Two things about that trampoline shape the code below.

**Where torch futures complete.** A torch future runs its `then()` callbacks on the thread
that completes it. Completing them on our engine thread deadlocks any callback that issues
another collective and waits for it (PowerSGD's hook does exactly that): the engine is
busy running the callback. So the engine only marks our operations done, and torch futures
complete on completion threads, one per *level*: a work issued by ordinary code completes
on the level-1 thread; a work issued from a callback running on level k completes on level
k+1, which is never the thread waiting for it. Each level delivers in issue order, as
DDP's buckets expect, and a `wait()` (or `is_completed()`) that finds the operations done
delivers the result itself rather than queue behind a long callback.

**How long the Python object lives.** torch keeps only the C++ half of a Python Work: code
that hands a Work to C++ and drops it (DDP's Join hook gives the reducer the work of its
forward-pass all-reduce, then lets it go) leaves C++ holding an object whose overrides
vanished with the Python half, so getFuture() raises "not implemented" and wait() never
returns. Every TorchWork is therefore kept alive here until it is done and nothing but
this registry refers to it, from Python or from C++ (the C++ reference count, read from
the object; checked against torch's own boxing when this module loads).
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch.distributed as tdist

import torch

from .._errors import CollectiveError, CollectiveTimeout
from ..core.work import Future as _OurFuture
from ..core.work import Work as _OurWork


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    return None if seconds <= 0 else seconds  # torch's kNoTimeout is 0 ms, unset is -1 ms


# ---------------------------------------------------------------------- errors

_flavours: dict[type, type] = {}


def torch_error(exc: BaseException) -> BaseException:
    """Our error as torch's callers expect it: an instance of both its pycollective class
    and torch's DistBackendError (a RuntimeError, what gloo raises), so `except
    RuntimeError` and `except pycollective.CollectiveTimeout` both catch it. A timeout's
    message carries gloo's words ("Timed out"), which torch's own tests match."""
    if not isinstance(exc, CollectiveError) or isinstance(exc, tdist.DistBackendError):
        return exc
    message = str(exc)
    if isinstance(exc, CollectiveTimeout):
        message = f"pycollective: Timed out in {exc.op or 'a collective'}: {message}"
    new = _rebuild_torch_error(type(exc), (message,), exc.__dict__)
    new.__cause__ = exc
    new.__traceback__ = exc.__traceback__
    return new


def _flavour(cls: type) -> type:
    flavour = _flavours.get(cls)
    if flavour is None:
        # pickled by value (its name is the pycollective class's: pickle by reference
        # would find that class, not this one), so that an error sent to another process
        # (multiprocessing, torch's spawn harness) arrives as both classes again
        flavour = type(cls.__name__, (cls, tdist.DistBackendError), {"__reduce__": _reduce})
        flavour.__module__ = cls.__module__
        flavour.__qualname__ = cls.__qualname__
        _flavours[cls] = flavour
    return flavour


def _reduce(self: BaseException) -> tuple:
    base = next(c for c in type(self).__mro__[1:] if c in _flavours)
    return _rebuild_torch_error, (base, self.args, dict(self.__dict__))


def _rebuild_torch_error(cls: type, args: tuple, state: dict) -> BaseException:
    """An instance of cls's torch flavour with these args and attributes (no __init__:
    the pycollective classes' own signatures differ)."""
    flavour = _flavour(cls)
    new = flavour.__new__(flavour)
    new.__dict__.update(state)
    new.args = args
    return new


# ---------------------------------------------------------------------- completion levels

_MAX_LEVEL = 16  # deeper nesting of callbacks than this completes inline (never seen)
# How long shutdown() and interpreter exit wait for deliveries already posted (their
# callbacks run user code: a bound, not a promise).
DRAIN_SECONDS = 30.0
_tls = threading.local()


class _Level:
    """One completion thread: runs deliveries in the order they were posted."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._cv = threading.Condition()
        self._queue: deque[Callable[[], None]] = deque()
        self._posted = 0
        self._done = 0
        self._stopped = False
        self._thread = threading.Thread(
            target=self._loop, name=f"pycollective-torch-complete-{level}", daemon=True
        )
        self._thread.start()

    def post(self, job: Callable[[], None]) -> bool:
        """Queue a delivery; False once the level has stopped (the caller runs it)."""
        with self._cv:
            if self._stopped:
                return False
            self._queue.append(job)
            self._posted += 1
            self._cv.notify_all()
        return True

    def drain(self, deadline: float, stop: bool = False) -> bool:
        """Wait until every delivery posted so far has run (False at the deadline);
        `stop`: let the thread end and refuse later posts."""
        with self._cv:
            if stop:
                self._stopped = True
                self._cv.notify_all()
            target = self._posted
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _loop(self) -> None:
        _tls.level = self.level
        while True:
            with self._cv:
                while not self._queue:
                    if self._stopped:
                        return
                    self._cv.wait()
                job = self._queue.popleft()
            job()  # never raises: a delivery hands its errors to the future
            job = None  # nor keeps its work alive until the next one
            with self._cv:
                self._done += 1
                self._cv.notify_all()


_levels: dict[int, _Level] = {}
_levels_lock = threading.Lock()


def _level_for_new_work() -> int:
    return getattr(_tls, "level", 0) + 1


def _post(level: int, job: Callable[[], None]) -> None:
    if level > _MAX_LEVEL:
        job()
        return
    lv = _levels.get(level)
    if lv is None:
        with _levels_lock:
            lv = _levels.get(level)
            if lv is None:
                lv = _levels[level] = _Level(level)
    if not lv.post(job):
        job()  # after interpreter exit began: deliver here


def drain(seconds: float = DRAIN_SECONDS, stop: bool = False) -> bool:
    """Wait until the deliveries posted so far (their torch callbacks included) have run,
    at most `seconds`; False if some had not. The calling thread's own level is skipped
    (a callback that destroys a group cannot wait for itself).

    A completion thread still inside torch when the interpreter finalizes is torn down
    mid-call (Python ends a daemon thread that wants the GIL back with pthread_exit, whose
    unwinding through torch's C++ frames aborts the process: "terminate called without an
    active exception"). So shutdown() drains, and interpreter exit drains and stops."""
    deadline = time.monotonic() + seconds
    mine = getattr(_tls, "level", 0)
    with _levels_lock:
        levels = [lv for lv in _levels.values() if lv.level != mine]
    ok = all([lv.drain(deadline, stop) for lv in levels])
    if not ok:
        print(
            f"pycollective: torch completion callbacks still running after {seconds:g} s",
            file=sys.stderr,
            flush=True,
        )
    return ok


atexit.register(drain, stop=True)  # runs before Python tears daemon threads down


# ---------------------------------------------------------------------- lifetime registry

# pybind11's instance layout: PyObject_HEAD, then the pointer to the C++ object; c10's
# intrusive_ptr_target: the vtable pointer, then a 64-bit count whose low 32 bits are the
# strong references.
_VALUE_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)
_COUNT_OFFSET = ctypes.sizeof(ctypes.c_void_p)


def _cpp_refs(work: tdist.Work) -> int:
    ptr = ctypes.c_void_p.from_address(id(work) + _VALUE_OFFSET).value
    return ctypes.c_uint32.from_address(ptr + _COUNT_OFFSET).value if ptr else -1


def _cpp_count_address(work: tdist.Work) -> int:
    """Where the C++ reference count of `work` lives (fixed for the object's life)."""
    ptr = ctypes.c_void_p.from_address(id(work) + _VALUE_OFFSET).value
    if not ptr:
        raise RuntimeError("a torch Work without its C++ object")
    return ptr + _COUNT_OFFSET


def _refcount_readable() -> bool:
    """Whether _cpp_refs reads what it should on this torch build: one reference for a
    fresh Work, two while torch's boxing holds another."""
    try:
        probe = tdist.Work()
        if _cpp_refs(probe) != 1:
            return False
        boxed = probe.boxed()
        two = _cpp_refs(probe)
        del boxed
        return two == 2 and _cpp_refs(probe) == 1
    except Exception:  # noqa: BLE001 - any surprise means "cannot read it"
        return False


_REFS_READABLE = _refcount_readable()
# Without a readable count, keep the most recent finished works only (best effort).
_FALLBACK_KEEP = 65536
_alive: dict[int, TorchWork | DoneWork] = {}
_alive_lock = threading.Lock()
_sweep_at = 256


def _keep(work: TorchWork | DoneWork) -> None:
    global _sweep_at
    with _alive_lock:
        _alive[id(work)] = work
        if len(_alive) < _sweep_at:
            return
        _sweep()
        _sweep_at = max(256, 2 * len(_alive))


def _sweep() -> None:
    """Drop the works nobody can reach any more (the caller holds _alive_lock)."""
    if not _REFS_READABLE:
        while len(_alive) > _FALLBACK_KEEP:
            _alive.pop(next(iter(_alive)))
        return
    for key in list(_alive):
        w = _alive[key]
        # getrefcount sees the registry, `w` and its own argument: nothing else in Python
        if w._delivered and sys.getrefcount(w) <= 3 and _cpp_refs(w) <= 1:
            del _alive[key]
    w = None


def alive_count() -> int:
    """How many works the registry holds (for tests)."""
    with _alive_lock:
        _sweep()
        return len(_alive)


# ---------------------------------------------------------------------- the Work


class TorchWork(tdist.Work):
    """Completes when every pycollective operation in `works` has; its value is `result`.

    `finish` (optional) runs once, after all of them succeed and before the future
    completes: copies out of scratch buffers for list-shaped collectives. `timeout` (from
    the call's options) bounds wait() when the caller gives none.
    """

    def __init__(
        self,
        works: list[_OurWork],
        result: Any,
        finish: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self._works = works
        self._result = result
        self._finish = finish
        self._timeout = timeout
        self._future: torch.futures.Future = torch.futures.Future()
        self._exc: BaseException | None = None
        self._source = -1
        self._pending = len(works)
        self._lock = threading.Lock()
        self._settled = False  # every operation done, or one failed
        self._delivered = False  # claimed by a deliverer
        self._level = _level_for_new_work()
        self._profiled = False  # a profiler event ends on completion: leave it to its thread
        self._waiters = 0  # threads inside wait(), which deliver on their way out
        self._event: Any = None
        _keep(self)
        if not works:
            self._settled = True
            self._deliver()
            return
        for w in works:
            # Not get_future(): that starts a deferred point-to-point batch, and an irecv's
            # batch must stay open for the isend issued after it (batch_isend_irecv).
            w._future.add_done_callback(self._one_done)

    # Runs on pycollective's engine thread: record, and hand the delivery to a level.
    def _one_done(self, fut: _OurFuture) -> None:
        exc = fut._exc
        with self._lock:
            self._pending -= 1
            if self._settled or (exc is None and self._pending > 0):
                return
            self._settled = True
            self._exc = exc
            if self._waiters and not self._profiled:
                return  # a thread in wait() delivers it on its way out
        _post(self._level, self._deliver)

    def _deliver(self) -> None:
        """Copy back, then complete the torch future (running its callbacks here)."""
        with self._lock:
            if self._delivered or not self._settled:
                return
            self._delivered = True
            exc = self._exc
            event, self._event = self._event, None
        if event is not None:
            event.__exit__(None, None, None)  # the profiler's record of this call ends
        if exc is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                exc = self._exc = err
        if self._works:
            self._source = self._works[-1].src_rank
        try:
            if exc is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(torch_error(exc))
        except BaseException:  # noqa: BLE001, S110 - a callback's error belongs to its own future
            pass

    def _end_event_on_delivery(self, event: Any) -> None:
        """End a profiler event when the work completes (at once if it has)."""
        with self._lock:
            if not self._delivered:
                self._profiled = True
                self._event = event
                return
        event.__exit__(None, None, None)

    def wait(self, timeout: Any = None) -> bool:
        seconds = _seconds(timeout)
        if seconds is None:
            seconds = self._timeout
        with self._lock:
            self._waiters += 1
        try:
            for w in self._works:
                w.wait(seconds)  # raises the operation's own error (CollectiveError)
        except BaseException as exc:
            self._leave_wait()
            raise torch_error(exc) from None
        self._leave_wait()
        self._future.wait()  # also raises an error from `finish`
        return True

    def _leave_wait(self) -> None:
        """A waiter delivers a settled work itself (never queue behind a completion thread
        busy with another callback); a profiled one is left to its thread (the profiler
        event must end there to be recorded as asynchronous)."""
        with self._lock:
            self._waiters -= 1
            mine = self._settled and not self._delivered and not self._profiled
        if mine:
            self._deliver()

    def is_completed(self) -> bool:
        if not self._future.done() and self._settled:
            self._deliver()
        return self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc if self.is_completed() else None

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


class DoneWork(tdist.Work):
    """A work done before it is returned (a synchronous call, or nothing to do): no
    operations to follow, no completion thread; its torch future is made when asked for.
    Kept alive like a TorchWork (Python code may still hand it to C++)."""

    def __init__(self, result: Any, keep: bool = True) -> None:
        super().__init__()
        self._result = result
        self._future: torch.futures.Future | None = None
        self._delivered = True  # for _sweep
        if keep:  # (a DoneSlot keeps its own until someone else holds it)
            _keep(self)

    def get_future(self) -> torch.futures.Future:
        with _alive_lock:
            if self._future is None:
                self._future = torch.futures.Future()
                self._future.set_result(self._result)
            return self._future

    def _end_event_on_delivery(self, event: Any) -> None:
        event.__exit__(None, None, None)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> Any:
        return self._result

    def source_rank(self) -> int:
        return -1

    _source_rank = source_rank

    def synchronize(self) -> None:
        pass


def completed(result: Any) -> DoneWork:
    """A Work that is already done (e.g. an empty list of tensors)."""
    return DoneWork(result)


# What issuing one operation leaves to do: our Works (None for a synchronous call), then
# an optional copy-back; the group's _work makes the torch Work of one or several.
Issued = tuple[list["_OurWork | None"], "Callable[[], None] | None"]


def join(parts: list[Issued]) -> Issued:
    """Several issued operations as one: every Work, then every copy-back in order."""
    works = [w for ws, _ in parts for w in ws]
    finishes = [f for _, f in parts if f is not None]
    if not finishes:
        return works, None

    def run() -> None:
        for f in finishes:
            f()

    return works, run


class DoneSlot:
    """The DoneWorks of one group's synchronous calls, one reused while nobody holds it.

    torch's `dist.all_reduce` waits on the work its group returns and drops it, so the
    same object can answer the next call: making a Work (a pybind trampoline, kept in the
    registry) costs more than a small call's collective. A work is reused only when
    nothing but this slot refers to it, from Python or from C++ (the C++ count, read as
    the registry reads it); otherwise it is left to its holders, kept alive like any other,
    and a fresh one takes its place."""

    def __init__(self) -> None:
        self._work: DoneWork | None = None
        self._refs: Any = None  # the C++ reference count of _work, readable in place

    def take(self, result: Any) -> DoneWork:
        w = self._work
        # getrefcount sees the slot, `w` and its own argument: nothing else in Python
        if w is not None and sys.getrefcount(w) <= 3 and self._refs.value <= 1:
            w._result = result
            w._future = None
            return w
        if w is not None:
            _keep(w)  # someone holds it: from now on the registry keeps it for them
        w = self._work = DoneWork(result, keep=False)
        if _REFS_READABLE:
            self._refs = ctypes.c_uint32.from_address(_cpp_count_address(w))
        else:
            self._work = None  # cannot tell who holds it: never reused
            _keep(w)
        return w

    def release(self) -> None:
        """Leave the slot's work to the registry (its group is going away)."""
        if self._work is not None:
            _keep(self._work)
        self._work = self._refs = None
