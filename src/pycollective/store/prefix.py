"""PrefixStore: a namespace inside another store, so groups and subsystems do not collide."""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import UsageError
from ._base import Store, Timeout, check_keys


class PrefixStore(Store):
    """Every key `k` becomes `prefix + "/" + k` in the wrapped store.

    The timeout is the wrapped store's; `num_keys` counts the whole wrapped store, as in
    torch. `close` leaves the wrapped store open: it is usually shared.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(store, Store):
            raise UsageError(f"PrefixStore wraps a Store, got {type(store).__name__}")
        super().__init__(store.timeout)
        self._prefix = prefix
        self._store = store

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def underlying_store(self) -> Store:
        return self._store

    @property
    def timeout(self) -> float | None:
        return self._store.timeout

    def set_timeout(self, timeout: Timeout) -> None:
        self._store.set_timeout(timeout)

    def _key(self, key: str) -> str:
        if not isinstance(key, str):
            raise UsageError(f"store keys are str, got {type(key).__name__}")
        return f"{self._prefix}/{key}"

    def set(self, key: str, value: bytes | str) -> None:
        self._store.set(self._key(key), value)

    def get(self, key: str, timeout: Timeout = None) -> bytes:
        return self._store.get(self._key(key), timeout)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(self._key(key), amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self._store.compare_set(self._key(key), expected, desired)

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        self._store.wait([self._key(k) for k in check_keys(keys)], timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self._store.check([self._key(k) for k in check_keys(keys)])

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._key(key))

    def num_keys(self) -> int:
        return self._store.num_keys()

    def __repr__(self) -> str:
        return f"PrefixStore({self._prefix!r}, {self._store!r})"
