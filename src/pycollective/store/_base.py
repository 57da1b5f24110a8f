"""The Store interface shared by every rendezvous store, and its small helpers.

Modeled on torch.distributed.Store: keys are str, values are bytes (str is accepted and
UTF-8 encoded), counters made by `add` are stored as decimal ASCII so that `get` on them
reads like torch's. Timeouts are seconds (float) or `datetime.timedelta`; `None` on a call
means "the store's default", `None` at construction means "wait forever".
"""

from __future__ import annotations

import abc
import datetime
import math
from collections.abc import Iterable, Sequence

from .._errors import StoreError, UsageError

Timeout = float | int | datetime.timedelta | None

# Bounds on what a peer may make us allocate; checked before allocation (docs/security.md,
# "What peers send").
MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 64 * 1024 * 1024


def to_seconds(timeout: Timeout) -> float | None:
    """Normalize a timeout to seconds; None stays None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise UsageError(f"timeout must be seconds or a timedelta, got {timeout!r}")
    if math.isnan(seconds) or seconds < 0:
        raise UsageError(f"timeout must be >= 0, got {timeout!r}")
    return None if math.isinf(seconds) else seconds


def encode_key(key: str) -> bytes:
    if not isinstance(key, str):
        raise UsageError(f"store keys are str, got {type(key).__name__}")
    raw = key.encode("utf-8")
    if len(raw) > MAX_KEY_BYTES:
        raise UsageError(f"store key is {len(raw)} bytes; the limit is {MAX_KEY_BYTES}")
    return raw


def encode_value(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        raw = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        raise UsageError(f"store values are bytes or str, got {type(value).__name__}")
    if len(raw) > MAX_VALUE_BYTES:
        raise UsageError(f"store value is {len(raw)} bytes; the limit is {MAX_VALUE_BYTES}")
    return raw


def check_keys(keys: Iterable[str]) -> list[str]:
    if isinstance(keys, str):
        # A bare string would otherwise be waited on character by character.
        raise UsageError("keys must be a list of str, not a str")
    out = list(keys)
    for k in out:
        encode_key(k)
    return out


def _show(keys: Sequence[str]) -> str:
    return "[" + ", ".join(repr(k) for k in keys[:8]) + (", ...]" if len(keys) > 8 else "]")


def timeout_error(
    keys: Sequence[str], seconds: float | None, where: str, missing: Sequence[str] = ()
) -> StoreError:
    limit = "forever" if seconds is None else f"{seconds:g} s"
    msg = f"timed out after {limit} waiting for key(s) {_show(keys)} in {where}"
    if missing and list(missing) != list(keys):
        msg += f" (still missing: {_show(missing)})"
    return StoreError(msg)


def add_to_counter(current: bytes | None, key: str, amount: int) -> int:
    """The arithmetic of `add`, shared by every store so they agree on errors."""
    if current is None:
        return amount
    try:
        return int(current.decode("ascii")) + amount
    except (UnicodeDecodeError, ValueError):
        raise StoreError(
            f"add on key {key!r}: its value {current[:32]!r} is not an integer"
        ) from None


def compare_set_result(
    current: bytes | None, expected: bytes, desired: bytes
) -> tuple[bytes, bool]:
    """torch's compare_set rule: returns (value to report, whether to store `desired`)."""
    if current is None:
        # A missing key matches only an empty expected value, as in torch.
        return (desired, True) if expected == b"" else (expected, False)
    if current == expected:
        return desired, True
    return current, False


class Store(abc.ABC):
    """A key-value store that ranks use to find each other.

    Every blocking call ends within its timeout by raising StoreError; a store whose
    server or file went away raises StoreError too, never hangs.
    """

    def __init__(self, timeout: Timeout = 300.0) -> None:
        self._timeout = to_seconds(timeout)

    @property
    def timeout(self) -> float | None:
        """Default timeout in seconds for `get` and `wait` (None: no limit)."""
        return self._timeout

    def set_timeout(self, timeout: Timeout) -> None:
        self._timeout = to_seconds(timeout)

    def _resolve(self, timeout: Timeout) -> float | None:
        return self._timeout if timeout is None else to_seconds(timeout)

    @abc.abstractmethod
    def set(self, key: str, value: bytes | str) -> None:
        """Store `value` under `key`, replacing any previous value, and wake its waiters."""

    @abc.abstractmethod
    def get(self, key: str, timeout: Timeout = None) -> bytes:
        """The value of `key`, waiting until some rank sets it."""

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add `amount` to the integer at `key` (0 if missing); return the new value."""

    @abc.abstractmethod
    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set `key` to `desired` if it holds `expected` (or is missing and `expected` is empty).

        Returns the value the key holds afterwards, or `expected` when the key is missing
        and `expected` is not empty (torch's behaviour).
        """

    @abc.abstractmethod
    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        """Block until every key in `keys` exists."""

    @abc.abstractmethod
    def check(self, keys: Sequence[str]) -> bool:
        """True if every key in `keys` exists, without waiting."""

    @abc.abstractmethod
    def delete_key(self, key: str) -> bool:
        """Remove `key`; True if it existed."""

    @abc.abstractmethod
    def num_keys(self) -> int:
        """How many keys the store holds."""

    def close(self) -> None:  # noqa: B027 - stores without resources need no close
        """Release sockets, files and any server this store hosts. Idempotent."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
