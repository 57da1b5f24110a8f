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

Modes, as nccl-tests: out of place (separate input and output buffers) and in place (the
output is the input, or for all_gather the input is this rank's block of the output, for
reduce_scatter the output is this rank's block of the input). Collectives whose API has
only one form (all_reduce, broadcast, reduce: in place; all_to_all: out of place) time
that one. After the timing, each mode is checked once: every rank fills its buffers with
a known pattern, v(rank, i) = 1 + (rank + i) % 3, runs one call and counts the elements
that differ from what the collective must give (#wrong, summed over ranks). The pattern's
period of 3 makes the expected values three numbers per rank, so the check allocates
nothing the size of the buffers.
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

from .._dtypes import BY_NAME, from_numpy
from ..api._default import resolve_group
from ..runners import ArenaRunner

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
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce")
# The forms each collective's API has (see the module docstring), the first is "primary":
# its numbers are the record's own (time_us, busbw), as before modes existed.
MODES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("in_place",),
    "broadcast": ("in_place",),
    "reduce": ("in_place",),
    "all_gather": ("out_of_place", "in_place"),
    "reduce_scatter": ("out_of_place", "in_place"),
    "all_to_all": ("out_of_place",),
    "barrier": ("in_place",),
}
OPS = ("sum", "prod", "min", "max", "avg")  # nccl-tests' names -> ReduceOp's
_OP_NAME = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
# Relative tolerance of the check per float dtype (products of up to p values round p times).
_RTOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-5, "float64": 1e-12}
_CHUNK = 1 << 20  # elements compared at once by the check

_REP_SECONDS = 2e-3  # one repetition lasts about this long
_MAX_BATCH = 256


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype bench uses for `name` (bfloat16: ml_dtypes', when installed)."""
    return BY_NAME[name].numpy


def _value(rank: int, residue: int) -> int:
    return 1 + (rank + residue) % 3


def _reduced(op: str, p: int, residue: int, dtype: np.dtype) -> float:
    """What `op` over every rank's v(rank, i) gives where i % 3 == residue, in `dtype`."""
    vals = [_value(r, residue) for r in range(p)]
    if op in ("sum", "avg"):
        total = sum(vals)
    elif op == "prod":
        total = 1
        for v in vals:
            total *= v
    else:
        total = min(vals) if op == "min" else max(vals)
    if dtype.kind in "iu":
        wrapped = int(np.array(total, np.int64).astype(dtype))  # integer ops wrap around
        return int(wrapped / p) if op == "avg" else wrapped
    return total / p if op == "avg" else float(total)


def fill(a: np.ndarray, offset: int, value: Callable[[int], float]) -> None:
    """a[j] = value((offset + j) % 3) for every j, by strided slices (no temporaries)."""
    for k in range(min(3, a.size)):
        a[k::3] = value((offset + k) % 3)


def count_wrong(a: np.ndarray, offset: int, value: Callable[[int], float], rtol: float) -> int:
    """How many a[j] differ from value((offset + j) % 3) (relatively, by more than rtol)."""
    wrong = 0
    for k in range(min(3, a.size)):
        want = value((offset + k) % 3)
        sl = a[k::3]
        for lo in range(0, sl.size, _CHUNK):
            part = sl[lo : lo + _CHUNK]
            if rtol:
                got = part.astype(np.float64)
                wrong += int(np.count_nonzero(~(np.abs(got - want) <= rtol * abs(want))))
            else:
                wrong += int(np.count_nonzero(part != want))
    return wrong


def blocks_wrong(out: np.ndarray, p: int, n: int, offset: int, rtol: float) -> int:
    """Wrong elements of p blocks of n, block j holding rank j's v(j, offset + i): what
    all_gather (offset 0) and all_to_all (offset rank * n) must give."""
    return sum(
        count_wrong(out[j * n : (j + 1) * n], offset, lambda i, j=j: _value(j, i), rtol)
        for j in range(p)
    )


class Mode:
    """One form of a call: `fn` times it; `check()` fills the pattern, calls once and
    returns how many elements this rank got wrong."""

    def __init__(self, fn: Callable[[], Any], check: Callable[[], int] | None) -> None:
        self.fn = fn
        self.check = check


def make_modes(backend: Any, collective: str, algorithm: str, count: int, dtype: str,
               op: str) -> dict[str, Mode]:  # fmt: skip
    """The modes of one collective on `backend`: buffers from backend.empty(), their
    numpy views from backend.view(), calls from backend.invoke()."""
    p, r = backend.size, backend.rank
    npd = numpy_dtype(dtype)
    rtol = _RTOL.get(dtype, 0.0)
    n = count
    modes: dict[str, Mode] = {}

    def mk(fn: Callable[[], Any], prepare: Callable[[], None], verify: Callable[[], int]) -> Mode:
        def check() -> int:
            prepare()
            backend.barrier()
            fn()
            return verify()

        prepare()
        return Mode(fn, check)

    def part(big: Any, big_view: np.ndarray, mode: str) -> tuple[Any, np.ndarray]:
        """This rank's n elements: its block of `big` in place, else a buffer of its own."""
        if mode == "in_place":
            return backend.block(big, r * n, n), big_view[r * n : (r + 1) * n]
        buf = backend.empty(n, dtype)
        return buf, backend.view(buf)

    def mine(i: int) -> float:
        return _value(r, i)

    def reduced(i: int) -> float:
        return _reduced(op, p, i, npd)

    for mode in MODES[collective]:
        if collective == "barrier":
            modes[mode] = Mode(backend.invoke("barrier", algorithm, op), lambda: 0)
            continue
        if collective in ("all_reduce", "reduce", "broadcast"):
            x = backend.empty(n, dtype)
            xv = backend.view(x)
            fn = backend.invoke(collective, algorithm, op, x)
            if collective == "broadcast":
                verify = lambda xv=xv: count_wrong(xv, 0, lambda i: _value(0, i), rtol)  # noqa: E731
            elif collective == "reduce" and r != 0:
                verify = lambda: 0  # noqa: E731 - only the root's result is defined
            else:
                verify = lambda xv=xv: count_wrong(xv, 0, reduced, rtol)  # noqa: E731
            modes[mode] = mk(fn, lambda xv=xv: fill(xv, 0, mine), verify)
            continue
        if collective == "all_gather":
            out = backend.empty(n * p, dtype)
            ov = backend.view(out)
            x, xv = part(out, ov, mode)  # in place: the input is this rank's block

            def prep(ov=ov, xv=xv) -> None:
                ov[...] = 0
                fill(xv, 0, mine)

            modes[mode] = mk(
                backend.invoke(collective, algorithm, op, out, x),
                prep,
                lambda ov=ov: blocks_wrong(ov, p, n, 0, rtol),
            )
            continue
        if collective == "reduce_scatter":
            x = backend.empty(n * p, dtype)
            xv = backend.view(x)
            out, ov = part(x, xv, mode)  # in place: the output is this rank's block
            modes[mode] = mk(
                backend.invoke(collective, algorithm, op, out, x),
                lambda xv=xv: fill(xv, 0, mine),
                lambda ov=ov: count_wrong(ov, r * n, reduced, rtol),
            )
            continue
        if collective == "all_to_all":
            x, out = backend.empty(n * p, dtype), backend.empty(n * p, dtype)
            xv, ov = backend.view(x), backend.view(out)

            modes[mode] = mk(
                backend.invoke(collective, algorithm, op, out, x),
                lambda xv=xv: fill(xv, 0, mine),
                lambda ov=ov: blocks_wrong(ov, p, n, r * n, rtol),
            )
            continue
        raise SystemExit(f"unknown collective {collective}")
    return modes


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
        elif transport == "auto":
            pass  # as a user gets it, whatever the runner (across hosts: TCP and shm)
        elif self.size > 1 and dist.group.WORLD.runner(ArenaRunner) is None:
            raise SystemExit("bench: shared memory is not available to these ranks")

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        have = self.dist.algorithms(collective, group=self.group)
        if wanted == ["all"]:
            return have
        return [a for a in wanted if a in have]

    # -- buffers and calls, for make_modes
    def empty(self, n: int, dtype: str) -> Any:
        return np.zeros(n, numpy_dtype(dtype))

    def view(self, buf: Any) -> np.ndarray:
        return buf

    def block(self, buf: Any, start: int, n: int) -> Any:
        return buf[start : start + n]

    def invoke(self, collective: str, algorithm: str, op: str, *bufs: Any) -> Callable[[], Any]:
        d, g = self.dist, self.group
        a = None if algorithm == "auto" else algorithm
        rop = getattr(d.ReduceOp, _OP_NAME[op])
        if collective == "all_reduce":
            return lambda: d.all_reduce(bufs[0], op=rop, group=g, algorithm=a)
        if collective == "broadcast":
            return lambda: d.broadcast(bufs[0], src=0, group=g, algorithm=a)
        if collective == "reduce":
            return lambda: d.reduce(bufs[0], dst=0, op=rop, group=g, algorithm=a)
        if collective == "all_gather":
            return lambda: d.all_gather_into_tensor(bufs[0], bufs[1], group=g, algorithm=a)
        if collective == "reduce_scatter":
            return lambda: d.reduce_scatter_tensor(bufs[0], bufs[1], op=rop, group=g, algorithm=a)
        if collective == "all_to_all":
            return lambda: d.all_to_all_single(bufs[0], bufs[1], group=g, algorithm=a)
        if collective == "barrier":
            return lambda: d.barrier(group=g, algorithm=a)
        raise SystemExit(f"unknown collective {collective}")

    def modes(self, collective: str, algorithm: str, count: int, dtype: str, op: str
              ) -> dict[str, Mode]:  # fmt: skip
        return make_modes(self, collective, algorithm, count, dtype, op)

    def call(self, collective: str, algorithm: str, count: int, dtype: str) -> Callable[[], Any]:
        """The primary mode's call, summing (compare_peers.py's interface)."""
        modes = self.modes(collective, algorithm, count, dtype, "sum")
        return modes[MODES[collective][0]].fn

    def max(self, values: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX, group=self.group)
        return values

    def total(self, values: np.ndarray) -> np.ndarray:
        self.dist.all_reduce(values, op=self.dist.ReduceOp.SUM, group=self.group)
        return values

    def chosen(self, collective: str, algorithm: str, count: int, dtype: str) -> str:
        """The algorithm `auto` runs for this call (what the table shows)."""
        if algorithm != "auto":
            return algorithm
        return resolve_group(self.group).choose_algorithm(
            collective, None, count, from_numpy(numpy_dtype(dtype)), 0
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
            # Across hosts the spec names rank 0's address (compare_peers' cross-host job).
            init_method=f"tcp://{spec.get('gloo_addr', '127.0.0.1')}:{spec['gloo_port']}",
            rank=rank,
            world_size=size,
        )
        self.rank, self.size = rank, size
        self.group = None

    def algorithms(self, collective: str, wanted: list[str]) -> list[str]:
        return ["gloo"]

    def empty(self, n: int, dtype: str) -> Any:
        return self.torch.zeros(n, dtype=getattr(self.torch, dtype))

    def view(self, buf: Any) -> np.ndarray:
        if buf.dtype == self.torch.bfloat16:  # numpy has no bfloat16: the same bits
            return buf.view(self.torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return buf.numpy()

    def invoke(self, collective: str, algorithm: str, op: str, *bufs: Any) -> Callable[[], Any]:
        d = self.dist
        rop = getattr(d.ReduceOp, _OP_NAME[op])
        if collective == "all_reduce":
            return lambda: d.all_reduce(bufs[0], op=rop)
        if collective == "broadcast":
            return lambda: d.broadcast(bufs[0], src=0)
        if collective == "reduce":
            return lambda: d.reduce(bufs[0], dst=0, op=rop)
        if collective == "all_gather":
            return lambda: d.all_gather_into_tensor(bufs[0], bufs[1])
        if collective == "reduce_scatter":
            return lambda: d.reduce_scatter_tensor(bufs[0], bufs[1], op=rop)
        if collective == "all_to_all":
            return lambda: d.all_to_all_single(bufs[0], bufs[1])
        if collective == "barrier":
            return lambda: d.barrier()
        raise SystemExit(f"unknown collective {collective}")

    def max(self, values: np.ndarray) -> np.ndarray:
        tensor = self.torch.from_numpy(values)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return values

    def total(self, values: np.ndarray) -> np.ndarray:
        tensor = self.torch.from_numpy(values)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)
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


class _Timing:
    """One mode's repetitions: k calls make a repetition of about 2 ms."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.times: list[float] = []
        self.k = self.reps = 1

    def warm_up(self, backend: Any, spec: dict, budget: float) -> None:
        warm = []
        for _ in range(spec["warmup"]):
            backend.barrier()
            t0 = time.perf_counter()
            self.mode.fn()
            warm.append(time.perf_counter() - t0)
        one = float(backend.max(np.array([min(warm)], np.float64))[0])
        self.k = int(min(_MAX_BATCH, max(1, _REP_SECONDS // max(one, 1e-7))))
        fit = budget // max(one * self.k, 1e-7)
        self.reps = int(min(spec["reps"], max(spec["min_reps"], fit)))

    def rep(self, backend: Any) -> None:
        backend.barrier()
        t0 = time.perf_counter()
        fn = self.mode.fn
        for _ in range(self.k):
            fn()
        self.times.append((time.perf_counter() - t0) / self.k)


class _Variant:
    """One (transport, algorithm) of a collective at one size: its modes and timings."""

    def __init__(
        self,
        backend: Any,
        transport: str,
        collective: str,
        algorithm: str,
        nbytes: int,
        spec: dict,
    ) -> None:
        p, dtype = backend.size, spec["dtype"]
        op = spec.get("op", "sum")
        itemsize = numpy_dtype(dtype).itemsize
        self.backend = backend
        self.count = per_rank_count(collective, nbytes, p, itemsize)
        blocks = p if collective in ("all_gather", "reduce_scatter", "all_to_all") else 1
        self.record: dict[str, Any] = {
            "transport": transport,
            "collective": collective,
            "algorithm": algorithm,
            "ranks": p,
            "dtype": dtype,
            "op": op if collective in REDUCING else None,
            "root": 0 if collective in ROOTED else -1,
            "bytes": self.count * itemsize * blocks,
            "count": self.count,
            "ran": backend.chosen(collective, algorithm, self.count, dtype),
        }
        if hasattr(backend, "modes"):
            modes = backend.modes(collective, algorithm, self.count, dtype, op)
            if not spec.get("modes_all", False):  # compare_peers: the primary form only
                first = MODES[collective][0]
                modes = {first: modes[first]}
        else:  # a backend with one call per collective (compare_peers' OpenMPI)
            modes = {MODES[collective][0]: Mode(backend.call(collective, algorithm,
                                                             self.count, dtype), None)}  # fmt: skip
        self.timings = {name: _Timing(m) for name, m in modes.items()}

    @property
    def reps(self) -> int:
        return max(t.reps for t in self.timings.values())

    def warm_up(self, spec: dict, budget: float) -> None:
        for t in self.timings.values():
            t.warm_up(self.backend, spec, budget / len(self.timings))

    def rep(self, i: int) -> None:
        for t in self.timings.values():
            if i < t.reps:
                t.rep(self.backend)

    def finish(self) -> dict:
        coll, p = self.record["collective"], self.record["ranks"]
        checks = [t.mode.check for t in self.timings.values()]
        wrong = np.array([c() if c is not None else 0 for c in checks], np.int64)
        if hasattr(self.backend, "total"):
            self.backend.total(wrong)
        for (name, t), w, c in zip(self.timings.items(), wrong, checks, strict=True):
            times = self.backend.max(np.array(t.times, np.float64))
            med = float(np.median(times))
            algbw = self.record["bytes"] / med / 1e9 if med > 0 else 0.0
            self.record[name] = {
                "time_us": med * 1e6,
                "min_us": float(times.min()) * 1e6,
                "max_us": float(times.max()) * 1e6,
                "reps": len(times),
                "batch": t.k,
                "algbw": algbw,
                "busbw": algbw * BUS_FACTOR[coll](p),
                "wrong": int(w) if c is not None else None,
            }
        primary = self.record[next(iter(self.timings))]
        self.record.update(
            {
                k: primary[k]
                for k in ("time_us", "min_us", "max_us", "reps", "batch", "algbw", "busbw", "wrong")
            }  # fmt: skip
        )
        return self.record


def _emit(rank: int, record: dict) -> None:
    if rank == 0:
        print("BENCH " + json.dumps(record), flush=True)


def run(backends: dict[str, Any], spec: dict) -> None:
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
                except (RuntimeError, ValueError, TypeError) as exc:  # e.g. gloo lacks an op
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
                    v.rep(i)
            for v in variants:
                _emit(rank, v.finish())


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    backends: dict[str, Any] = {}
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
