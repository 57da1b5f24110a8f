"""The actor the ray.util.collective tests drive (tests/ray/test_collective.py and the
multi-host job): it makes groups of either backend and runs one call at a time on buffers
it builds from a description, so the driver can check every rank's result."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import ray
import ray.util.collective as col
from ray.util.collective.types import ReduceOp

import pycollective.ray
from pycollective import _ray_job
from pycollective.core import world as _world

OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX}


CALLS = ("allreduce", "reduce", "broadcast", "allgather", "reducescatter", "barrier", "sendrecv")


def make(kind: str, dtype: str, n: int, rank: int, salt: int = 0) -> Any:
    """Rank-dependent data, exact in every dtype used (small integers)."""
    a = ((np.arange(n) * 7 + rank * 3 + salt) % 11 + 1).astype(dtype)
    if kind == "torch":
        import torch

        return torch.from_numpy(a.copy())
    return a


def as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def expected(what: str, size: int, rank: int, dtype: str, n: int, op: str, root: int) -> dict:
    """What each call leaves on `rank`, from numpy."""
    mine = make("numpy", dtype, n, rank)
    every = [make("numpy", dtype, n, r) for r in range(size)]
    fold = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    total = every[0].copy()
    for a in every[1:]:
        total = fold(total, a)
    if what == "allreduce":
        return {"x": total.tolist()}
    if what == "reduce":
        return {"x": (total if rank == root else mine).tolist()}
    if what == "broadcast":
        return {"x": every[root].tolist()}
    if what == "allgather":
        return {"x": mine.tolist(), "list": [a.tolist() for a in every]}
    if what == "reducescatter":
        parts = [make("numpy", dtype, n, r, salt=rank) for r in range(size)]
        out = parts[0].copy()
        for a in parts[1:]:
            out = fold(out, a)
        return {"x": mine.tolist(), "out": out.tolist()}
    if what == "barrier":
        return {"x": mine.tolist()}
    if what == "sendrecv":
        return {"x": (every[0] if rank == 1 else mine).tolist()}
    raise ValueError(what)


@ray.remote(num_cpus=0)
class Member:
    def __init__(self, rank: int) -> None:
        pycollective.ray.register()  # idempotent: the setup hook did it already
        pycollective.ray.register()
        self.rank = rank

    def node(self) -> str:
        return ray.util.get_node_ip_address()

    def setup(self, name: str, size: int, rank: int | None = None, backend: str = "pycollective"):
        col.init_collective_group(size, self.rank if rank is None else rank, backend=backend,
                                  group_name=name)  # fmt: skip
        return col.get_rank(name)

    def destroy(self, name: str) -> bool:
        col.destroy_collective_group(name)
        return col.is_group_initialized(name)

    def call(self, name: str, what: str, kind: str = "numpy", dtype: str = "float32",
             n: int = 8, op: str = "sum", root: int = 0) -> dict:  # fmt: skip
        """Run one collective in group `name`; returns the buffers it left."""
        col.get_group_handle(name)  # a group declared by the driver is made here
        rank = col.get_rank(name)
        size = col.get_collective_group_size(name)
        x = make(kind, dtype, n, rank)
        out: dict[str, Any] = {}
        if what == "allreduce":
            col.allreduce(x, name, OPS[op])
        elif what == "reduce":
            col.reduce(x, root, name, OPS[op])
        elif what == "broadcast":
            col.broadcast(x, root, name)
        elif what == "allgather":
            outs = [make(kind, dtype, n, 0) * 0 for _ in range(size)]
            col.allgather(outs, x, name)
            out["list"] = [as_numpy(o).tolist() for o in outs]
        elif what == "reducescatter":
            ins = [make(kind, dtype, n, rank, salt=k) for k in range(size)]
            y = make(kind, dtype, n, 0) * 0
            col.reducescatter(y, ins, name, OPS[op])
            out["out"] = as_numpy(y).tolist()
        elif what == "barrier":
            col.barrier(name)
        elif what == "sendrecv":
            if rank == 0:
                col.send(x, 1, name)
            elif rank == 1:
                x = make(kind, dtype, n, 0) * 0
                col.recv(x, 0, name)
        else:
            raise ValueError(what)
        out["x"] = as_numpy(x).tolist()
        return out

    def calls_made(self, name: str) -> int:
        """How many collectives the pycollective group underneath has run."""
        return col.get_group_handle(name).pycollective_group._seq

    def tcp_bytes_sent(self, name: str) -> int:
        counter = _world.count_traffic(col.get_group_handle(name).pycollective_group.world)
        return 0 if counter is None else counter.snapshot().bytes_sent

    def secret(self) -> bytes:
        return _ray_job.job_secret()

    def env(self, key: str) -> str | None:
        return os.environ.get(key)

    def loop(self, name: str, seconds: float) -> str:
        """all_reduce until something fails; what it raised and after how long."""
        x = np.ones(1 << 14, dtype=np.float32)
        end = time.monotonic() + seconds
        seen = time.monotonic()
        try:
            while time.monotonic() < end:
                col.allreduce(x, name)
                seen = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            return f"{type(exc).__name__} after {time.monotonic() - seen:.2f} s: {exc}"
        return "no error"

    def pid(self) -> int:
        return os.getpid()

    def bench(self, name: str, what: str, nbytes: int, calls: int, rounds: int) -> list[float]:
        """Seconds per call on float32 numpy arrays: `rounds` times, after a barrier,
        `calls` calls back to back (nccl-tests' way: no barrier's skew in a call's time),
        after a warm-up."""
        size = col.get_collective_group_size(name)
        n = max(1, nbytes // 4)
        if what == "allreduce":
            x = np.ones(n, dtype=np.float32)

            def run() -> None:
                col.allreduce(x, name)
        else:
            ins = [np.ones(n // size, dtype=np.float32) for _ in range(size)]
            y = np.zeros(n // size, dtype=np.float32)

            def run() -> None:
                col.reducescatter(y, ins, name)

        for _ in range(max(3, calls // 10)):
            run()
        per_call = []
        for _ in range(rounds):
            col.barrier(name)
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            per_call.append((time.perf_counter() - t0) / calls)
        return per_call
