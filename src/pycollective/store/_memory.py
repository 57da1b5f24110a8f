"""The in-memory table behind TCPStoreServer, and HashStore, the same table used in-process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from .._errors import StoreError
from ._base import (
    Store,
    Timeout,
    add_to_counter,
    check_keys,
    compare_set_result,
    encode_key,
    encode_value,
    timeout_error,
)


class StoreClosed(Exception):
    """The table was closed while a caller waited on it."""


class KVTable:
    """A dict guarded by one Condition; every mutation wakes the waiters.

    Keys are bytes so that the server never has to decode what a peer sent. With
    `max_bytes`, the keys and values held stay within it: a set that would pass it raises
    StoreError (a peer cannot fill the server's memory).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._max_bytes = max_bytes
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held."""
        return self._bytes

    def _put(self, key: bytes, value: bytes) -> None:
        old = self._data.get(key)
        grow = len(value) - (len(old) if old is not None else -len(key))
        if self._max_bytes is not None and grow > 0 and self._bytes + grow > self._max_bytes:
            raise StoreError(
                f"the store holds {self._bytes} bytes; setting {len(value)} bytes under "
                f"{key[:64]!r} would pass its limit of {self._max_bytes} "
                "(PYCOLLECTIVE_STORE_MAX_BYTES)"
            )
        self._data[key] = value
        self._bytes += grow

    def _drop(self, key: bytes) -> bytes | None:
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= len(key) + len(old)
        return old

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def set(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self._put(key, value)
            self._cond.notify_all()

    def wait(
        self,
        keys: Sequence[bytes],
        timeout: float | None,
        abandoned: Callable[[], bool] | None = None,
        poll: float = 1.0,
    ) -> list[bytes]:
        """Wait until all `keys` exist; return the missing ones on timeout ([] on success).

        `abandoned` is asked every `poll` seconds, so a server thread whose client hung up
        stops waiting instead of sitting on a key nobody will read.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise StoreClosed
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return []
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return missing
                step = remaining
                if abandoned is not None:
                    step = poll if step is None else min(step, poll)
                if not self._cond.wait(step) and abandoned is not None and abandoned():
                    raise StoreClosed

    def get(
        self,
        key: bytes,
        timeout: float | None,
        abandoned: Callable[[], bool] | None = None,
    ) -> bytes | None:
        """The value of `key`, or None if it did not appear within `timeout`."""
        with self._cond:
            if self.wait([key], timeout, abandoned):
                return None
            return self._data[key]

    def add(self, key: bytes, amount: int) -> int:
        with self._cond:
            new = add_to_counter(self._data.get(key), key.decode("utf-8", "replace"), amount)
            self._put(key, str(new).encode("ascii"))
            self._cond.notify_all()
            return new

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        with self._cond:
            result, store = compare_set_result(self._data.get(key), expected, desired)
            if store:
                self._put(key, desired)
                self._cond.notify_all()
            return result

    def check(self, keys: Sequence[bytes]) -> bool:
        with self._cond:
            return all(k in self._data for k in keys)

    def delete(self, key: bytes) -> bool:
        with self._cond:
            return self._drop(key) is not None

    def delete_if(self, key: bytes, value: bytes) -> bool:
        """Delete `key` only if it still holds `value` (an expiring lease must not remove
        what was set after it)."""
        with self._cond:
            if self._data.get(key) != value:
                return False
            self._drop(key)
            self._cond.notify_all()
            return True

    def num_keys(self) -> int:
        with self._cond:
            return len(self._data)

    def clear(self) -> None:
        with self._cond:
            self._data.clear()
            self._bytes = 0
            self._cond.notify_all()


class HashStore(Store):
    """An in-process store (threads of one process), like torch's HashStore."""

    def __init__(self, timeout: Timeout = 300.0) -> None:
        super().__init__(timeout)
        self._table = KVTable()

    def set(self, key: str, value: bytes | str) -> None:
        self._table.set(encode_key(key), encode_value(value))

    def get(self, key: str, timeout: Timeout = None) -> bytes:
        seconds = self._resolve(timeout)
        try:
            value = self._table.get(encode_key(key), seconds)
        except StoreClosed:
            raise StoreError("the store was closed") from None
        if value is None:
            raise timeout_error([key], seconds, "the in-process store")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._table.add(encode_key(key), int(amount))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self._table.compare_set(
            encode_key(key), encode_value(expected), encode_value(desired)
        )

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        names = check_keys(keys)
        seconds = self._resolve(timeout)
        try:
            missing = self._table.wait([encode_key(k) for k in names], seconds)
        except StoreClosed:
            raise StoreError("the store was closed") from None
        if missing:
            gone = [m.decode() for m in missing]
            raise timeout_error(names, seconds, "the in-process store", gone)

    def check(self, keys: Sequence[str]) -> bool:
        return self._table.check([encode_key(k) for k in check_keys(keys)])

    def delete_key(self, key: str) -> bool:
        return self._table.delete(encode_key(key))

    def num_keys(self) -> int:
        return self._table.num_keys()

    def close(self) -> None:
        self._table.close()
