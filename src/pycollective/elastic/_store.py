"""The elastic job's store: connecting to it (an etcd cluster, the launcher's TCP store, or
a store host a member starts) and waits that watch the members' leases while a round's
group forms."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from .. import _auth, _launch_env, _netutil
from .._errors import StoreError, UsageError
from ..store import EtcdStore, TCPStore
from ..store._etcd_client import parse_endpoints
from ..store.etcd import parse_url as parse_etcd_url
from ._errors import ElasticError

_SLICE = 0.05  # a watched store wait checks the members' leases this often


class WatchedStore:
    """The store, for setting up one round's group: a wait for a key is cut into short
    slices, and between them the round's members' leases are checked, so a member that
    dies while the others wait for its address ends the wait at once, not at a timeout."""

    def __init__(
        self, store: TCPStore | EtcdStore, leases: dict[str, str], deadline: float, prefix: str
    ) -> None:
        self._store = store
        self._leases = leases  # uid -> lease key
        self._deadline = deadline
        self._prefix = prefix  # the job's keys: on etcd, any change there ends a pause

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        end = self._deadline if timeout is None else min(self._deadline, time.monotonic() + timeout)
        while True:
            since = self._store.revision if isinstance(self._store, EtcdStore) else 0
            if self._store.check([key]):
                return self._store.get(key)
            gone = []
            if self._leases and not self._store.check(list(self._leases.values())):
                gone = [u for u, k in self._leases.items() if not self._store.check([k])]
            if gone:
                raise ElasticError(f"member(s) {', '.join(gone)} left while the group formed")
            left = end - time.monotonic()
            if left <= 0:
                raise StoreError(f"timed out waiting for {key!r} while the group formed")
            if isinstance(self._store, EtcdStore):
                # a watch ends the pause at the key's put or a lease's end: no slices
                wait_for_change(self._store, self._prefix, since, left)
                continue
            try:
                return self._store.get(key, min(_SLICE, left))
            except StoreError:
                if self._store.check([key]):
                    return self._store.get(key)
                if time.monotonic() >= end:
                    raise

    def close(self) -> None:
        pass

    def gone(self) -> str | None:
        """Which members left, for connect_mesh's abort check (None: all there)."""
        if not self._leases or self._store.check(list(self._leases.values())):
            return None
        lost = [u for u, k in self._leases.items() if not self._store.check([k])]
        return f"member(s) {', '.join(lost)} left while the group formed" if lost else None


def wait_for_change(store: EtcdStore, prefix: str, since: int, timeout: float) -> None:
    """Until a key under `prefix` changes after revision `since`, or `timeout`. `since` is
    the revision before the caller's first read of what it waits on: a change between two
    of its reads (after the one that looked, before the last) then still wakes it."""
    for _ in store.watch_prefix(prefix, since, time.monotonic() + timeout):
        return


def connect_store(
    env: _launch_env.LaunchEnv,
    etcd_url: str | None,
    timeout: float,
    setup_timeout: float,
    store_idle: float,
    started_key: str,
) -> TCPStore | EtcdStore:
    """The job's store: the etcd cluster `etcd_url` names; else the launcher's, or the one
    at MASTER_ADDR:MASTER_PORT; when nobody serves it there, a store host this member
    starts (_storehost.py), which outlives it. `started_key` records who started it."""
    if etcd_url is not None:
        hosts, job = parse_etcd_url(etcd_url)
        return EtcdStore(hosts, job, None, timeout=timeout,
                         connect_timeout=setup_timeout)  # fmt: skip
    host, port = env.master_addr, env.master_port
    if host is None or port is None:
        raise UsageError(
            "an elastic job needs its store: start it with `pycollective run --elastic "
            "MIN:MAX`, or set MASTER_ADDR and MASTER_PORT on every member"
        )
    creds = _auth.credentials()  # the job's key (and TLS) for every connection
    if env.store_host == "launcher" or not is_local(host):
        return TCPStore(host, port, creds, timeout=timeout,
                        connect_timeout=setup_timeout)  # fmt: skip
    # RANK 0 starts the store host at once; the others give it a moment first, so
    # that usually one process is started (if several race, one binds, the rest exit).
    first_look = 0.3 if env.rank in (0, None) else 5.0
    try:
        return TCPStore(host, port, creds, timeout=timeout, connect_timeout=first_look)
    except StoreError:
        pass
    # Nobody serves it yet: start a store host of our own, in a session of its own
    # so that it outlives this member (several members may race; one binds).
    bind = host if _netutil.is_loopback(host) else ""
    subprocess.Popen(
        [sys.executable, "-m", "pycollective.elastic._storehost", bind, str(port),
         str(store_idle)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip
    store = TCPStore(host, port, creds, timeout=timeout,
                     connect_timeout=setup_timeout)  # fmt: skip
    try:
        store.compare_set(started_key, "", str(os.getpid()))
    except StoreError:
        pass
    return store


def etcd_hosts(store: EtcdStore | None, url: str | None) -> list[str]:
    """The etcd endpoints' hosts: members listen on the interface towards the first."""
    if store is not None:
        return [e.host for e in store.endpoints]
    assert url is not None
    hosts, _ = parse_etcd_url(url)
    return [e.host for e in parse_endpoints(hosts)]


def is_local(host: str) -> bool:
    if _netutil.is_loopback(host):
        return True
    try:
        return host in {socket.gethostname(), _netutil.address_towards(host)}
    except OSError:
        return False
