"""Running one function per rank (or per worker) in threads of this process, as tests of
in-process transports and stores do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_in_threads(fn: Callable[[int], T], n: int, timeout: float) -> list[T]:
    """fn(i) for i in range(n), each in a thread of its own, started together; their
    results in order. Fails (naming every error) if any raised, or if any has not returned
    within `timeout` seconds of the start."""
    results: list = [None] * n
    errors: list[tuple[int, BaseException]] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not errors, f"raised: {errors}"
    assert not stuck, f"threads {stuck} still running after {timeout} s"
    return results
