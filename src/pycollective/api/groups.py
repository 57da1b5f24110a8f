"""Creating, inspecting and destroying groups: init_process_group, destroy_process_group,
new_group and the get_* functions (torch.distributed's names and semantics). The default
group they create lives in _default.py."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _auth, _config, _launch_env, _log, _netutil, schedule
from .._errors import StoreError, UsageError
from ..core import rendezvous
from ..core.group import ProcessGroup, group_id_for
from ._default import DEFAULT, resolve_group
from .calibrate import calibrate
from .collectives import barrier

log = logging.getLogger("pycollective")


class _ClassProperty:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self.fn()


class GroupMember:
    """torch's `dist.group` / `GroupMember`: WORLD is the default group."""

    WORLD = _ClassProperty(lambda: DEFAULT.group)
    NON_GROUP_MEMBER = None


group = GroupMember


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


def _check_device_id(device_id: Any, where: str) -> None:
    """torch binds a group to an accelerator with device_id= and, on a build without one,
    refuses every value (a ValueError); so does pycollective, which runs on CPUs only."""
    if device_id is not None:
        raise UsageError(
            f"{where}(device_id={device_id!r}) binds the group to an accelerator, but "
            "pycollective runs on CPUs: leave device_id out (torch refuses it too without "
            "an accelerator)"
        )


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
    _check_device_id(device_id, "init_process_group")
    _log.configure()  # a bad PYCOLLECTIVE_DEBUG is named here
    started = time.monotonic()
    with DEFAULT.lock:
        if DEFAULT.world is not None:
            raise UsageError(
                "init_process_group was already called; call destroy_process_group first"
            )
        _check_backend(backend)
        rendezvous.check_environment()  # every PYCOLLECTIVE_* setting, before anything is sent
        seconds = _config.timeout_seconds(timeout)
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
        DEFAULT.generation += 1
        log.info(
            "init_process_group: rank %d of %d (local %d of %d), started by %s; rendezvous "
            "at %s:%s (store %s)%s",
            rank, world_size, env.local_rank, env.local_world_size, env.launcher,
            env.master_addr or "127.0.0.1", env.master_port, env.store_host,
            ", several hosts" if env.multi_node else "",
        )  # fmt: skip
        the_store = None
        creds = _auth.credentials() if world_size > 1 else None
        meeting = rendezvous.meeting_host(init_method, env)
        if world_size > 1 and rendezvous.etcd_url_of(init_method) is None:
            # Refused here, before any rank waits on a store, when it spans hosts with no
            # routable address to advertise (connect_world asks the same again). Ranks that
            # meet in etcd route towards its endpoints instead (rendezvous.route_of).
            _netutil.listen_address(meeting, env.multi_node)
        if world_size > 1:
            the_store = (
                store
                if store is not None
                else rendezvous.make_store(
                    init_method,
                    env,
                    rank,
                    world_size,
                    creds,
                    seconds,
                    env.multi_node,
                )
            )
            if store is not None and not hasattr(store, "close"):
                the_store = rendezvous.TorchStoreAdapter(store)
        master_addr, multi_node = rendezvous.route_of(the_store, meeting, env.multi_node)
        try:
            world = rendezvous.connect_world(
                rank,
                world_size,
                the_store,
                seconds,
                f"pycollective/{DEFAULT.generation}",
                master_addr=master_addr,
                multi_node=multi_node,
                creds=creds,
            )
        except BaseException:
            _close_store(the_store)
            raise
        world.owns_store = store is None  # a store the caller passed stays theirs to close
        ranks = tuple(range(world_size))
        DEFAULT.world = world
        DEFAULT.group = ProcessGroup(world, ranks, group_id_for(ranks, 0), group_name or "default")
    if world_size > 1:
        # After this, every rank has read every address it needs from the store.
        try:
            barrier()
            log.info(
                "init_process_group: rank %d joined %d ranks in %.3f s",
                rank, world_size, time.monotonic() - started,
            )  # fmt: skip
            if world.tuning.wants_calibration:  # rank 0's PYCOLLECTIVE_CALIBRATE
                calibrate()
        except BaseException:
            destroy_process_group()
            raise


def _close_store(store: Any) -> None:
    try:
        if store is not None and hasattr(store, "close"):
            store.close()
    except (OSError, StoreError):
        pass


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the job (or forget one subgroup). Never hangs, even when peers are gone."""
    with DEFAULT.lock:
        if group is not None and group is not DEFAULT.group:
            return  # subgroups own nothing beyond their id
        world = DEFAULT.world
        if world is None:
            return
        DEFAULT.world = DEFAULT.group = None
    try:
        rendezvous.close_world(world)
    finally:
        _close_store(world.store if world.owns_store else None)


def is_initialized() -> bool:
    return DEFAULT.world is not None


def is_available() -> bool:
    return True


def is_backend_available(backend: str) -> bool:
    """Whether init_process_group(backend) works: every CPU name (gloo, mpi, pycollective,
    auto) runs on pycollective; GPU ones (nccl, ucc, xccl) do not."""
    try:
        _check_backend(backend)
    except UsageError:
        return False
    return True


def is_gloo_available() -> bool:
    """True: backend="gloo" runs on pycollective (drop-in code picks gloo on CPUs)."""
    return True


def is_mpi_available() -> bool:
    """True: backend="mpi" runs on pycollective, started by mpirun or any other launcher."""
    return True


def is_nccl_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process, as torch tells:
    its agent sets TORCHELASTIC_RUN_ID. `pycollective run` is not torchelastic."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node: LOCAL_RANK (torchrun, pycollective run), else the
    local rank of another launcher that init_process_group understands (mpirun, srun,
    PMI), else `fallback_rank`; RuntimeError without any of them, as in torch."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    env = _launch_env.detect()
    if env.launcher != "none":
        return env.local_rank
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment and no launcher was detected: start the "
        "program with a launcher (pycollective run, torchrun, mpirun, srun) or pass "
        "fallback_rank= to get_node_local_rank"
    )


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in `group` (-1 if it is not a member)."""
    return resolve_group(group).rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in `group` (-1 if this process is not a member, as in torch)."""
    g = resolve_group(group)
    return g.size() if g.is_member else -1


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
    _check_device_id(device_id, "new_group")
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
    seconds = _config.timeout_seconds(timeout) if timeout is not None else None
    name = group_desc or f"group{list(members)}#{nth}"
    return ProcessGroup(world, members, group_id_for(members, nth), name, seconds)


def algorithms(collective: str, group: ProcessGroup | None = None) -> list[str]:
    """The algorithm names `collective` accepts as `algorithm=`, "auto" first. "shm" is
    listed when `group` (default: the default group, once initialized) runs over shared
    memory, i.e. every member is on this host; "hierarchical" (all_reduce) when its members
    are on several hosts (it is accepted as `algorithm=` on any group). Both are known from
    the group's first collective on (runners/)."""
    if collective not in schedule.ALGORITHMS:
        raise UsageError(f"unknown collective {collective!r}; one of {sorted(schedule.ALGORITHMS)}")
    g = group if group is not None else DEFAULT.group
    if g is None:
        return ["auto", *schedule.ALGORITHMS[collective]]
    return g.algorithms(collective)


class Backend:
    """Backend names, as torch.distributed.Backend spells them; all run on pycollective."""

    PYCOLLECTIVE = "pycollective"
    GLOO = "gloo"
    MPI = "mpi"
    AUTO = "auto"
