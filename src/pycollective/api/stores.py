"""Stores with torch.distributed's constructor signatures, for drop-in code such as
`dist.TCPStore("127.0.0.1", port, world_size, rank == 0)`. The library's own classes in
pycollective.store take the shared secret explicitly; these read it from the environment."""

from __future__ import annotations

import datetime
from typing import Any

from .. import store as _store
from ..store import HashStore, PrefixStore, Store


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return None if timeout is None else float(timeout)


class TCPStore(_store.TCPStore):
    """torch.distributed.TCPStore(host_name, port, world_size=None, is_master=False, timeout)."""

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: Any = datetime.timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
        *,
        secret: bytes | str | None = None,
    ) -> None:
        super().__init__(host_name, port, secret, _seconds(timeout), is_master=is_master)
        self.world_size = world_size


class FileStore(_store.FileStore):
    """torch.distributed.FileStore(file_name, world_size=-1)."""

    def __init__(self, file_name: str, world_size: int = -1, *, timeout: Any = 300.0) -> None:
        super().__init__(file_name, timeout=_seconds(timeout))
        self.world_size = world_size


__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore"]
