"""Cost-model parameters per transport, the job's share of the CPUs, and size constants.

alpha is the cost of one round in which a rank communicates (s), beta the time per byte on
the link (s/B), gamma the time per byte reduced (s/B), overhead the cost of each message
beyond the first that a rank sends (or receives) in one round (s); msg_cpu, byte_cpu and
call_cpu are the CPU-work side, which counts when a host has more ranks than cores
(schedule/cost.py). `auto` prices every algorithm's schedule with these and runs the
cheapest.

Where a host's parameters come from, first found wins: `PYCOLLECTIVE_COST_<TRANSPORT>` =
"alpha,beta,gamma[,overhead[,msg_cpu,byte_cpu,call_cpu]]" (seconds, seconds per byte);
the host's cache written by `pycollective calibrate` (_costcache.py); the defaults below.
Every rank of a job prices with rank 0's parameters and CPU share (agree(), when the
ranks connect; each World keeps them in its Tuning), so all choose alike even when their
hosts' caches differ.
See docs/cost_model.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from .. import _config, _launch_env
from ..schedule.cost import CostParams
from . import cache as _costcache

CHAIN_SEGMENT_BYTES = 256 * 1024

_DEFAULTS = {
    # Measured 2026-11-30 on the development machine (2-core x86_64 VM, Python 3.11, TCP on
    # loopback, other jobs running) and checked against benchmarks/algorithm_sweep.py at
    # 2, 3, 4 and 8 ranks (docs/cost_model.md).
    #   alpha    200 us: the effective cost of one more round of a collective, Python
    #            included (executor, exchange, selector loop, wake-ups), from tiny
    #            all_reduce by algorithms with 1..6 rounds; a fit of the model to a whole
    #            sweep gives 197 us. (Raw loopback TCP ping-pong in Python is 17 us.)
    #   beta     0.6 ns/B: one-way large messages (1.3-1.9 GB/s). A simultaneous exchange
    #            reaches only 0.85-1 GB/s each way on loopback (the CPU copies both
    #            directions), which the model's max(sent, received) cannot express.
    #   gamma    0.12 ns/B: np.add(a, b, out=a) on float32 beyond cache (8.5 GB/s).
    #   overhead 100 us: one rank exchanging with p-1 peers against one peer, per extra
    #            message (111 us at 4 ranks; noisy, up to 700 us under load; fit: 92 us).
    #   msg_cpu 170 us, byte_cpu 1.5 ns/B, call_cpu 1 ms: the CPU-work side, fitted to
    #            all_reduce at 4 ranks on 2 cores (pycollective calibrate). They are
    #            effective values: a rank that waits for a message on a busy machine
    #            also pays for being switched out and back in, so they exceed what
    #            time.process_time() shows (~40 us per message, ~150 us per call).
    "tcp": CostParams(
        alpha=200e-6,
        beta=0.6e-9,
        gamma=0.12e-9,
        overhead=100e-6,
        msg_cpu=170e-6,
        byte_cpu=1.5e-9,
        call_cpu=1e-3,
    ),
}
TRANSPORTS = tuple(_DEFAULTS)


def defaults(transport: str) -> CostParams:
    return _DEFAULTS.get(transport, _DEFAULTS["tcp"])


def _parse_override(name: str, text: str) -> CostParams:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (3, 4, 7):
        raise ValueError(
            f"{name} must be 'alpha,beta,gamma', 'alpha,beta,gamma,overhead' or "
            "'alpha,beta,gamma,overhead,msg_cpu,byte_cpu,call_cpu' (seconds, seconds per "
            f"byte), got {text!r}"
        )
    return CostParams(*vals)


@cache
def host_params(transport: str) -> CostParams:
    """This host's parameters for a transport: the environment, else the cache, else the
    defaults."""
    name = f"PYCOLLECTIVE_COST_{transport.upper()}"
    override = os.environ.get(name)
    if override:
        return _parse_override(name, override)
    cached = _costcache.load(transport)
    return cached if cached is not None else defaults(transport)


def source(transport: str) -> str:
    """Where host_params(transport) comes from: "environment", the cache file, or "defaults"."""
    if os.environ.get(f"PYCOLLECTIVE_COST_{transport.upper()}"):
        return "environment"
    path = _costcache.cache_path(transport)
    if path is not None and path.exists():
        return str(path)
    return "defaults"


def cores() -> int:
    """CPUs this process's job may run on here (PYCOLLECTIVE_CORES overrides)."""
    n = _config.get("PYCOLLECTIVE_CORES")
    if n is not None:
        return int(n)
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    # One core means a launcher pinned this rank (mpirun binds each rank to its own core):
    # the job's ranks together then have the host's cores, not one between them.
    return mine if mine > 1 else (os.cpu_count() or 1)


def local_ranks(world_size: int) -> int:
    """How many of the job's ranks share this host, from the launcher's environment
    (all of them when it does not say)."""
    try:
        env = _launch_env.detect()
        n = 0 if env.launcher == "none" else env.local_world_size
    except Exception:  # noqa: BLE001 - only a guess; the launcher's checks live elsewhere
        n = 0
    return max(1, min(world_size, n)) if n else world_size


@dataclass(frozen=True)
class JobCost:
    """What every rank of a job prices with: rank 0's parameters per transport, how many
    of the job's ranks share a host (local) and how many cores they have."""

    params: dict[str, CostParams]
    local: int
    cores: int
    calibrate: bool = False  # rank 0 asks every rank to calibrate now (PYCOLLECTIVE_CALIBRATE)

    def for_group(self, transport: str, group_size: int) -> CostParams:
        """Parameters for a group of this size, whose ranks on a host share its cores."""
        base = self.params.get(transport) or host_params(transport)
        share = min(group_size, self.local) / max(1, self.cores)
        return replace(base, ranks_per_core=max(share, 1.0))

    def to_json(self) -> str:
        params = {t: _costcache.as_dict(p) for t, p in self.params.items()}
        return json.dumps(
            {
                "params": params,
                "local": self.local,
                "cores": self.cores,
                "calibrate": self.calibrate,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> JobCost:
        data = json.loads(text)
        params = {t: CostParams(**d) for t, d in data["params"].items()}
        return cls(params, int(data["local"]), int(data["cores"]), bool(data.get("calibrate")))


def local_job_cost(world_size: int) -> JobCost:
    params = {t: host_params(t) for t in TRANSPORTS}
    return JobCost(params, local_ranks(world_size), cores(), _calibrate_at_init())


def _calibrate_at_init() -> bool:
    """PYCOLLECTIVE_CALIBRATE: "1" calibrates at every init_process_group, "missing" only
    while this host's cache has no entry (and PYCOLLECTIVE_COST_TCP is unset); rank 0's
    setting decides for the job."""
    mode = _config.get("PYCOLLECTIVE_CALIBRATE")
    if mode == "missing":  # (with the cache off, it would calibrate every job: no)
        return _costcache.cache_dir() is not None and source("tcp") == "defaults"
    return mode == "1"


def agree(rank: int, world_size: int, store: Any, key: str, timeout: float) -> JobCost:
    """Every rank gets rank 0's JobCost through the store (one key): ranks whose hosts have
    different caches or cores then still choose alike."""
    if world_size <= 1 or store is None:
        return local_job_cost(world_size)
    if rank == 0:
        job = local_job_cost(world_size)
        store.set(key, job.to_json().encode())
        return job
    return JobCost.from_json(bytes(store.get(key, timeout)).decode())


class Tuning:
    """What one World prices `auto` with: the job's parameters (rank 0's, agreed when the
    ranks connect) and, cached, each group size's share of the CPUs. Every World has its
    own (the default group's and a torch backend's never touch each other); calibrating a
    whole World replaces its job (adopt)."""

    def __init__(self, job: JobCost | None = None) -> None:
        self._job = job
        self._groups: dict[tuple[str, int], CostParams] = {}

    @property
    def job(self) -> JobCost | None:
        return self._job

    @property
    def wants_calibration(self) -> bool:
        """Rank 0 asked every rank to calibrate now (its PYCOLLECTIVE_CALIBRATE)."""
        return self._job is not None and self._job.calibrate

    def adopt(self, job: JobCost | None) -> None:
        """Price with `job` from now on (after a calibration every rank agreed on)."""
        self._job = job
        self._groups = {}

    def params(self, transport: str) -> CostParams:
        """The job's parameters (rank 0's) once agreed, else this host's; ranks_per_core
        is 1 here, group_params() applies the CPU share."""
        job = self._job
        if job is not None and transport in job.params:
            return job.params[transport]
        return host_params(transport)

    def group_params(self, transport: str, group_size: int) -> CostParams:
        """params() with the CPU share of a group of this size on its hosts."""
        key = (transport, group_size)
        found = self._groups.get(key)
        if found is None:
            job = self._job or local_job_cost(group_size)
            if transport not in job.params:
                job = replace(job, params={**job.params, transport: self.params(transport)})
            found = self._groups[key] = job.for_group(transport, group_size)
        return found


def reload() -> None:
    """Forget what was read from the environment and the cache (tests; a new calibration)."""
    host_params.cache_clear()
