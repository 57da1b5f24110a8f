"""The process's default group and the functions that create, inspect and destroy groups.

torch.distributed's API is module-level, so one default group per process is unavoidable;
it lives here and nowhere else.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from . import _launch_env, _netutil, _tuning
from ._auth import secret_from_env
from ._errors import StoreError, UsageError
from ._group import ProcessGroup, World, group_id_for

log = logging.getLogger("pycollective")

DEFAULT_TIMEOUT = 300.0  # seconds; torch's 30 minutes is too long to wait on a hang

_lock = threading.RLock()
_world: World | None = None
_default: ProcessGroup | None = None
_server: Any = None  # the store server rank 0 hosts, when it does
_generation = 0
_warned_unauthenticated = False


class _ClassProperty:
    def __init__(self, fn) -> None:
        self.fn = fn

    def __get__(self, obj, owner):
        return self.fn()


class GroupMember:
    """torch's `dist.group` / `GroupMember`: WORLD is the default group."""

    WORLD = _ClassProperty(lambda: _default)
    NON_GROUP_MEMBER = None


group = GroupMember


def _timeout_seconds(timeout: Any) -> float:
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


def _check_backend(backend: Any) -> str:
    name = "auto" if backend is None else str(backend).lower()
    for part in name.replace(",", " ").split():
        part = part.split(":")[-1]
        if part in ("nccl", "xccl", "ucc"):
            raise UsageError(
                f"backend {backend!r} needs GPUs; pycollective is a CPU backend (use 'auto')"
            )
        if part not in ("auto", "pycollective", "gloo", "mpi", "tcp", "cpu", "undefined"):
            raise UsageError(
                f"unknown backend {backend!r}; use 'auto' (or 'gloo' for drop-in code)"
            )
    return "pycollective"


class _TorchStoreAdapter:
    """Lets a torch.distributed Store (e.g. torchrun's agent store) serve our rendezvous.

    Keys go under `prefix` when one is given; torch's errors (DistStoreError and the other
    RuntimeErrors a torch store raises on timeouts and broken connections) become StoreError.
    """

    def __init__(self, store: Any, prefix: str = "", where: str = "a torch store") -> None:
        self._store = store
        self._prefix = prefix.rstrip("/") + "/" if prefix else ""
        self._where = where

    def set(self, key: str, value: bytes) -> None:
        try:
            self._store.set(self._prefix + key, value)
        except RuntimeError as exc:
            raise StoreError(f"set {key!r} in {self._where} failed: {_first_line(exc)}") from exc

    def get(self, key: str, timeout: float | None = None) -> bytes:
        full = self._prefix + key
        try:
            if timeout is not None:
                self._store.wait([full], datetime.timedelta(seconds=timeout))
            return bytes(self._store.get(full))
        except RuntimeError as exc:
            raise StoreError(f"get {key!r} from {self._where} failed: {_first_line(exc)}") from exc

    def close(self) -> None:
        self._store = None  # torch stores have no close(); dropping ours closes the socket


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _make_store(
    init_method: str | None,
    env: _launch_env.LaunchEnv,
    rank: int,
    world_size: int,
    secret: bytes,
    timeout: float,
    multi_node: bool,
):
    """The rendezvous store, hosting it here when this is rank 0 and nobody else does."""
    global _server
    from . import store as store_mod

    if init_method and init_method.startswith("file://"):
        return store_mod.FileStore(init_method[len("file://") :], timeout=timeout)
    host, port, store_host = env.master_addr, env.master_port, env.store_host
    if init_method and init_method.startswith("tcp://"):
        hostport = init_method[len("tcp://") :].split("?")[0].rstrip("/")
        host, _, port_text = hostport.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            raise UsageError(f"init_method {init_method!r} has no port") from None
        store_host = "rank0"
    elif init_method and init_method != "env://":
        raise UsageError(f"unsupported init_method {init_method!r}; use env://, tcp:// or file://")
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
            raise StoreError(f"cannot reach {where}: {_first_line(exc)}") from exc
        return _TorchStoreAdapter(tstore, prefix, where)
    if store_host == "rank0" and rank == 0:
        bind = "127.0.0.1" if _netutil.is_loopback(host) and not multi_node else ""
        server = store_mod.TCPStoreServer(bind, port, secret=secret)
        try:
            server.start()
        except StoreError as exc:
            if not (from_env and env.port_derived):
                raise
            raise StoreError(
                f"{exc} (port {port} was derived from the {env.launcher} job id; another "
                "program holds it: export MASTER_PORT=<free port> to every rank)"
            ) from exc
        _server = server
    client = store_mod.TCPStore(host, port, secret=secret, timeout=timeout)
    return _JobStore(prefix, client) if prefix else client


class _JobStore:
    """Our keys under the job's prefix in a store it owns (closing closes the store)."""

    def __init__(self, prefix: str, store: Any) -> None:
        self._prefix = prefix.rstrip("/") + "/"
        self._store = store

    def set(self, key: str, value: bytes) -> None:
        self._store.set(self._prefix + key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._store.get(self._prefix + key, timeout)

    def close(self) -> None:
        self._store.close()


def init_process_group(
    backend: Any = None,
    init_method: str | None = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Join the job: find the other ranks, authenticate and connect to each of them.

    With no arguments, reads the launcher's environment (pycollective run, torchrun,
    mpirun, srun, PMI). With none of those and no arguments, the process is a world of one.
    """
    global _world, _default, _generation
    with _lock:
        if _world is not None:
            raise UsageError(
                "init_process_group was already called; call destroy_process_group first"
            )
        _check_backend(backend)
        seconds = _timeout_seconds(timeout)
        env = _launch_env.detect()
        if rank is None or rank < 0:
            rank = env.rank if env.rank is not None else (0 if world_size in (-1, 1, None) else -1)
        if world_size is None or world_size < 0:
            world_size = env.world_size if env.world_size is not None else 1
        if not isinstance(rank, int) or not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"bad rank/world_size: rank={rank!r}, world_size={world_size!r}")
        if rank < 0:
            raise UsageError(
                f"world size {world_size} needs this process's rank: pass rank= or start it "
                "with a launcher (pycollective run, torchrun, mpirun, srun) or set RANK"
            )
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is out of range for world size {world_size} (set RANK)")
        _generation += 1
        the_store = None
        if world_size > 1:
            the_store = (
                store
                if store is not None
                else _make_store(
                    init_method,
                    env,
                    rank,
                    world_size,
                    secret_from_env(),
                    seconds,
                    env.multi_node,
                )
            )
            if store is not None and not hasattr(store, "close"):
                the_store = _TorchStoreAdapter(store)
        try:
            world = connect_world(
                rank,
                world_size,
                the_store,
                seconds,
                f"pycollective/{_generation}",
                master_addr=env.master_addr,
                multi_node=env.multi_node,
            )
        except BaseException:
            _close_store(the_store)
            raise
        world.owns_store = store is None  # a store the caller passed stays theirs to close
        ranks = tuple(range(world_size))
        _world = world
        _default = ProcessGroup(world, ranks, group_id_for(ranks, 0), group_name or "default")
    if world_size > 1:
        # After this, every rank has read every address it needs from the store.
        from ._api import barrier

        try:
            barrier()
            if _tuning.job_wants_calibration():  # rank 0's PYCOLLECTIVE_CALIBRATE
                from .calibrate import calibrate

                calibrate()
        except BaseException:
            destroy_process_group()
            raise


def connect_world(
    rank: int,
    size: int,
    store: Any,
    timeout: float,
    prefix: str,
    *,
    master_addr: str | None = None,
    multi_node: bool = False,
) -> World:
    """Connect this rank to every other rank of a job and return the World, without
    touching the default group: the torch backend and the parameter server build their own.

    `store` has set(key, bytes) and get(key, timeout=None) (ours, or a torch store wrapped
    in _TorchStoreAdapter); addresses go under `prefix`, which must be unique per world
    sharing that store. Every rank calls this with the same size and prefix.
    """
    transport = None
    if size > 1:
        secret = secret_from_env()
        bind, advertise = _netutil.listen_address(master_addr or "127.0.0.1", multi_node)
        _warn_if_open(bind, secret)
        from .transport.tcp import connect_mesh

        transport = connect_mesh(rank, size, store, prefix, secret, bind, advertise, timeout)
    if size > 1:  # every rank prices `auto` with rank 0's cost parameters
        try:
            _tuning.agree(rank, size, store, f"{prefix}/cost", timeout)
        except BaseException:
            transport.close()
            raise
    world = World(rank, size, transport, store, timeout)
    world.engine.set_p2p_runner(_p2p_runner(world))
    world.group_counts[tuple(range(size))] = 1
    return world


def close_world(world: World) -> None:
    """Stop a world's engine and close its connections (not its store). Never hangs."""
    try:
        world.engine.flush_p2p()
        world.engine.stop(timeout=5.0)
    finally:
        world.closed = True
        if world.transport is not None:
            world.transport.close()
        world.pool.release()
        if world.flight is not None and world.flight.timeline is not None:
            world.flight.timeline.write()  # PYCOLLECTIVE_TIMELINE (also written at exit)


def _p2p_runner(world: World):
    from ._p2p import run_batch

    return lambda batch: run_batch(world, batch)


def _warn_if_open(bind: str, secret: bytes) -> None:
    global _warned_unauthenticated
    if not secret and not _netutil.is_loopback(bind) and not _warned_unauthenticated:
        _warned_unauthenticated = True
        warnings.warn(
            "pycollective listens beyond loopback without a shared secret: peers are not "
            "authenticated. Set PYCOLLECTIVE_SECRET (or start with `pycollective run`).",
            stacklevel=4,
        )


def _close_store(store: Any) -> None:
    global _server
    try:
        if store is not None and hasattr(store, "close"):
            store.close()
    except (OSError, StoreError):
        pass
    if _server is not None:
        try:
            _server.close()
        finally:
            _server = None


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the job (or forget one subgroup). Never hangs, even when peers are gone."""
    global _world, _default
    with _lock:
        if group is not None and group is not _default:
            return  # subgroups own nothing beyond their id
        world = _world
        if world is None:
            return
        _world = _default = None
    try:
        close_world(world)
    finally:
        _close_store(world.store if world.owns_store else None)


def is_initialized() -> bool:
    return _world is not None


def is_available() -> bool:
    return True


def resolve_group(group: ProcessGroup | None) -> ProcessGroup:
    if group is None:
        if _default is None:
            raise UsageError(
                "the default process group is not initialized: call init_process_group() first"
            )
        return _default
    if not isinstance(group, ProcessGroup):
        raise UsageError(f"group must be a ProcessGroup made by new_group(), got {group!r}")
    if group.world.closed:
        raise UsageError("this group belongs to a process group that was destroyed")
    return group


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in `group` (-1 if it is not a member)."""
    return resolve_group(group).rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    return resolve_group(group).size()


def get_backend(group: ProcessGroup | None = None) -> str:
    return resolve_group(group).world.backend


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    return list(resolve_group(group).ranks)


def get_group_rank(group: ProcessGroup | None, global_rank: int) -> int:
    return resolve_group(group).group_rank(global_rank)


def get_global_rank(group: ProcessGroup | None, group_rank: int) -> int:
    g = resolve_group(group)
    if not 0 <= group_rank < g.size():
        raise UsageError(f"group rank {group_rank} is out of range for a group of {g.size()}")
    return g.ranks[group_rank]


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: Any = None,
    backend: Any = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> ProcessGroup:
    """A group of some of the world's ranks. As in torch, every rank calls it with the same
    ranks in the same order; a rank outside `ranks` gets a group it is not a member of."""
    world = resolve_group(None).world
    _check_backend(backend)
    if ranks is None:
        members = tuple(range(world.size))
    else:
        try:
            members = tuple(sorted(int(r) for r in ranks))
        except (TypeError, ValueError):
            raise UsageError(f"new_group ranks must be a list of ints, got {ranks!r}") from None
        if len(set(members)) != len(members):
            raise UsageError(f"new_group ranks has duplicates: {list(ranks)}")
        bad = [r for r in members if not 0 <= r < world.size]
        if bad:
            raise UsageError(f"new_group ranks {bad} are outside the world of size {world.size}")
        if not members:
            raise UsageError("new_group needs at least one rank")
    with world.lock:
        nth = world.group_counts.get(members, 0)
        world.group_counts[members] = nth + 1
    seconds = _timeout_seconds(timeout) if timeout is not None else None
    name = group_desc or f"group{list(members)}#{nth}"
    return ProcessGroup(world, members, group_id_for(members, nth), name, seconds)
