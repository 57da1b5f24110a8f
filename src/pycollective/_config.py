"""Configuration read from the environment (PYCOLLECTIVE_* variables) and small process-wide
notes (which one-time warnings were given)."""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

from ._errors import UsageError

DEFAULT_TIMEOUT = 300.0  # seconds; torch's 30 minutes is too long to wait on a hang

# Keys of the one-time warnings this process has given (a documented registry).
_SAID: set[str] = set()
_SAID_LOCK = threading.Lock()


def first_time(key: str) -> bool:
    """True the first time it is asked about `key` in this process (warn-once helper)."""
    with _SAID_LOCK:
        if key in _SAID:
            return False
        _SAID.add(key)
        return True


def timeout_seconds(timeout: Any) -> float:
    if timeout is None:
        env = os.environ.get("PYCOLLECTIVE_TIMEOUT")
        return float(env) if env else DEFAULT_TIMEOUT
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise UsageError(
            f"timeout must be a positive number of seconds or a timedelta, got {timeout!r}"
        )
    return float(timeout)
