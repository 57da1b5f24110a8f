"""The rank side of `pycollective bench`: time collectives on one backend, print results.

Started by bench.py as N processes with the torchrun environment and a JSON spec in argv.
Rank 0 prints one line per measurement, "BENCH {json}". The backend is pycollective (its
transport chosen with PYCOLLECTIVE_TRANSPORT by the parent) or, for comparison,
torch.distributed with gloo, driven through the same harness.

Method: for each size, a few warm-up calls time one call; the ranks agree (MAX) on that
time and from it on how many calls k make one repetition (about 2 ms: one call of a tiny
collective is too short to time on its own) and on how many repetitions fit the budget.
Each repetition starts after a barrier and is timed as the slowest rank's (MAX over
ranks, done once at the end); the median repetition is reported, divided by k.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

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

    def __init__(self) -> None:
        import pycollective as dist

        self.dist = dist
        dist.init_process_group()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        have = self.dist.algorithms(collective)
        if wanted == ["all"]:
            return have
        return [a for a in wanted if a in have]

    def zeros(self, n: int, dtype: str) -> Any:
        return np.zeros(n, dtype=dtype)

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        d, p, r = self.dist, self.size, self.rank
        a = None if algorithm == "auto" else algorithm
        if collective == "all_reduce":
            x = np.ones(count, dtype)
            return lambda: d.all_reduce(x, algorithm=a)
        if collective == "broadcast":
            x = np.ones(count, dtype)
            return lambda: d.broadcast(x, src=0, algorithm=a)
        if collective == "reduce":
            x = np.ones(count, dtype)
            return lambda: d.reduce(x, dst=0, algorithm=a)
        if collective == "all_gather":
            x, out = np.full(count, r, dtype), np.empty(count * p, dtype)
            return lambda: d.all_gather_into_tensor(out, x, algorithm=a)
        if collective == "reduce_scatter":
            x, out = np.ones(count * p, dtype), np.empty(count, dtype)
            return lambda: d.reduce_scatter_tensor(out, x, algorithm=a)
        if collective == "all_to_all":
            x, out = np.ones(count * p, dtype), np.empty(count * p, dtype)
            return lambda: d.all_to_all_single(out, x, algorithm=a)
        if collective == "barrier":
            return lambda: d.barrier(algorithm=a)
        raise SystemExit(f"unknown collective {collective}")

    def max(self, values: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX)
        return values

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        """The algorithm `auto` runs for this call (what the table shows)."""
        if algorithm != "auto":
            return algorithm
        from ._dtypes import from_numpy
        from ._state import resolve_group

        return resolve_group(None).choose_algorithm(
            collective, None, count, from_numpy(np.dtype(dtype)), 0
        )

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Gloo(_Ours):
    """torch.distributed with the gloo backend, on CPU tensors, for comparison."""

    name = "gloo"

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        return "gloo"

    def __init__(self) -> None:
        import torch.distributed as td

        import torch

        self.torch, self.dist = torch, td
        td.init_process_group("gloo")
        self.rank, self.size = td.get_rank(), td.get_world_size()

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


def per_rank_count(collective: str, nbytes: int, p: int, itemsize: int) -> int:
    """Elements per rank for a size given as nccl-tests does: the larger buffer of the
    call (the gathered output of all_gather, the input of reduce_scatter)."""
    if collective == "barrier":
        return 0
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return max(1, nbytes // itemsize // p)
    return max(1, nbytes // itemsize)


def measure(backend: _Ours, collective: str, algorithm: str, nbytes: int, spec: dict) -> dict:
    p, dtype = backend.size, spec["dtype"]
    itemsize = np.dtype(dtype).itemsize
    count = per_rank_count(collective, nbytes, p, itemsize)
    total = count * itemsize * (p if collective in ("all_gather", "reduce_scatter",
                                                    "all_to_all") else 1)
    record = {"collective": collective, "algorithm": algorithm, "ranks": p, "dtype": dtype,
              "bytes": total, "count": count,
              "ran": backend.chosen(collective, algorithm, count, dtype)}
    fn = backend.call(collective, algorithm, count, dtype)
    warm = []
    for _ in range(spec["warmup"]):
        backend.barrier()
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
    one = float(backend.max(np.array([min(warm)], np.float64))[0])
    k = int(min(_MAX_BATCH, max(1, _REP_SECONDS // max(one, 1e-7))))
    reps = int(min(spec["reps"], max(spec["min_reps"], spec["budget"] // max(one * k, 1e-7))))
    times = np.empty(reps, np.float64)
    for i in range(reps):
        backend.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        times[i] = (time.perf_counter() - t0) / k
    backend.max(times)
    t = float(np.median(times))
    algbw = total / t / 1e9 if t > 0 else 0.0
    record.update(
        time_us=t * 1e6,
        min_us=float(times.min()) * 1e6,
        reps=reps,
        batch=k,
        algbw=algbw,
        busbw=algbw * BUS_FACTOR[collective](p),
    )
    return record


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    backend = _Gloo() if spec["transport"] == "gloo" else _Ours()
    try:
        for collective in spec["collectives"]:
            for algorithm in backend.algorithms(collective, spec["algorithms"]):
                sizes = [0] if collective == "barrier" else spec["sizes"]
                for nbytes in sizes:
                    try:
                        rec = measure(backend, collective, algorithm, nbytes, spec)
                    except (RuntimeError, ValueError) as exc:  # e.g. gloo lacks an op
                        rec = {"collective": collective, "algorithm": algorithm,
                               "bytes": nbytes, "transport": spec["transport"],
                               "error": str(exc).splitlines()[0][:200]}
                        if backend.rank == 0:
                            print("BENCH " + json.dumps(rec), flush=True)
                        break
                    if backend.rank == 0:
                        rec["transport"] = spec["transport"]
                        print("BENCH " + json.dumps(rec), flush=True)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
