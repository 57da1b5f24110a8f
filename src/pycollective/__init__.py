"""pycollective: collective communication for Python.

A drop-in for torch.distributed's functional API (`import pycollective as dist`) over numpy
arrays and CPU torch tensors: all_reduce, broadcast, reduce, all_gather, reduce_scatter,
gather, scatter, all_to_all, barrier and point-to-point, between processes on one host or
across hosts.
"""

from __future__ import annotations

from . import _log
from ._errors import (
    AuthenticationError,
    CollectiveError,
    CollectiveTimeout,
    MismatchError,
    StoreError,
    TransportError,
    UsageError,
)
from ._reduce_ops import ReduceOp
from ._version import __version__
from .api.collectives import (
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
from .api.groups import (
    Backend,
    GroupMember,
    algorithms,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
    new_group,
)
from .api.memory import empty, empty_like
from .api.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from .api.p2p import P2POp, batch_isend_irecv, irecv, isend, monitored_barrier, recv, send
from .api.stores import FileStore, HashStore, PrefixStore, Store, TCPStore
from .core.group import ProcessGroup
from .core.work import Future, Work

_log.configure_quietly()  # PYCOLLECTIVE_DEBUG=INFO|DETAIL: our log on stderr (see _log.py)

__all__ = [
    "__version__",
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
    "get_node_local_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
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
