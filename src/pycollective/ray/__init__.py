"""pycollective as a ray.util.collective backend (`pip install pycollective[ray]`).

    import pycollective.ray
    pycollective.ray.register()       # in the driver and in each actor (idempotent)

    # in each actor:
    ray.util.collective.init_collective_group(2, rank, backend="pycollective", group_name="g")
    ray.util.collective.allreduce(array, group_name="g")

    # or declared from the driver, then used in the actors:
    ray.util.collective.create_collective_group(actors, 2, [0, 1], backend="pycollective")

numpy arrays and CPU torch tensors, in place; rendezvous through Ray's internal key-value
store (no MASTER_ADDR); the job's secret from the runtime env or made for the job (see
pycollective._ray_job); named groups side by side in one actor. `ray.init(runtime_env=
{"worker_process_setup_hook": "pycollective.ray.register"})` registers it in every worker
of the job. Ray Train needs none of this: `TorchConfig(backend="pycollective")` is the torch
backend (docs/ray.md).
"""

from __future__ import annotations

from ray.util.collective import register_collective_backend
from ray.util.collective.backend_registry import BackendRegistry

from .. import _ray_job
from .._errors import UsageError
from ._group import BACKEND_NAME, PycollectiveGroup
from ._store import RayKVStore


def register() -> None:
    """Register the "pycollective" backend with ray.util.collective in this process (safe
    to call again). In a driver connected to its cluster (after ray.init()), also make the
    job's secret now, unless the runtime env gives one."""
    registry = BackendRegistry()  # Ray's one registry per process
    if registry.is_registered(BACKEND_NAME):
        there = registry.get(BACKEND_NAME)
        if there is not PycollectiveGroup:
            raise UsageError(
                f"ray.util.collective already has a backend named {BACKEND_NAME!r}: "
                f"{there.__module__}.{there.__qualname__}"
            )
    else:
        register_collective_backend(BACKEND_NAME, PycollectiveGroup)
    ray = _ray_job.ray_driver()
    if ray is not None:
        _ray_job.job_secret()


__all__ = ["BACKEND_NAME", "PycollectiveGroup", "RayKVStore", "register"]
