"""Time every algorithm of all_reduce, broadcast, all_gather and reduce_scatter across
message sizes, with real ranks over TCP on loopback, and compare with what `auto` picks.

    python benchmarks/algorithm_sweep.py -n 2,4 [--json sweep.json]     # runs the ranks
    python -m pycollective run -n 4 benchmarks/algorithm_sweep.py        # one world size
    python benchmarks/algorithm_sweep.py --analyze sweep.json [--params a,b,g,o]

Sizes go from 4 B to 64 MiB in powers of 4 (float32). The size of a row is the larger
buffer, as in nccl-tests: the tensor for all_reduce and broadcast, the gathered output of
all_gather and the input of reduce_scatter (so per rank count = size / 4 / p, at least 1).
Each cell is the median over reps (30 small, 10 medium, 5 large, cut short by a time
budget) of the slowest rank's time, algorithms taking turns within a size so that noise
on a shared machine hits them alike. `auto` is not timed separately: it runs one of the
timed algorithms, so the table shows its pick and how far that pick is from the best.

--analyze re-prices saved results with other cost parameters (default: what the library
uses here: PYCOLLECTIVE_COST_TCP, else this host's calibration cache, else the defaults),
without running anything. auto is priced as the library prices it: with ranks_per_core =
ranks / cores of the run (the CPU-work side counts when the ranks outnumber the cores).
--fit NAMES fits those parameters to the saved medians first (_costfit.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench  # noqa: E402

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
ITEMSIZE = 4  # float32


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nprocs", default="2,4", help="world sizes, comma separated")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--min-bytes", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--budget", type=float, default=2.5, help="seconds per size (all algos)")
    ap.add_argument("--json", help="write (or add to) results in this file")
    ap.add_argument("--analyze", nargs="*", help="only analyze these saved result files")
    ap.add_argument(
        "--params",
        help="alpha,beta,gamma[,overhead[,msg_cpu,byte_cpu,call_cpu]] for --analyze",
    )
    ap.add_argument(
        "--fit",
        nargs="?",
        const="msg_cpu,byte_cpu,call_cpu",
        help="with --analyze: fit these parameters (default the CPU-work side; any of "
        "alpha,beta,gamma,overhead,msg_cpu,byte_cpu,call_cpu) to the saved medians (with a "
        "per-call constant per world size), and analyze with the fitted values",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="per world size")
    return ap.parse_args(argv)


def _sizes(lo: int, hi: int) -> list[int]:
    out, n = [], 4
    while n <= hi:
        if n >= lo:
            out.append(n)
        n *= 4
    return out


def per_rank_count(collective: str, nbytes: int, p: int) -> int:
    """The count the collective is called with (what auto prices) for a row's size."""
    if collective in ("all_gather", "reduce_scatter"):
        return max(1, nbytes // (ITEMSIZE * p))
    return max(1, nbytes // ITEMSIZE)


def _reps(nbytes: int) -> int:
    return 30 if nbytes < (1 << 20) else 10 if nbytes <= (4 << 20) else 5


# ---------------------------------------------------------------------- the ranks


def _commit() -> str:
    """The library's git commit, with "+" when the tree has changes ("" outside git)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""
    return head + ("+" if dirty else "")


def run_ranks(args: argparse.Namespace) -> None:
    import pycollective as dist
    from pycollective.schedule import ALGORITHMS
    from pycollective.tuning import params as _tuning

    dist.init_process_group()
    rank, p = dist.get_rank(), dist.get_world_size()
    results: dict = {
        "world_size": p,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "cores": _tuning.cores(),
        "commit": _commit(),
        "cells": [],
    }
    started = time.perf_counter()
    for coll in args.collectives.split(","):
        algos = ALGORITHMS[coll]
        for nbytes in _sizes(args.min_bytes, args.max_bytes):
            count = per_rank_count(coll, nbytes, p)
            fns = _make(dist, coll, count, p, rank, algos)
            times = _bench.interleaved(
                dist, fns, _reps(nbytes), args.budget, warmup=1 if nbytes > (1 << 20) else 2
            )
            del fns
            if rank == 0:
                cell = {
                    "collective": coll,
                    "nbytes": nbytes,
                    "count": count,
                    "median": {a: _bench.median(t) for a, t in times.items()},
                    "q25": {a: float(np.percentile(t, 25)) for a, t in times.items()},
                    "reps": len(next(iter(times.values()))),
                }
                results["cells"].append(cell)
                best = min(cell["median"], key=cell["median"].get)
                print(
                    f"{coll:14s} p={p} {_bench.fmt_bytes(nbytes):>7s} "
                    + " ".join(f"{a}={_bench.fmt_time(t)}" for a, t in cell["median"].items())
                    + f"  best={best}",
                    flush=True,
                )
    results["seconds"] = time.perf_counter() - started
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        if args.json:
            _save(args.json, results)
        print(report([results], None))


def _make(dist, coll: str, count: int, p: int, rank: int, algos) -> dict:
    """One zero-argument call per algorithm, on buffers shared by all of them."""
    f32 = np.float32
    if coll == "all_reduce":
        buf = np.zeros(count, f32)  # zeros: repeated sums stay finite
        return {a: (lambda a=a: dist.all_reduce(buf, algorithm=a)) for a in algos}
    if coll == "broadcast":
        buf = np.full(count, rank, f32)
        return {a: (lambda a=a: dist.broadcast(buf, src=0, algorithm=a)) for a in algos}
    if coll == "all_gather":
        inp, out = np.zeros(count, f32), np.zeros(count * p, f32)
        return {a: (lambda a=a: dist.all_gather_into_tensor(out, inp, algorithm=a)) for a in algos}
    if coll == "reduce_scatter":
        inp, out = np.zeros(count * p, f32), np.zeros(count, f32)
        return {a: (lambda a=a: dist.reduce_scatter_tensor(out, inp, algorithm=a)) for a in algos}
    raise ValueError(coll)


def _save(path: str, results: dict) -> None:
    old = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    old = [r for r in old if r["world_size"] != results["world_size"]]
    old.append(results)
    old.sort(key=lambda r: r["world_size"])
    with open(path, "w") as f:
        json.dump(old, f, indent=1)


# ---------------------------------------------------------------------- analysis


def _cores(run: dict) -> int:
    return int(run.get("cores") or run.get("cpus") or 1)


def samples(runs: list[dict]) -> list:
    """The saved medians as _costfit samples (one per-call constant per world size)."""
    from pycollective.tuning import params as _tuning
    from pycollective.tuning.fit import Sample

    out = []
    segment = max(1, _tuning.CHAIN_SEGMENT_BYTES // ITEMSIZE)
    for run in runs:
        p = run["world_size"]
        k = max(1.0, p / _cores(run))
        for cell in run["cells"]:
            coll = cell["collective"]
            seg = segment if coll == "broadcast" else 0
            for algo, t in cell["median"].items():
                out.append(Sample(coll, algo, p, cell["count"], ITEMSIZE, t, k, seg, p))
    return out


def fit(runs: list[dict], names: str):
    """(CostParams, {world size: per-call seconds}) fitted to the saved medians."""
    from pycollective.tuning import fit as _costfit
    from pycollective.tuning import params as _tuning

    return _costfit.fit(samples(runs), _tuning.cost_params("tcp"), names.split(","))


def _params(spec: str | None):
    from pycollective.tuning import params as _tuning

    if not spec:
        return _tuning.cost_params("tcp")
    return _tuning._parse_override("--params", spec)


def auto_pick(coll: str, p: int, count: int, params, cores: int) -> str:
    """What auto chooses: the cost model at the count's next power of two, with p ranks
    sharing `cores` (as _group does on one host)."""
    from pycollective.schedule import cost
    from pycollective.tuning import params as _tuning

    priced = 1 << (count - 1).bit_length() if count > 0 else 0
    segment = max(1, _tuning.CHAIN_SEGMENT_BYTES // ITEMSIZE)
    params = replace(params, ranks_per_core=max(1.0, p / cores))
    return cost.select(coll, p, priced, ITEMSIZE, params, segment=segment)


def crossovers(
    coll: str, p: int, params, cores: int, max_bytes: int = 64 << 20
) -> list[tuple[int, str]]:
    """[(first row size, algorithm auto picks from there on)] over power-of-two sizes."""
    out: list[tuple[int, str]] = []
    nbytes = ITEMSIZE
    while nbytes <= max_bytes:
        pick = auto_pick(coll, p, per_rank_count(coll, nbytes, p), params, cores)
        if not out or out[-1][1] != pick:
            out.append((nbytes, pick))
        nbytes *= 2
    return out


def report(runs: list[dict], spec, per_call: dict | None = None) -> str:
    params = spec if spec is None or not isinstance(spec, str) else None
    params = params or _params(spec if isinstance(spec, str) else None)
    lines = [
        f"cost params: alpha={params.alpha * 1e6:.1f}us beta={params.beta * 1e9:.3f}ns/B "
        f"gamma={params.gamma * 1e9:.3f}ns/B overhead={params.overhead * 1e6:.1f}us "
        f"msg_cpu={params.msg_cpu * 1e6:.1f}us byte_cpu={params.byte_cpu * 1e9:.3f}ns/B "
        f"call_cpu={params.call_cpu * 1e6:.1f}us"
    ]
    geos: list[float] = []
    for run in runs:
        p = run["world_size"]
        cores = _cores(run)
        lines.append(
            f"\n== world size {p} ({run.get('date', '')}, load {run.get('load', 0):.1f}, "
            f"{cores} cores, commit {run.get('commit') or '?'})"
        )
        by_coll: dict[str, list[dict]] = {}
        for cell in run["cells"]:
            by_coll.setdefault(cell["collective"], []).append(cell)
        for coll, cells in by_coll.items():
            algos = list(cells[0]["median"])
            lines.append(f"\n{coll}, p={p}: median seconds per call (slowest rank)")
            head = f"{'size':>8s} " + " ".join(f"{a[:12]:>12s}" for a in algos)
            lines.append(head + f" {'best':>12s} {'auto':>12s} {'auto/best':>9s}")
            ratios = []
            for cell in cells:
                med = cell["median"]
                best = min(med, key=med.get)
                pick = auto_pick(coll, p, cell["count"], params, cores)
                ratio = med[pick] / med[best]
                ratios.append(ratio)
                lines.append(
                    f"{_bench.fmt_bytes(cell['nbytes']):>8s} "
                    + " ".join(f"{_bench.fmt_time(med[a]):>12s}" for a in algos)
                    + f" {best[:12]:>12s} {pick[:12]:>12s} {ratio:9.2f}"
                )
            geo = float(np.exp(np.mean(np.log(ratios))))
            geos.extend(ratios)
            lines.append(
                f"auto vs best: worst {max(ratios):.2f}x, geometric mean {geo:.3f}x, "
                f"best picked in {sum(r == 1.0 for r in ratios)}/{len(ratios)} sizes"
            )
            xs = crossovers(coll, p, params, cores)
            lines.append(
                "auto crossovers: "
                + ", then ".join(f"{a} from {_bench.fmt_bytes(n)}" for n, a in xs)
            )
    if geos:
        geo = float(np.exp(np.mean(np.log(geos))))
        lines.append(f"\nall cells: auto/best geometric mean {geo:.3f}x over {len(geos)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if _bench.under_launcher():
        run_ranks(args)
        return 0
    if args.analyze is not None:
        runs = []
        for path in args.analyze:
            with open(path) as f:
                runs.extend(json.load(f))
        runs.sort(key=lambda r: r["world_size"])
        if args.fit:
            params, per_call = fit(runs, args.fit)
            print(f"fitted: {params}")
            print(
                "per-call constants: "
                + ", ".join(f"p={p}: {c * 1e6:.0f}us" for p, c in per_call.items())
            )
            print(report(runs, params))
        else:
            print(report(runs, args.params))
        return 0
    rest = list(argv if argv is not None else sys.argv[1:])
    status = 0
    for n in (int(x) for x in args.nprocs.split(",")):
        status |= _bench.relaunch(os.path.abspath(__file__), n, rest, args.timeout)
    return status


if __name__ == "__main__":
    sys.exit(main())
