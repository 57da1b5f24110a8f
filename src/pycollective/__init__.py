"""pycollective: collective communication for Python.

A drop-in for torch.distributed's functional API (`import pycollective as dist`) over numpy
arrays and CPU torch tensors: all_reduce, broadcast, reduce, all_gather, reduce_scatter,
gather, scatter, all_to_all, barrier and point-to-point, between processes on one host or
across hosts.
"""

from __future__ import annotations

from . import schedule as _schedule
from ._api import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from ._errors import (
    AuthenticationError,
    CollectiveError,
    CollectiveTimeout,
    MismatchError,
    StoreError,
    TransportError,
    UsageError,
)
from ._group import ProcessGroup
from ._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from ._p2p import P2POp, batch_isend_irecv, irecv, isend, monitored_barrier, recv, send
from ._reduce_ops import ReduceOp
from ._state import (
    GroupMember,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)
from ._torch_stores import FileStore, HashStore, PrefixStore, Store, TCPStore
from ._work import Future, Work
from .shm.shared import empty, empty_like

__version__ = "0.1.0"


def algorithms(collective: str, group: ProcessGroup | None = None) -> list[str]:
    """The algorithm names `collective` accepts as `algorithm=`, "auto" first. "shm" is
    listed when `group` (default: the default group, once initialized) runs over shared
    memory, i.e. every member is on this host (see shm/); "hierarchical" (all_reduce) when
    its members are on several hosts (it is accepted as `algorithm=` on any group)."""
    try:
        names = ["auto", *_schedule.ALGORITHMS[collective]]
    except KeyError:
        raise UsageError(
            f"unknown collective {collective!r}; one of {sorted(_schedule.ALGORITHMS)}"
        ) from None
    from ._state import _default
    from .shm.local import ALGORITHM, COLLECTIVES

    g = group if group is not None else _default
    if g is not None and g.shm is not None and collective in COLLECTIVES:
        names.append(ALGORITHM)
    hier = getattr(g, "hierarchy", None)
    if collective == "all_reduce" and hier is not None and len(hier.layout.hosts) > 1:
        names.append("hierarchical")  # the group spans hosts (see _hierarchy.py)
    return names


class Backend:
    """Backend names, as torch.distributed.Backend spells them; all run on pycollective."""

    PYCOLLECTIVE = "pycollective"
    GLOO = "gloo"
    MPI = "mpi"
    AUTO = "auto"


__all__ = [
    "AuthenticationError",
    "Backend",
    "FileStore",
    "HashStore",
    "PrefixStore",
    "Store",
    "TCPStore",
    "CollectiveError",
    "CollectiveTimeout",
    "Future",
    "GroupMember",
    "MismatchError",
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "StoreError",
    "TransportError",
    "UsageError",
    "Work",
    "algorithms",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "empty",
    "empty_like",
    "gather",
    "gather_object",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
]
