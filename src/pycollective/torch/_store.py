"""torch programs started by `pycollective run`: rendezvous through the launcher's store.

The launcher hosts pycollective's (authenticated) store at MASTER_ADDR:MASTER_PORT, so
torch's env:// rendezvous, whose rank 0 would start a torch TCPStore on that same port,
fails with EADDRINUSE. Under the launcher (PYCOLLECTIVE_STORE_HOSTED=1) we answer env://
ourselves with a torch Store that forwards to the launcher's store, so an unmodified torch
script runs under `pycollective run` on any backend, gloo included. Other launchers
(torchrun, plain environment variables) keep torch's own handler.
"""

from __future__ import annotations

import datetime
import importlib
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as tdist

from .. import _launch_env
from .. import store as _store
from .._errors import StoreError, UsageError

# The module, not the function torch.distributed re-exports under the same name.
_rdzv = importlib.import_module("torch.distributed.rendezvous")


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return timeout


class TorchStore(tdist.Store):
    """A torch.distributed.Store backed by a pycollective store (thread-safe).

    torch's callers expect RuntimeError-family errors on timeouts; StoreError already
    derives from our CollectiveError, so it is re-raised as torch's DistStoreError.
    """

    def __init__(self, inner: Any, timeout: datetime.timedelta) -> None:
        super().__init__()
        self._inner = inner
        self._lock = threading.Lock()
        self._timeout = timeout

    def _call(self, name: str, *args: Any) -> Any:
        try:
            with self._lock:
                return getattr(self._inner, name)(*args)
        except StoreError as exc:
            raise tdist.DistStoreError(str(exc)) from exc

    def set(self, key: str, value: Any) -> None:
        self._call("set", key, bytes(value) if not isinstance(value, str) else value)

    def get(self, key: str) -> bytes:
        return self._call("get", key, self._timeout.total_seconds())

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, int(amount)))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, expected, desired)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        seconds = _seconds(timeout) if timeout is not None else self._timeout.total_seconds()
        self._call("wait", list(keys), seconds)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key))

    def num_keys(self) -> int:
        return int(self._call("num_keys"))

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout


# torch's C++ side keeps only the C++ half of a Python Store subclass: once the Python
# object is collected, its overrides vanish ("Not implemented"). Keep ours alive.
_alive: list[TorchStore] = []


def launcher_store(timeout: datetime.timedelta) -> TorchStore:
    """A torch Store on the store `pycollective run` hosts for this job."""
    addr = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    client = _store.TCPStore(addr, port, None, timeout.total_seconds())  # the job's key
    store = TorchStore(client, timeout)
    _alive.append(store)
    return store


def _under_launcher() -> bool:
    env = os.environ
    return (
        env.get("PYCOLLECTIVE_STORE_HOSTED") == "1"
        and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    )


def _env_handler(torch_handler: Any):
    def handler(
        url: str, timeout: datetime.timedelta = _rdzv.default_pg_timeout, **kwargs: Any
    ) -> Iterator[tuple[tdist.Store, int, int]]:
        if not _under_launcher():
            yield from torch_handler(url, timeout=timeout, **kwargs)
            return
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank = int(query.get("rank", os.environ["RANK"]))
        world_size = int(query.get("world_size", os.environ["WORLD_SIZE"]))
        yield launcher_store(timeout), rank, world_size
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")

    handler._pycollective = True  # type: ignore[attr-defined]
    return handler


def install_env_rendezvous() -> None:
    """Make env:// use the launcher's store under `pycollective run` (idempotent)."""
    handlers = _rdzv._rendezvous_handlers
    current = handlers.get("env")
    if current is None or getattr(current, "_pycollective", False):
        return
    handlers["env"] = _env_handler(current)


def meeting_place(store: Any) -> tuple[str | None, bool]:
    """Where the job meets and whether it spans hosts. The meeting place is the host of
    torch's TCPStore under `store` (what env:// and tcp:// connect to: a tcp:// job sets
    no MASTER_ADDR, as Ray Train's init_method="tcp" does not), else MASTER_ADDR; whether it
    spans hosts is the launcher's word (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, ...). A
    single-host job listens on loopback only, a multi-host one on the interface that routes
    to the meeting place (_netutil.listen_address)."""
    try:
        env = _launch_env.detect()
    except UsageError:
        env = None
    host = _tcpstore_host(store)
    if host is None and env is not None:
        host = env.master_addr
    return host, env is not None and env.multi_node


def _tcpstore_host(store: Any) -> str | None:
    """The host of the TCPStore inside torch's PrefixStores, if there is one."""
    for _ in range(16):
        if isinstance(store, tdist.TCPStore):
            return store.host
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None
