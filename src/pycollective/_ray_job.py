"""A Ray job's side of pycollective: whether this process is a worker of a Ray job, and the
job's secret.

The secret of a Ray job is PYCOLLECTIVE_SECRET (or PYCOLLECTIVE_SECRET_FILE) when the user
set one, which in a Ray job means in the runtime env (`ray.init(runtime_env={"env_vars":
{...}})`, seen by every actor). Otherwise the job has one of its own: 32 random bytes kept in
Ray's internal key-value store (the GCS) under the job's id, made by the first process of
the job that asks, which is the driver when it calls `pycollective.ray.register()` after
`ray.init()`, and the first actor to build a group otherwise (an atomic put-if-absent, so
every process of the job reads the same one). Why there (docs/ray.md): whoever can read
the GCS can submit jobs to the cluster, that is run any code on it, so the secret is as
well kept as the cluster itself (behind Ray's token authentication where it is turned on),
and unlike a runtime env's variables it is not shown on Ray's dashboard. What it keeps
out is everyone else on the network, and other Ray jobs' groups.

Ray is imported lazily and only looked at once the process has imported it itself: this
module costs nothing to a program that does not use Ray.
"""

from __future__ import annotations

import atexit
import secrets
import sys
from typing import Any

from . import _config, _keys
from ._errors import AuthenticationError, StoreError, UsageError

NAMESPACE = "pycollective"  # our keys in Ray's internal KV, apart from Ray's own
_SECRET_HEX = 32  # bytes of randomness, written as 64 hex digits


def _ray_in_mode(mode_name: str) -> Any | None:
    """The `ray` module when this process is connected to a Ray cluster in that mode."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        mode = ray.get_runtime_context().worker.mode
        return ray if mode == getattr(ray, mode_name) else None
    except Exception:  # noqa: BLE001 - a half-imported or foreign "ray": not a Ray job
        return None


def ray_worker() -> Any | None:
    """`ray` when this process is a worker (actor or task) of a Ray job connected to its
    cluster; None otherwise (no Ray imported, a driver, not connected)."""
    return _ray_in_mode("WORKER_MODE")


def ray_driver() -> Any | None:
    """`ray` when this process is a Ray job's driver connected to its cluster, else None."""
    return _ray_in_mode("SCRIPT_MODE")


def _ray_connected() -> Any:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        raise UsageError("this process is not connected to a Ray cluster (call ray.init())")
    return ray


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def job_id() -> str:
    """The hex id of this process's Ray job (the driver's and every actor's alike)."""
    return str(_ray_connected().get_runtime_context().get_job_id())


def secret_key(job: str) -> str:
    return f"{job}/secret"


def job_secret() -> bytes:
    """The job's secret: the user's (PYCOLLECTIVE_SECRET / _FILE), else the Ray job's own,
    made on first use (see the module's docstring). Never the per-user key file: a Ray
    cluster's hosts need not share a home, and the job's own secret serves every host."""
    if _config.is_set("PYCOLLECTIVE_SECRET") or _config.is_set("PYCOLLECTIVE_SECRET_FILE"):
        return _keys.job_key().secret
    if _config.get("PYCOLLECTIVE_INSECURE") == "1":
        return b""  # the loud opt-out (warned about where the key is made of it)
    _ray_connected()
    kv = _kv()
    key = secret_key(job_id())
    fresh = secrets.token_hex(_SECRET_HEX).encode()
    try:
        existed = kv._internal_kv_put(key, fresh, overwrite=False, namespace=NAMESPACE)
        value = kv._internal_kv_get(key, namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001 - the GCS's errors are Ray's own classes
        raise StoreError(f"Ray's key-value store (GCS) did not answer for the job's secret: "
                         f"{exc}") from exc  # fmt: skip
    if not value:
        raise AuthenticationError(
            f"the Ray job's secret is missing from Ray's key-value store ({NAMESPACE}:{key}); "
            "set PYCOLLECTIVE_SECRET in the job's runtime env instead"
        )
    if not existed and ray_driver() is not None:
        # The driver made it: the job's keys go with the job (best effort; Ray's own exit
        # handler, registered at `import ray`, runs after ours).
        atexit.register(forget_secret, key)
    return bytes(value)


def forget_secret(key: str) -> None:
    try:
        _kv()._internal_kv_del(key, namespace=NAMESPACE)
    except Exception:  # noqa: BLE001, S110 - the cluster may be gone at exit already
        pass


__all__ = [
    "NAMESPACE",
    "forget_secret",
    "job_id",
    "job_secret",
    "ray_driver",
    "ray_worker",
    "secret_key",
]
