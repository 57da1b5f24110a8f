"""How a rank joins a job: the rendezvous store (hosted by rank 0, torchrun's agent, a file
or one the caller passes), the TCP mesh to every other rank, and the cost parameters all
ranks agree on; and how it leaves (close_world). The default group is not known here: the
API layer (api/groups.py) and the torch backend each build their Worlds with these."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import _auth, _config, _launch_env, _lazy, _netutil, runners
from .. import store as store_mod
from .._errors import CollectiveTimeout, StoreError, UsageError
from .._keys import JobKey
from ..store import _signed
from ..transport.tcp import connect_mesh
from ..tuning import params as _tuning
from .p2p import run_batch
from .world import World

log = logging.getLogger("pycollective.rendezvous")


class TorchStoreAdapter:
    """Lets a torch.distributed Store (e.g. torchrun's agent store) serve our rendezvous.

    Keys go under `prefix` when one is given; torch's errors (DistStoreError and the other
    RuntimeErrors a torch store raises on timeouts and broken connections) become StoreError.
    A torch store authenticates nobody (torchrun's listens on every interface), so once
    `sign` gave it the job's key, every value we put there carries an HMAC under it and a
    value that does not (forged, or another job's) is a StoreError naming the key.
    """

    def __init__(self, store: Any, prefix: str = "", where: str = "a torch store") -> None:
        self._store = store
        self._prefix = prefix.rstrip("/") + "/" if prefix else ""
        self._where = where
        self._signing: bytes | None = None

    def sign(self, key: JobKey) -> None:
        """Sign what is set and check what is got from now on (not for an insecure key)."""
        if not key.insecure:
            self._signing = key.derive(b"torch store values")

    def set(self, key: str, value: bytes) -> None:
        full = self._prefix + key
        if self._signing is not None:
            value = _signed.seal(self._signing, full.encode(), bytes(value), 0)
        try:
            self._store.set(full, value)
        except RuntimeError as exc:
            raise StoreError(f"set {key!r} in {self._where} failed: {first_line(exc)}") from exc

    def get(self, key: str, timeout: float | None = None) -> bytes:
        full = self._prefix + key
        try:
            if timeout is not None:
                self._store.wait([full], datetime.timedelta(seconds=timeout))
            value = bytes(self._store.get(full))
        except RuntimeError as exc:
            raise StoreError(f"get {key!r} from {self._where} failed: {first_line(exc)}") from exc
        if self._signing is None:
            return value
        return _signed.open_sealed(
            self._signing, full.encode(), value, 0, f"{full} in {self._where}"
        )

    def close(self) -> None:
        self._store = None  # torch stores have no close(); dropping ours closes the socket


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_store(
    init_method: str | None,
    env: _launch_env.LaunchEnv,
    rank: int,
    world_size: int,
    creds: _auth.Credentials | None,
    timeout: float,
    multi_node: bool,
):
    """The rendezvous store, hosting it here when this is rank 0 and nobody else does (the
    store returned then closes the server too when it is closed). Our TCP stores take
    `creds` (the job's key, TLS); torchrun's store is torch's and authenticates nobody,
    so what ranks read from it only points them at peers who must then prove the key."""

    if init_method and init_method.startswith("file://"):
        return store_mod.FileStore(init_method[len("file://") :], timeout=timeout)
    etcd_url = etcd_url_of(init_method)
    if etcd_url is not None:
        hosts, job = store_mod.parse_etcd_url(etcd_url)
        key = creds.key if creds is not None else None  # a world of one: nothing to sign
        store = store_mod.EtcdStore(hosts, job, key, timeout=timeout)
        attempt = _config.get("PYCOLLECTIVE_RESTART_COUNT")
        # a restarted attempt (pycollective run --max-restarts) meets under keys of its own
        return JobStore(f"attempt{attempt}", store) if attempt else store
    host, port, store_host = env.master_addr, env.master_port, env.store_host
    if init_method and init_method.startswith("tcp://"):
        host, port = tcp_init_address(init_method)
        store_host = "rank0"
    elif init_method and init_method != "env://":
        raise UsageError(
            f"unsupported init_method {init_method!r}; use env://, tcp://, file:// or etcd://"
        )
    if host is None or port is None:
        raise UsageError(
            f"world size {world_size} needs a rendezvous: set MASTER_ADDR and MASTER_PORT, pass "
            "init_method='tcp://host:port', or start the job with `pycollective run`"
        )
    from_env = not init_method or init_method == "env://"
    prefix = env.store_prefix if from_env else ""
    if store_host == "torchelastic":
        # torchrun's agent already listens at MASTER_ADDR:MASTER_PORT with a torch TCPStore.
        import torch.distributed as tdist

        where = f"torchrun's agent store at {host}:{port}"
        try:
            tstore = tdist.TCPStore(
                host, port, world_size, False, timeout=datetime.timedelta(seconds=timeout)
            )
        except RuntimeError as exc:
            raise StoreError(f"cannot reach {where}: {first_line(exc)}") from exc
        return TorchStoreAdapter(tstore, prefix, where)
    if store_host == "rank0" and rank == 0:
        bind = "127.0.0.1" if _netutil.is_loopback(host) and not multi_node else ""
        server = store_mod.TCPStoreServer(bind, port, secret=creds)
        try:
            server.start()
        except StoreError as exc:
            if not (from_env and env.port_derived):
                raise
            raise StoreError(
                f"{exc} (port {port} was derived from the {env.launcher} job id; another "
                "program holds it: export MASTER_PORT=<free port> to every rank)"
            ) from exc
        client = store_mod.TCPStore(host, port, secret=creds, timeout=timeout)
        return JobStore(prefix, client, server)
    client = store_mod.TCPStore(host, port, secret=creds, timeout=timeout)
    return JobStore(prefix, client) if prefix else client


def etcd_url_of(init_method: str | None) -> str | None:
    """The etcd URL the job rendezvous at: init_method's (etcd://, etcds://), else
    PYCOLLECTIVE_STORE's when init_method is env:// or none; None for the other stores."""
    if init_method and init_method.startswith(("etcd://", "etcds://")):
        return init_method
    if not init_method or init_method == "env://":
        url = _config.get("PYCOLLECTIVE_STORE")
        if url is not None:
            store_mod.parse_etcd_url(url)  # a bad one is named here
            return url
    return None


def route_of(store: Any, master_addr: str | None, multi_node: bool) -> tuple[str | None, bool]:
    """Where a rank's listening address must be reachable from, for a store with no
    MASTER_ADDR: ranks that meet in etcd advertise the interface that routes to the first
    etcd endpoint, and span hosts unless every endpoint is on loopback."""
    inner = store._store if isinstance(store, JobStore) else store
    etcd_store = _lazy.if_loaded(store_mod, "EtcdStore")  # None: no EtcdStore exists yet
    if etcd_store is None or not isinstance(inner, etcd_store):
        return master_addr, multi_node
    hosts = [e.host for e in inner.endpoints]
    remote = not all(_netutil.is_loopback(h) for h in hosts)
    return master_addr or hosts[0], multi_node or remote


def tcp_init_address(init_method: str) -> tuple[str, int]:
    """(host, port) of init_method "tcp://host:port" (a bracketed IPv6 host too)."""
    hostport = init_method[len("tcp://") :].split("?")[0].rstrip("/")
    host, _, port_text = hostport.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"init_method {init_method!r} has no port") from None
    return host.strip("[]"), port


def meeting_host(init_method: str | None, env: _launch_env.LaunchEnv) -> str | None:
    """Where the ranks of a job meet: the host of a tcp:// init_method, else MASTER_ADDR
    (None when neither says). Each rank listens on the interface that routes there."""
    if init_method and init_method.startswith("tcp://"):
        return tcp_init_address(init_method)[0]
    return env.master_addr


class JobStore:
    """Our keys under the job's prefix (none: "") in a store it owns; closing closes the store
    and the server this rank hosts for the job, if it does."""

    def __init__(self, prefix: str, store: Any, server: Any = None) -> None:
        self._prefix = prefix.rstrip("/") + "/" if prefix else ""
        self._store = store
        self._server = server

    def set(self, key: str, value: bytes) -> None:
        self._store.set(self._prefix + key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._store.get(self._prefix + key, timeout)

    def refusals(self) -> list[str]:
        """Why the server this rank hosts refused connections lately (none if it hosts none)."""
        return list(self._server.refused) if self._server is not None else []

    def close(self) -> None:
        try:
            self._store.close()
        finally:
            if self._server is not None:
                server, self._server = self._server, None
                server.close()


def connect_world(
    rank: int,
    size: int,
    store: Any,
    timeout: float,
    prefix: str,
    *,
    master_addr: str | None = None,
    multi_node: bool = False,
    abort: Callable[[], str | None] | None = None,
    creds: _auth.Credentials | None = None,
    secret: bytes | None = None,
) -> World:
    """Connect this rank to every other rank of a job and return the World, without
    touching the default group: the torch backend and the parameter server build their own.

    `store` has set(key, bytes) and get(key, timeout=None) (ours, or a torch store wrapped
    in _TorchStoreAdapter); addresses go under `prefix`, which must be unique per world
    sharing that store. Every rank calls this with the same size and prefix. `abort`
    (see connect_mesh) may end the wait for peers early. `creds`: what the connections
    prove (None: `secret`, the job's when the caller knows it (a Ray job's:
    pycollective._ray_job), else the job's key, with the environment's TLS settings).
    """
    check_environment()
    transport = None
    job = None
    if creds is None:
        creds = _auth.credentials(secret)
    if isinstance(store, TorchStoreAdapter):
        store.sign(creds.key)  # a torch store lets anyone write: make forgeries show
    if size > 1:
        bind, advertise = _netutil.listen_address(master_addr, multi_node)
        t0 = time.monotonic()
        try:
            transport = connect_mesh(
                rank, size, store, prefix, creds, bind, advertise, timeout, abort
            )
        except (CollectiveTimeout, StoreError) as exc:
            if isinstance(exc, CollectiveTimeout) or "timed out" in str(exc):
                _config.with_timeout_hint(exc, timeout)
                # A rank whose key differs was refused by the store this rank hosts: say so.
                refused = store.refusals() if hasattr(store, "refusals") else []
                if refused:
                    exc.args = (f"{exc}; the store refused meanwhile: {'; '.join(refused[-3:])}",)
            raise
        log.info(
            "rank %d: TCP mesh of %d ranks up in %.3f s (listening on %s, advertised as %s; "
            "key %s from %s%s)",
            rank, size, time.monotonic() - t0, bind, advertise, creds.key.fingerprint,
            creds.key.source, ", TLS 1.3" if creds.tls is not None else "",
        )  # fmt: skip
    if size > 1:  # every rank prices `auto` with rank 0's cost parameters
        try:
            job = _tuning.agree(rank, size, store, f"{prefix}/cost", timeout)
        except BaseException:
            if transport is not None:
                transport.close()
            raise
    world = World(rank, size, transport, store, timeout, tuning=_tuning.Tuning(job), key=creds.key)
    world.engine.set_p2p_runner(lambda batch: run_batch(world, batch))
    world.group_counts[tuple(range(size))] = 1
    return world


def close_world(world: World) -> None:
    """Stop a world's engine and close its connections (not its store). Never hangs."""
    try:
        world.engine.flush_p2p()
        world.engine.stop(timeout=5.0)
    finally:
        # stop() refused new work already, unless it never ran: a closed world's engine
        # takes no call (the compiled per-call path reads only the engine's state).
        world.engine.state.stopped = True
        world.closed = True
        if world.transport is not None:
            world.transport.close()
        world.pool.release()
        if world.flight is not None and world.flight.timeline is not None:
            world.flight.timeline.write()  # PYCOLLECTIVE_TIMELINE (also written at exit)


def check_environment() -> None:
    """Every PYCOLLECTIVE_* variable checked before a rank joins (_config.py), algorithm
    names against what the runners know."""
    _config.check_environment(algorithms={c: runners.known(c) for c in _config.COLLECTIVES})
