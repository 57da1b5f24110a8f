"""A group's rendezvous store over Ray's internal key-value store (the GCS), so that a
ray.util.collective group needs no MASTER_ADDR: every actor of a Ray job reaches the GCS.

The GCS has no way to wait for a key, so `get` polls it (2 ms doubling to 50 ms), which
only the rendezvous does, a few keys per rank. Keys live in the "pycollective" namespace
under the group's prefix; `clear` removes them once every rank has read what it needs.
"""

from __future__ import annotations

import time
from typing import Any

from ray.experimental import internal_kv

from .. import _ray_job
from .._errors import StoreError
from ..store._base import encode_value, timeout_error

_POLL_FIRST = 0.002
_POLL_MAX = 0.05


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, namespace=_ray_job.NAMESPACE, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the GCS's errors are Ray's own classes
        raise StoreError(f"Ray's key-value store (GCS): {what} failed: {exc}") from exc


class RayKVStore:
    """set(key, bytes) / get(key, timeout) over Ray's internal KV, under `prefix`."""

    def __init__(self, prefix: str, timeout: float) -> None:
        self._prefix = prefix.rstrip("/") + "/"
        self._timeout = timeout

    @property
    def prefix(self) -> str:
        return self._prefix

    def set(self, key: str, value: bytes) -> None:
        _call(f"set {key!r}", internal_kv._internal_kv_put, self._prefix + key,
              encode_value(value), True)  # fmt: skip

    def get(self, key: str, timeout: float | None = None) -> bytes:
        seconds = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + seconds
        delay = _POLL_FIRST
        while True:
            value = _call(f"get {key!r}", internal_kv._internal_kv_get, self._prefix + key)
            if value is not None:
                return bytes(value)
            left = deadline - time.monotonic()
            if left <= 0:
                raise timeout_error([key], seconds, f"Ray's key-value store under {self._prefix!r}")
            time.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    def delete(self, key: str) -> None:
        _call(f"delete {key!r}", internal_kv._internal_kv_del, self._prefix + key)

    def clear(self) -> None:
        """Remove every key under the prefix."""
        _call(f"delete {self._prefix!r}*", internal_kv._internal_kv_del, self._prefix,
              del_by_prefix=True)  # fmt: skip

    def close(self) -> None:
        """Nothing to close: the GCS connection is Ray's."""
