"""PycollectiveGroup: a ray.util.collective group (BaseGroup) that runs on pycollective.

Ray calls `PycollectiveGroup(world_size, rank, group_name)` in each actor, from
`init_collective_group(..., backend="pycollective")` or, for a group the driver declared
with `create_collective_group`, at the actor's first collective call. Each group is a
pycollective World of its own (TCP mesh, shared-memory arena between the actors of one
node, engine), so named groups live side by side in one actor and never touch each other,
nor the torch.distributed default group Ray's gloo backend uses.

Rendezvous is through Ray's internal KV (RayKVStore, no MASTER_ADDR): rank 0 publishes a
fresh token for this incarnation of the group name, the other ranks read it and say so,
rank 0 then withdraws it (so a later group of the same name cannot read a token of this
one), and the mesh meets under the token; once every rank has read every address, rank 0
deletes the group's keys. Each rank listens on its node's address as Ray knows it (or on
PYCOLLECTIVE_SOCKET_IFNAME). Peers prove the job's secret (pycollective._ray_job).

Buffers are numpy arrays and CPU torch tensors, in place, as Ray's API passes them (each
call wraps them in a list); reducescatter is one reduce-scatter (Ray's gloo backend runs one
all-reduce per rank), and reduce leaves the buffers of ranks other than the root unchanged.
"""

from __future__ import annotations

import operator
import secrets
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp as RayReduceOp

from .. import _config, _ray_job
from .._errors import CollectiveTimeout, StoreError, UsageError
from .._reduce_ops import ReduceOp
from ..api import collectives as _api
from ..api import p2p as _p2p
from ..core import rendezvous
from ..core.group import ProcessGroup, group_id_for
from ..core.world import World
from ._store import RayKVStore

BACKEND_NAME = "PYCOLLECTIVE"  # ray.util.collective's names are upper case
_OPS = {
    RayReduceOp.SUM: ReduceOp.SUM,
    RayReduceOp.PRODUCT: ReduceOp.PRODUCT,
    RayReduceOp.MIN: ReduceOp.MIN,
    RayReduceOp.MAX: ReduceOp.MAX,
}


def _one(items: Any, what: str) -> Any:
    """Ray passes each buffer wrapped in a list (one per GPU for NCCL); ours is one."""
    if not isinstance(items, (list, tuple)) or len(items) != 1:
        got = f"{len(items)} items" if isinstance(items, (list, tuple)) else type(items).__name__
        raise UsageError(f"{what}: the pycollective backend takes one buffer per actor, got {got}")
    return items[0]


def _op(options: Any) -> ReduceOp:
    op = getattr(options, "reduceOp", RayReduceOp.SUM)
    try:
        return _OPS[op]
    except KeyError:
        raise UsageError(f"unknown reduce op {op!r}; Ray's are SUM, PRODUCT, MIN, MAX") from None


def _group_prefix(job: str, group_name: str) -> str:
    return f"{job}/group/{urllib.parse.quote(group_name, safe='')}"


class PycollectiveGroup(BaseGroup):
    """One ray.util.collective group of this actor, on a pycollective World."""

    def __init__(self, world_size: int, rank: int, group_name: str) -> None:
        try:
            world_size, rank = operator.index(world_size), operator.index(rank)
        except TypeError:
            raise UsageError(f"world_size and rank must be integers, got {world_size!r}, "
                             f"{rank!r}") from None  # fmt: skip
        if world_size < 1:
            raise UsageError(f"world_size must be at least 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is out of range for world size {world_size}")
        super().__init__(world_size, rank, group_name)
        self._world: World | None = None
        self._pg: ProcessGroup | None = None
        timeout = _config.timeout_seconds(None)
        ranks = tuple(range(world_size))
        if world_size == 1:
            self._world = rendezvous.connect_world(0, 1, None, timeout, "ray")
            self._pg = ProcessGroup(self._world, ranks, group_id_for(ranks, 0), self._label())
            return
        world, store = self._rendezvous(timeout)
        try:
            pg = ProcessGroup(world, ranks, group_id_for(ranks, 0), self._label())
            # Past this barrier every rank has read every key: the group's keys can go.
            _api.barrier(group=pg)
            if rank == 0:
                store.clear()
        except BaseException:
            rendezvous.close_world(world)
            raise
        self._world, self._pg = world, pg

    def _label(self) -> str:
        return f"ray:{self._group_name}"

    def _rendezvous(self, timeout: float) -> tuple[World, RayKVStore]:
        rank, size = self._rank, self._world_size
        base = _group_prefix(_ray_job.job_id(), self._group_name)
        board = RayKVStore(base, timeout)
        deadline = time.monotonic() + timeout
        token = None
        try:
            if rank == 0:
                token = secrets.token_hex(8)
                board.set("current", f"{token}:{size}".encode())
                for r in range(1, size):
                    seen = board.get(f"{token}/joined/{r}", max(0.0, deadline - time.monotonic()))
                    if seen != str(size).encode():
                        raise UsageError(
                            f"ray.util.collective group {self._group_name!r}: rank {r} was "
                            f"told world size {seen.decode()!r}, rank 0 {size}"
                        )
                board.delete("current")  # a later group of this name cannot read this token
            else:
                token, _, theirs = board.get("current").decode().partition(":")
                if theirs != str(size):
                    raise UsageError(
                        f"ray.util.collective group {self._group_name!r}: rank {rank} was told "
                        f"world size {size}, rank 0 {theirs}"
                    )
                board.set(f"{token}/joined/{rank}", str(size).encode())
            store = RayKVStore(f"{base}/{token}", max(0.1, deadline - time.monotonic()))
            world = rendezvous.connect_world(
                rank, size, store, timeout, "mesh", master_addr=ray.util.get_node_ip_address(),
                secret=_ray_job.job_secret(),
            )  # fmt: skip
        except (CollectiveTimeout, StoreError) as exc:
            self._forget(board, token, rank)
            exc.args = (
                f"ray.util.collective group {self._group_name!r}, rank {rank} of {size}: "
                f"{exc} (do all {size} actors create the group, with backend "
                "'pycollective' and pycollective.ray.register() called in each?)",
            )
            raise
        except BaseException:
            self._forget(board, token, rank)
            raise
        return world, store

    @staticmethod
    def _forget(board: RayKVStore, token: str | None, rank: int) -> None:
        """On a failed rendezvous, rank 0 withdraws what it published (best effort)."""
        if rank != 0:
            return
        try:
            board.delete("current")
            if token is not None:
                RayKVStore(f"{board.prefix}{token}", 0).clear()
        except StoreError:
            pass

    # ------------------------------------------------------------------ Ray's interface

    @classmethod
    def backend(cls) -> str:
        return BACKEND_NAME

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True  # numpy is all it needs; the compiled core is optional

    @property
    def pycollective_group(self) -> ProcessGroup:
        """The pycollective group underneath, usable with pycollective's own functions."""
        return self._live()

    def _live(self) -> ProcessGroup:
        if self._pg is None:
            raise UsageError(f"ray.util.collective group {self._group_name!r} was destroyed")
        return self._pg

    def destroy_group(self) -> None:
        """Close this group's connections and shared memory; other groups go on."""
        world, self._world, self._pg = self._world, None, None
        if world is not None and not world.closed:
            rendezvous.close_world(world)

    def allreduce(self, tensor: Sequence[Any], allreduce_options: Any = None) -> None:
        _api.all_reduce(_one(tensor, "allreduce"), _op(allreduce_options), self._live())

    def barrier(self, barrier_options: Any = None) -> None:
        _api.barrier(self._live())

    def reduce(self, tensor: Sequence[Any], reduce_options: Any = None) -> None:
        root = getattr(reduce_options, "root_rank", 0)
        _api.reduce(_one(tensor, "reduce"), root, _op(reduce_options), self._live())

    def broadcast(self, tensor: Sequence[Any], broadcast_options: Any = None) -> None:
        root = getattr(broadcast_options, "root_rank", 0)
        _api.broadcast(_one(tensor, "broadcast"), root, self._live())

    def allgather(
        self, tensor_list: Sequence[Any], tensor: Sequence[Any], allgather_options: Any = None
    ) -> None:
        outs = _one(tensor_list, "allgather output lists")
        _api.all_gather(list(outs), _one(tensor, "allgather"), self._live())

    def reducescatter(
        self, tensor: Sequence[Any], tensor_list: Sequence[Any], reducescatter_options: Any = None
    ) -> None:
        ins = _one(tensor_list, "reducescatter input lists")
        _api.reduce_scatter(
            _one(tensor, "reducescatter"), list(ins), _op(reducescatter_options), self._live()
        )

    def send(self, tensor: Sequence[Any], send_options: Any) -> None:
        _p2p.send(_one(tensor, "send"), send_options.dst_rank, self._live())

    def recv(self, tensor: Sequence[Any], recv_options: Any) -> None:
        _p2p.recv(_one(tensor, "recv"), recv_options.src_rank, self._live())

    def __repr__(self) -> str:
        state = "destroyed" if self._pg is None else "live"
        return (f"<PycollectiveGroup {self._group_name!r} rank {self._rank} of "
                f"{self._world_size}, {state}>")  # fmt: skip
