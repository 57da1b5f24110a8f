"""pycollective as a torch.distributed backend.

    import pycollective.torch                       # registers the backend
    torch.distributed.init_process_group("pycollective")

After the import, torch's own machinery — DDP (buckets, no_sync, comm hooks including
PowerSGD, sparse gradients), Join, FSDP2 and legacy FSDP, DTensor, DCP, pipelining, ZeRO,
the functional collectives, new_group, the profiler — runs on pycollective's collectives
for CPU tensors (docs/torch_conformance.md: torch's own suite, each client beside gloo).
The backend builds its own pycollective world from torch's store, so pycollective's
module-level API (`import pycollective as dist`) stays independent and may be used in the
same process. Errors are raised as instances of both our error classes and torch's
DistBackendError; `group.monitored_barrier(...)` works on the group object (torch's
`dist.monitored_barrier` refuses any backend not named gloo).

The import is usually implicit: the package declares a "torch.backends" entry point, which
torch loads at `import torch` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0), so a script changed
only in its backend name finds "pycollective" without importing anything.
"""

from __future__ import annotations

import torch.distributed as _tdist

from ..transport.counting import TrafficSnapshot
from ._backend import BACKEND_NAME, PycollectiveProcessGroup, create_backend
from ._store import TorchStore, install_env_rendezvous
from ._work import TorchWork


def register() -> None:
    """Register the "pycollective" backend with torch.distributed, and let env://
    rendezvous through `pycollective run`'s store (both idempotent)."""
    if BACKEND_NAME.upper() not in _tdist.Backend._plugins:
        _tdist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["cpu"])
    install_env_rendezvous()


def traffic(group: _tdist.ProcessGroup | None = None) -> TrafficSnapshot:
    """Bytes and messages this rank has exchanged through a pycollective-backed torch group
    (the default group when None): for reports of bytes per step."""
    pg = group if group is not None else _tdist.distributed_c10d._get_default_group()
    if not isinstance(pg, PycollectiveProcessGroup):
        raise ValueError(f"{pg!r} is not a pycollective backend group")
    return pg.traffic()


register()

__all__ = [
    "BACKEND_NAME",
    "PycollectiveProcessGroup",
    "TorchStore",
    "TorchWork",
    "TrafficSnapshot",
    "create_backend",
    "register",
    "traffic",
]
