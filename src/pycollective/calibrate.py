"""Measure the cost model's parameters on this host: in a running job (calibrate()) or as
`pycollective calibrate`, which starts the ranks itself and caches the result per host.

What is measured, in a few seconds, through the public API (so Python's share is in):

* With a core per rank (ranks_per_core 1): gamma, np.add(a, b, out=a) on 16 MiB of
  float32 on each rank at once (rank 0's is kept); alpha (and overhead from 3 ranks on) from
  tiny all_reduce by every algorithm, whose rounds and messages differ; beta from tree
  broadcast of 1 and 8 MiB (one-way messages, as the model charges them).
* With more ranks than cores: the CPU-work side (msg_cpu, byte_cpu, call_cpu) from
  all_reduce by every algorithm at three sizes, the lockstep side held fixed.

Each call is timed as the slowest rank's, after a barrier, variants taking turns (a busy
spell hits all alike); lower quartiles go to _costfit.fit(). Rank 0's result is broadcast, so
every rank holds the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from . import _costcache, _costfit, _tuning
from .schedule import ALGORITHMS
from .schedule.cost import CostParams

HELP = "measure this host's cost-model parameters (alpha, beta, gamma, ...) and cache them"
ITEMSIZE = 4  # float32
CPU_SIDE = ("msg_cpu", "byte_cpu", "call_cpu")


def measure_gamma(nbytes: int = 16 << 20, reps: int = 7) -> float:
    """Seconds per byte of an in-place float32 sum beyond cache (median of reps)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones(nbytes // 4, np.float32)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / nbytes


def _timed(
    dist: Any, group: Any, root: int, fns: dict[str, Callable[[], object]], reps: int, budget: float
) -> dict[str, float]:
    """Median seconds per call of each variant (slowest rank), taking turns; stops together
    once `budget` seconds are spent (after at least 3 rounds of turns)."""
    for fn in fns.values():
        fn()  # builds the schedule, warms the buffers
    local: dict[str, list[float]] = {k: [] for k in fns}
    flag = np.zeros(1, np.int32)
    start = time.perf_counter()
    for i in range(reps):
        for name, fn in fns.items():
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            local[name].append(time.perf_counter() - t0)
        if i >= 2 and i + 1 < reps:
            flag[0] = time.perf_counter() - start > budget
            dist.broadcast(flag, src=root, group=group)
            if flag[0]:
                break
    times = np.array([local[k] for k in fns], np.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    # The lower quartile: a busy machine only ever adds time, and the model is of calls
    # that are not held up by anything else.
    return {k: float(np.percentile(row, 25)) for k, row in zip(fns, times, strict=True)}


def _samples(
    dist: Any, group: Any, root: int, p: int, k: float, oversubscribed: bool, budget: float
) -> list[_costfit.Sample]:
    out: list[_costfit.Sample] = []
    algos = ALGORITHMS["all_reduce"]

    def add(coll: str, count: int, times: dict[str, float], segment: int = 0) -> None:
        for algo, t in times.items():
            out.append(_costfit.Sample(coll, algo, p, count, ITEMSIZE, t, k, segment, p))

    counts = [p] + ([16384 * p, 262144] if oversubscribed else [])
    for count in counts:
        buf = np.zeros(count, np.float32)  # zeros: repeated sums stay finite
        fns = {
            a: (lambda a=a, buf=buf: dist.all_reduce(buf, group=group, algorithm=a)) for a in algos
        }
        add("all_reduce", count, _timed(dist, group, root, fns, 30, budget / len(counts)))
    if not oversubscribed:
        segment = _tuning.CHAIN_SEGMENT_BYTES // ITEMSIZE
        for count in (262144, 2097152):
            buf = np.zeros(count, np.float32)
            fns = {
                "tree": lambda buf=buf: dist.broadcast(buf, src=root, group=group, algorithm="tree")
            }
            add("broadcast", count, _timed(dist, group, root, fns, 7, budget / 4), segment)
    return out


def fit_samples(
    samples: list[_costfit.Sample], start: CostParams, p: int, oversubscribed: bool
) -> CostParams:
    """The parameters calibrate() derives from its samples (no I/O; see the module doc).
    A parameter the samples cannot resolve (the fit leaves it at 0) keeps its value in
    `start`."""
    if oversubscribed:
        ar = [s for s in samples if s.collective == "all_reduce"]
        fitted = _costfit.fit(ar, start, CPU_SIDE, work_first=True)[0]
        return _keep_unresolved(fitted, start, CPU_SIDE)
    tiny = [s for s in samples if s.collective == "all_reduce"]
    flat = replace(start, ranks_per_core=1.0)
    free = ("alpha", "overhead") if p > 2 else ("alpha",)
    params = _keep_unresolved(_costfit.fit(tiny, flat, free)[0], flat, free)
    big = [s for s in samples if s.collective == "broadcast"]
    if big:
        params = _keep_unresolved(_costfit.fit(big, params, ("beta",))[0], params, ("beta",))
    return replace(params, ranks_per_core=start.ranks_per_core)


def _keep_unresolved(fitted: CostParams, start: CostParams, names: tuple[str, ...]) -> CostParams:
    keep = {n: getattr(start, n) for n in names if getattr(fitted, n) <= 0}
    return replace(fitted, **keep) if keep else fitted


def calibrate(
    group: Any = None,
    transport: str = "tcp",
    save: bool = True,
    budget: float = 2.0,
    force: bool = False,
    load: float | None = None,
) -> dict[str, Any]:
    """Measure the cost parameters with the ranks of `group` (every member calls this).

    Returns {"params": {...}, "measured": [...], "world_size", "ranks_per_core", "cache"}.
    With the default group, every rank then prices `auto` with the new parameters; with
    `save`, rank 0 writes them to this host's cache (_costcache.py; never fails the job),
    unless the machine was busy (load average above the cores; `load` if given, else
    now) and not `force`.
    """
    import pycollective as dist

    from ._errors import UsageError
    from ._state import resolve_group

    g = resolve_group(group)
    p, rank = g.size(), g.rank()
    if p < 2:
        raise UsageError(f"calibration needs a group of 2 ranks or more, this one has {p}")
    root = g.ranks[0]
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    base = _tuning.group_params(transport, p)
    k = base.ranks_per_core
    over = base.oversubscribed
    # gamma only with a core per rank: sharing cores, np.add would be timed with waits
    start = base if over else replace(base, gamma=measure_gamma())
    samples = _samples(dist, group, root, p, k, over, budget)
    fitted = fit_samples(samples, start, p, over)
    # Every rank takes rank 0's numbers, so that all choose alike.
    names = _costfit.NAMES
    vec = np.array([getattr(fitted, n) for n in names], np.float64)
    dist.broadcast(vec, src=root, group=group)
    fitted = replace(fitted, **{n: float(v) for n, v in zip(names, vec, strict=True)})
    host = replace(fitted, ranks_per_core=1.0)
    if g is resolve_group(None):
        job = _tuning._job or _tuning.local_job_cost(p)
        _tuning.adopt(replace(job, params={**job.params, transport: host}))
        _forget_choices()
    path, note = None, ""
    busy = load > _tuning.cores() and not force
    if save and rank == 0 and busy:
        note = (
            f"not cached: the load average was {load:.1f} on {_tuning.cores()} cores when "
            "calibration began, so the times are inflated (force=True to cache anyway)"
        )
        warnings.warn(f"pycollective calibrate: {note}", stacklevel=2)
    elif save and rank == 0:
        path = _costcache.save(transport, host, {"world_size": p, "load": load})
        _tuning.host_params.cache_clear()
    return {
        "load": load,
        "note": note,
        "params": _costcache.as_dict(host),
        "fitted": list(CPU_SIDE if over else ("alpha", "beta", "gamma"))
        + (["overhead"] if p > 2 and not over else []),
        "world_size": p,
        "ranks_per_core": k,
        "cache": str(path) if path else None,
        "measured": [
            {
                "collective": s.collective,
                "algorithm": s.algorithm,
                "count": s.count,
                "seconds": s.seconds,
                "model": _costfit.predicted(s, replace(fitted, ranks_per_core=k)),
            }
            for s in samples
        ],
    }


def _forget_choices() -> None:
    """Drop choices made with the old parameters (the selectors' caches)."""
    from . import _group

    for mod, name in ((_group, "_select"), (_group, "_auto_choice")):
        fn = getattr(mod, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
    try:
        from . import _hierarchy
    except ImportError:
        return
    fn = getattr(_hierarchy, "flat_algorithm", None)
    if hasattr(fn, "cache_clear"):
        fn.cache_clear()


# ---------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--nprocs",
        default="",
        help="world sizes, comma separated (default: the cores, then cores + 2 for the "
        "CPU-sharing side when the host has 4 cores or fewer)",
    )
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per run")
    parser.add_argument("--no-save", action="store_true", help="do not write the cache")
    parser.add_argument(
        "--force", action="store_true", help="cache the result even if the machine was busy"
    )
    parser.add_argument("--json", metavar="FILE", help="write what was measured")
    parser.add_argument("--timeout", type=float, default=300.0, help="per run")


def default_sizes(cores: int) -> list[int]:
    first = max(2, min(cores, 4))
    return [first, cores + 2] if cores <= 4 else [first]


def main(args: argparse.Namespace) -> int:
    cores = _tuning.cores()
    try:
        sizes = [int(x) for x in args.nprocs.split(",")] if args.nprocs else default_sizes(cores)
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        print("pycollective calibrate: -n takes world sizes >= 2, e.g. -n 2,4", file=sys.stderr)
        return 2
    before = _tuning.host_params("tcp")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before our own ranks
    print(f"# pycollective calibrate: TCP on this host ({cores} cores), world sizes {sizes}")
    print(f"# before ({_tuning.source('tcp')}): {_fmt(before)}")
    runs = []
    for n in sizes:
        try:
            spec = {
                "save": not args.no_save,
                "budget": args.budget,
                "force": args.force,
                "load": load,
            }
            res = _run_job(n, spec, args.timeout)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"pycollective calibrate: {n} ranks: {exc}", file=sys.stderr)
            return 1
        runs.append(res)
        fitted = ", ".join(res["fitted"])
        print(
            f"{n} ranks ({res['ranks_per_core']:.2g} per core, load average {res['load']:.1f}),"
            f" fitted {fitted}:"
        )
        if res["note"]:
            print(f"    {res['note']}")
        print(f"    {_fmt(CostParams(**res['params']))}")
        for m in res["measured"]:
            print(
                f"    {m['collective']:<10} {m['algorithm']:<19} {m['count']:>9} x f32 "
                f"{m['seconds'] * 1e6:>10.0f} us  model {m['model'] * 1e6:>9.0f} us"
            )
    _tuning.host_params.cache_clear()
    print(f"# after ({_tuning.source('tcp')}): {_fmt(_tuning.host_params('tcp'))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "runs": runs}, f, indent=1)
    return 0


def _fmt(p: CostParams) -> str:
    return (
        f"alpha {p.alpha * 1e6:.0f} us, beta {p.beta * 1e9:.3g} ns/B, gamma {p.gamma * 1e9:.3g} "
        f"ns/B, overhead {p.overhead * 1e6:.0f} us, msg_cpu {p.msg_cpu * 1e6:.0f} us, "
        f"byte_cpu {p.byte_cpu * 1e9:.3g} ns/B, call_cpu {p.call_cpu * 1e6:.0f} us"
    )


def _run_job(nprocs: int, spec: dict, timeout: float) -> dict:
    """Start nprocs ranks of this module on loopback; rank 0's result."""
    from ._netutil import free_port

    port = free_port()
    procs = []
    errs = [tempfile.TemporaryFile("w+") for _ in range(nprocs)]  # a pipe could fill up
    for rank in range(nprocs):
        env = dict(os.environ)
        for key in ("PYCOLLECTIVE_STORE_HOSTED", "TORCHELASTIC_USE_AGENT_STORE"):
            env.pop(key, None)
        env.update(
            RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            PYCOLLECTIVE_TRANSPORT="tcp",
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pycollective.calibrate", json.dumps(spec)],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stderr=errs[rank],
                text=True,
            )
        )
    try:
        out, _ = procs[0].communicate(timeout=timeout)
        for proc in procs[1:]:
            proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the ranks took longer than {timeout:.0f} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        for rank, proc in enumerate(procs):
            if proc.returncode != 0:
                errs[rank].seek(0)
                tail = errs[rank].read()[-2000:]
                raise RuntimeError(f"rank {rank} exited with {proc.returncode}:\n{tail}")
    finally:
        for f in errs:
            f.close()
    lines = [ln for ln in out.splitlines() if ln.startswith("CALIBRATE ")]
    if not lines:
        raise RuntimeError("rank 0 reported nothing")
    return json.loads(lines[-1][len("CALIBRATE ") :])


def _worker(argv: list[str]) -> int:
    import pycollective as dist

    spec = json.loads(argv[0])
    dist.init_process_group()
    try:
        res = calibrate(
            save=spec["save"], budget=spec["budget"], force=spec["force"], load=spec["load"]
        )
        if dist.get_rank() == 0:
            print("CALIBRATE " + json.dumps(res), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


__all__ = ["calibrate", "fit_samples", "measure_gamma"]

if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
