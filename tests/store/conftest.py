from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from tests import _etcd

from pycollective.store import (
    EtcdStore,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TCPStore,
    TCPStoreServer,
)

SECRET = b"test-secret"


@pytest.fixture
def server() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer("127.0.0.1", 0, SECRET).start()
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def etcd() -> Iterator[_etcd.EtcdCluster]:
    """One etcd member on loopback for the whole session (each test uses a job of its own)."""
    why = _etcd.missing()
    if why:
        pytest.fail(why)  # `make setup` installs it: a missing etcd is a broken setup
    with _etcd.EtcdCluster(1) as cluster:
        yield cluster


@pytest.fixture(params=["hash", "tcp", "file", "prefix", "etcd"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_store(
    kind: str, server: TCPStoreServer, tmp_path: os.PathLike[str], request: pytest.FixtureRequest
) -> Iterator:
    """A factory of stores of one kind that all share the same data."""
    made: list[Store] = []
    shared = HashStore()
    job = f"test-{uuid.uuid4().hex[:12]}"

    def make(timeout: float = 5.0) -> Store:
        if kind == "hash":
            store: Store = shared
            store.set_timeout(timeout)
        elif kind == "tcp":
            store = TCPStore("127.0.0.1", server.port, SECRET, timeout=timeout)
        elif kind == "etcd":
            cluster = request.getfixturevalue("etcd")
            store = EtcdStore(cluster.endpoints, job, SECRET, timeout=timeout)
        elif kind == "file":
            store = FileStore(os.path.join(tmp_path, "store"), timeout=timeout)
        else:
            inner = TCPStore("127.0.0.1", server.port, SECRET, timeout=timeout)
            made.append(inner)
            store = PrefixStore("job", inner)
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()
