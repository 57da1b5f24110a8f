"""The rank side of `pycollective bench`: time collectives on several backends, print results.

Started by bench.py as N processes with the torchrun environment and a JSON spec in argv.
Rank 0 prints one line per measurement, "BENCH {json}". Every requested transport lives
in the same processes: "shm" is pycollective's default group (shared memory on one host),
"tcp" a group of the same ranks set up with PYCOLLECTIVE_TRANSPORT=tcp, "gloo"
torch.distributed's gloo backend on CPU tensors. They take turns, repetition by
repetition, so a noisy spell on a shared machine hits them alike and their ratios hold.

Method: for each size, a few warm-up calls time one call; the ranks agree (MAX) on that
time and from it on how many calls k make one repetition (about 2 ms: one call of a tiny
collective is too short to time on its own) and on how many repetitions fit the budget.
Each repetition starts after a barrier and is timed as the slowest rank's (MAX over
ranks, done once at the end); the median repetition is reported, divided by k.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pycollective as dist

from .._dtypes import from_numpy
from ..api._default import resolve_group

# nccl-tests' bus bandwidth factors: busbw = algbw * factor reads against the link speed.
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "barrier": lambda p: 0.0,
}

_REP_SECONDS = 2e-3  # one repetition lasts about this long
_MAX_BATCH = 256


class _Ours:
    """pycollective on numpy arrays."""

    name = "pycollective"

    def __init__(self, transport: str, spec: dict) -> None:
        self.dist = dist
        if not dist.is_initialized():
            dist.init_process_group()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.group = None
        if transport == "tcp":
            # A group's transport is settled at its first collective, from this variable.
            saved = os.environ.get("PYCOLLECTIVE_TRANSPORT")
            os.environ["PYCOLLECTIVE_TRANSPORT"] = "tcp"
            try:
                self.group = dist.new_group(list(range(self.size)))
                dist.barrier(group=self.group)
            finally:
                if saved is None:
                    del os.environ["PYCOLLECTIVE_TRANSPORT"]
                else:
                    os.environ["PYCOLLECTIVE_TRANSPORT"] = saved
        elif self.size > 1 and dist.group.WORLD.shm is None:
            raise SystemExit("bench: shared memory is not available to these ranks")

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        have = self.dist.algorithms(collective, group=self.group)
        if wanted == ["all"]:
            return have
        return [a for a in wanted if a in have]

    def zeros(self, n: int, dtype: str) -> Any:
        return np.zeros(n, dtype=dtype)

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        d, p, r, g = self.dist, self.size, self.rank, self.group
        a = None if algorithm == "auto" else algorithm
        if collective == "all_reduce":
            x = np.ones(count, dtype)
            return lambda: d.all_reduce(x, group=g, algorithm=a)
        if collective == "broadcast":
            x = np.ones(count, dtype)
            return lambda: d.broadcast(x, src=0, group=g, algorithm=a)
        if collective == "reduce":
            x = np.ones(count, dtype)
            return lambda: d.reduce(x, dst=0, group=g, algorithm=a)
        if collective == "all_gather":
            x, out = np.full(count, r, dtype), np.empty(count * p, dtype)
            return lambda: d.all_gather_into_tensor(out, x, group=g, algorithm=a)
        if collective == "reduce_scatter":
            x, out = np.ones(count * p, dtype), np.empty(count, dtype)
            return lambda: d.reduce_scatter_tensor(out, x, group=g, algorithm=a)
        if collective == "all_to_all":
            x, out = np.ones(count * p, dtype), np.empty(count * p, dtype)
            return lambda: d.all_to_all_single(out, x, group=g, algorithm=a)
        if collective == "barrier":
            return lambda: d.barrier(group=g, algorithm=a)
        raise SystemExit(f"unknown collective {collective}")

    def max(self, values: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX, group=self.group)
        return values

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        """The algorithm `auto` runs for this call (what the table shows)."""
        if algorithm != "auto":
            return algorithm
        return resolve_group(self.group).choose_algorithm(
            collective, None, count, from_numpy(np.dtype(dtype)), 0
        )

    def barrier(self) -> None:
        self.dist.barrier(group=self.group)

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class _Gloo(_Ours):
    """torch.distributed with the gloo backend, on CPU tensors, for comparison."""

    name = "gloo"

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        return "gloo"

    def __init__(self, transport: str, spec: dict) -> None:
        import torch.distributed as td

        import torch

        self.torch, self.dist = torch, td
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        td.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{spec['gloo_port']}",
            rank=rank,
            world_size=size,
        )
        self.rank, self.size = rank, size

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        return ["gloo"]

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        t, d, p, r = self.torch, self.dist, self.size, self.rank
        dt = getattr(t, dtype)
        if collective == "all_reduce":
            x = t.ones(count, dtype=dt)
            return lambda: d.all_reduce(x)
        if collective == "broadcast":
            x = t.ones(count, dtype=dt)
            return lambda: d.broadcast(x, src=0)
        if collective == "reduce":
            x = t.ones(count, dtype=dt)
            return lambda: d.reduce(x, dst=0)
        if collective == "all_gather":
            x, out = t.full((count,), r, dtype=dt), t.empty(count * p, dtype=dt)
            return lambda: d.all_gather_into_tensor(out, x)
        if collective == "reduce_scatter":
            x, out = t.ones(count * p, dtype=dt), t.empty(count, dtype=dt)
            return lambda: d.reduce_scatter_tensor(out, x)
        if collective == "all_to_all":
            x, out = t.ones(count * p, dtype=dt), t.empty(count * p, dtype=dt)
            return lambda: d.all_to_all_single(out, x)
        if collective == "barrier":
            return lambda: d.barrier()
        raise SystemExit(f"unknown collective {collective}")

    def max(self, values: np.ndarray) -> np.ndarray:
        tensor = self.torch.from_numpy(values)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return values

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def per_rank_count(collective: str, nbytes: int, p: int, itemsize: int) -> int:
    """Elements per rank for a size given as nccl-tests does: the larger buffer of the
    call (the gathered output of all_gather, the input of reduce_scatter)."""
    if collective == "barrier":
        return 0
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return max(1, nbytes // itemsize // p)
    return max(1, nbytes // itemsize)


class _Variant:
    """One (transport, algorithm) of a collective at one size, and its timings."""

    def __init__(
        self,
        backend: _Ours,
        transport: str,
        collective: str,
        algorithm: str,
        nbytes: int,
        spec: dict,
    ) -> None:
        p, dtype = backend.size, spec["dtype"]
        itemsize = np.dtype(dtype).itemsize
        self.backend = backend
        self.count = per_rank_count(collective, nbytes, p, itemsize)
        blocks = p if collective in ("all_gather", "reduce_scatter", "all_to_all") else 1
        self.record: dict[str, Any] = {
            "transport": transport,
            "collective": collective,
            "algorithm": algorithm,
            "ranks": p,
            "dtype": dtype,
            "bytes": self.count * itemsize * blocks,
            "count": self.count,
            "ran": backend.chosen(collective, algorithm, self.count, dtype),
        }
        self.fn = backend.call(collective, algorithm, self.count, dtype)
        self.times: list[float] = []
        self.k = self.reps = 1

    def warm_up(self, spec: dict, budget: float) -> None:
        warm = []
        for _ in range(spec["warmup"]):
            self.backend.barrier()
            t0 = time.perf_counter()
            self.fn()
            warm.append(time.perf_counter() - t0)
        one = float(self.backend.max(np.array([min(warm)], np.float64))[0])
        self.k = int(min(_MAX_BATCH, max(1, _REP_SECONDS // max(one, 1e-7))))
        fit = budget // max(one * self.k, 1e-7)
        self.reps = int(min(spec["reps"], max(spec["min_reps"], fit)))

    def rep(self) -> None:
        self.backend.barrier()
        t0 = time.perf_counter()
        for _ in range(self.k):
            self.fn()
        self.times.append((time.perf_counter() - t0) / self.k)

    def finish(self) -> dict:
        times = self.backend.max(np.array(self.times, np.float64))
        t = float(np.median(times))
        algbw = self.record["bytes"] / t / 1e9 if t > 0 else 0.0
        coll = self.record["collective"]
        self.record.update(
            time_us=t * 1e6,
            min_us=float(times.min()) * 1e6,
            reps=len(times),
            batch=self.k,
            algbw=algbw,
            busbw=algbw * BUS_FACTOR[coll](self.record["ranks"]),
        )
        return self.record


def _emit(rank: int, record: dict) -> None:
    if rank == 0:
        print("BENCH " + json.dumps(record), flush=True)


def run(backends: dict[str, _Ours], spec: dict) -> None:
    rank = next(iter(backends.values())).rank
    for collective in spec["collectives"]:
        pairs = [
            (t, a)
            for t, b in backends.items()
            for a in b.algorithms(collective, spec["algorithms"])
        ]
        sizes = [0] if collective == "barrier" else spec["sizes"]
        for nbytes in sizes:
            variants = []
            for t, a in list(pairs):
                try:
                    v = _Variant(backends[t], t, collective, a, nbytes, spec)
                    v.warm_up(spec, spec["budget"] / max(1, len(pairs)))
                except (RuntimeError, ValueError) as exc:  # e.g. gloo lacks an op
                    _emit(
                        rank,
                        {
                            "transport": t,
                            "collective": collective,
                            "algorithm": a,
                            "bytes": nbytes,
                            "error": str(exc).splitlines()[0][:200],
                        },
                    )
                    pairs.remove((t, a))  # not at the next sizes either
                    continue
                variants.append(v)
            for i in range(max((v.reps for v in variants), default=0)):
                for v in variants:  # taking turns
                    if i < v.reps:
                        v.rep()
            for v in variants:
                _emit(rank, v.finish())


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    backends: dict[str, _Ours] = {}
    try:
        for transport in spec["transports"]:
            cls = _Gloo if transport == "gloo" else _Ours
            backends[transport] = cls(transport, spec)
        run(backends, spec)
    finally:
        for b in reversed(list(backends.values())):
            b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
