"""`pycollective bench`: nccl-tests style tables of collectives x sizes x algorithms x
transports, measured by real ranks on this host.

It starts N ranks (bench_worker.py) with the torchrun environment; in them, every
transport asked for (shm, tcp; gloo, i.e. torch.distributed's gloo backend, for
comparison) runs each size in turns, repetition by repetition, so that the load of a
shared machine falls on all alike. It collects what rank 0 reports and prints

    size  count  transport  algorithm  time(us)  algbw(GB/s)  busbw(GB/s)

with time the median over repetitions of the slowest rank's time per call, algbw =
size / time and busbw = algbw x nccl-tests' factor (all_reduce 2(p-1)/p; all_gather,
reduce_scatter, all_to_all (p-1)/p; broadcast, reduce 1). Size is the larger buffer of
the call, as in nccl-tests. `--json FILE` writes every record; `--plot FILE.png` draws
busbw against size (matplotlib). Also: `make bench`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from .._netutil import free_port

HELP = "time collectives x sizes x algorithms x transports (nccl-tests style)"

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)
TRANSPORTS = ("shm", "tcp", "gloo")
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """'4', '64K', '256M', '1G' -> bytes."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = _UNITS.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in _UNITS else t
    try:
        value = int(float(digits) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size: {text!r}")
    return value


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, n = [], max(1, lo)
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def human(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{int(nbytes)} B"


def run_job(nprocs: int, spec: dict, timeout: float) -> list[dict]:
    """Start the ranks; return rank 0's records (raises on failure)."""
    port = free_port()
    procs = []
    transports = spec["transports"]
    spec = dict(spec, gloo_port=free_port() if "gloo" in transports else 0)
    for rank in range(nprocs):
        env = dict(os.environ)
        for key in ("PYCOLLECTIVE_STORE_HOSTED", "TORCHELASTIC_USE_AGENT_STORE"):
            env.pop(key, None)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONUNBUFFERED="1",
        )
        # The default group is the shm one (required), unless only tcp is asked for.
        env["PYCOLLECTIVE_TRANSPORT"] = "shm" if "shm" in transports else "tcp"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pycollective.cli.bench_worker", json.dumps(spec)],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    records: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        assert procs[0].stdout is not None  # noqa: S101 - piped above
        for line in procs[0].stdout:
            if line.startswith("BENCH "):
                rec = json.loads(line[len("BENCH ") :])
                records.append(rec)
                print(_row(rec), flush=True)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job took longer than {timeout:.0f} s")
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(r, p) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        rank, p = bad[0]
        tail = (p.stderr.read() if p.stderr else "")[-2000:]
        raise RuntimeError(f"rank {rank} exited with {p.returncode}:\n{tail}")
    return records


_HEADER = (
    f"{'size':>10} {'count':>10}  {'transport':<9} {'algorithm':<20} "
    f"{'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"
)


def _row(rec: dict) -> str:
    algo = rec["algorithm"]
    if algo == "auto" and rec.get("ran"):
        algo = f"auto->{rec['ran']}"
    if "error" in rec:
        where = f"{human(rec['bytes']):>10} {'':>10}  {rec['transport']:<9} {algo:<20}"
        return f"{where} {rec['error']}"
    return (
        f"{human(rec['bytes']):>10} {rec['count']:>10}  {rec['transport']:<9} {algo:<20} "
        f"{rec['time_us']:>10.1f} {rec['algbw']:>12.3f} {rec['busbw']:>12.3f}"
    )


def summary(records: Sequence[dict]) -> list[str]:
    """Side by side, per collective and size: each transport's time (its first algorithm,
    normally auto) and how many times slower than the first transport it is."""
    best: dict[tuple[str, int], dict[str, float]] = {}
    order: list[str] = []
    for r in records:
        if "error" in r:
            continue
        if r["transport"] not in order:
            order.append(r["transport"])
        cell = best.setdefault((r["collective"], r["bytes"]), {})
        cell.setdefault(r["transport"], r["time_us"])
    if len(order) < 2:
        return []
    base = order[0]
    head = f"{'collective':<15} {'size':>10} " + " ".join(f"{t + '(us)':>12}" for t in order)
    head += " " + " ".join(f"{t + '/' + base:>10}" for t in order[1:])
    lines = [f"# side by side (times in us; ratios: times slower than {base})", head]
    for (coll, nbytes), cell in best.items():
        row = f"{coll:<15} {human(nbytes):>10} "
        row += " ".join(f"{cell[t]:>12.1f}" if t in cell else f"{'-':>12}" for t in order)
        for t in order[1:]:
            ok = t in cell and base in cell and cell[base] > 0
            row += f" {cell[t] / cell[base]:>9.2f}x" if ok else f" {'-':>10}"
        lines.append(row)
    return lines


def auto_vs_best(records: Sequence[dict]) -> list[str]:
    """Per transport, collective and size where `auto` and other algorithms were timed
    (-a all): what auto chose, the fastest algorithm, and auto/best, the measured time of
    auto's choice over the best's (auto's own time if its choice was not timed alone);
    then the geometric mean of auto/best over the sizes."""
    cells: dict[tuple[str, str, int], dict[str, dict]] = {}
    for r in records:
        if "error" not in r and r["collective"] != "barrier":
            key = (r["transport"], r["collective"], r["bytes"])
            cells.setdefault(key, {})[r["algorithm"]] = r
    lines: list[str] = []
    ratios: dict[tuple[str, str], list[float]] = {}
    for (transport, coll, nbytes), algos in cells.items():
        auto = algos.get("auto")
        timed = {a: r["time_us"] for a, r in algos.items() if a != "auto"}
        if auto is None or len(timed) < 2:
            continue
        chose = auto.get("ran", "auto")
        best = min(timed, key=timed.__getitem__)
        ratio = timed.get(chose, auto["time_us"]) / timed[best]
        ratios.setdefault((transport, coll), []).append(ratio)
        lines.append(
            f"{transport:<5} {coll:<15} {human(nbytes):>10}  auto chose {chose}, best was "
            f"{best}, auto/best = {ratio:.2f}x"
        )
    if not lines:
        return []
    out = ["# auto against the measured best (times of the algorithms run by name)", *lines]
    for (transport, coll), rs in ratios.items():
        geo = math.exp(sum(math.log(x) for x in rs) / len(rs))
        out.append(
            f"{transport:<5} {coll:<15} auto/best: geometric mean {geo:.3f}x, worst "
            f"{max(rs):.2f}x, best chosen at {sum(x == 1.0 for x in rs)}/{len(rs)} sizes"
        )
    return out


def plot(records: Sequence[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = [
        c
        for c in COLLECTIVES
        if c != "barrier" and any(r["collective"] == c and "error" not in r for r in records)
    ]
    if not collectives:
        raise ValueError("nothing to plot (only barrier or errors)")
    cols = min(2, len(collectives))
    rows = -(-len(collectives) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, coll in zip(axes.flat, collectives, strict=False):
        lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for r in records:
            if r["collective"] == coll and "error" not in r:
                lines.setdefault((r["transport"], r["algorithm"]), []).append(
                    (r["bytes"], r["busbw"])
                )
        for (transport, algo), pts in sorted(lines.items()):
            pts.sort()
            ax.plot(
                [x for x, _ in pts],
                [y for _, y in pts],
                marker="o",
                markersize=3,
                label=f"{transport} {algo}",
            )
        ranks = next(r["ranks"] for r in records if r["collective"] == coll and "ranks" in r)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{coll}, {ranks} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(collectives) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="ranks (default 2)")
    parser.add_argument(
        "-c",
        "--collectives",
        default="all_reduce,broadcast,all_gather,reduce_scatter",
        help=f"comma-separated, or 'all' ({','.join(COLLECTIVES)})",
    )
    parser.add_argument(
        "-t",
        "--transports",
        default="shm,tcp",
        help="comma-separated: shm, tcp, gloo (torch.distributed, for comparison)",
    )
    parser.add_argument(
        "-a",
        "--algorithms",
        default="auto",
        help="comma-separated names, or 'all' (each collective's own list)",
    )
    parser.add_argument("-b", "--min-bytes", type=parse_size, default=4, help="default 4")
    parser.add_argument(
        "-e", "--max-bytes", type=parse_size, default=256 << 20, help="default 256M"
    )
    parser.add_argument("-f", "--factor", type=int, default=4, help="size step (default 4)")
    parser.add_argument("-d", "--dtype", default="float32")
    parser.add_argument("--reps", type=int, default=20, help="most repetitions per size")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--budget",
        type=float,
        default=1.0,
        help="seconds of timed repetitions per size, all variants (default 1)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="per transport job")
    parser.add_argument("--json", metavar="FILE", help="write every record as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot busbw against size")


def main(args: argparse.Namespace) -> int:
    colls = list(COLLECTIVES) if args.collectives == "all" else args.collectives.split(",")
    transports = args.transports.split(",")
    for name, bad in (
        ("collective", set(colls) - set(COLLECTIVES)),
        ("transport", set(transports) - set(TRANSPORTS)),
    ):
        if bad:
            print(f"pycollective bench: unknown {name}(s) {sorted(bad)}", file=sys.stderr)
            return 2
    if args.nprocs < 1 or args.factor < 2 or args.min_bytes > args.max_bytes:
        print("pycollective bench: need -n >= 1, -f >= 2 and -b <= -e", file=sys.stderr)
        return 2
    spec = {
        "collectives": colls,
        "algorithms": args.algorithms.split(","),
        "sizes": sizes(args.min_bytes, args.max_bytes, args.factor),
        "dtype": args.dtype,
        "reps": args.reps,
        "min_reps": args.min_reps,
        "warmup": max(1, args.warmup),
        "budget": args.budget,
        "transports": transports,
    }
    print(
        f"# pycollective bench: {args.nprocs} ranks, {args.dtype}, "
        f"{human(spec['sizes'][0])} .. {human(spec['sizes'][-1])}, median of up to "
        f"{args.reps} repetitions (time of the slowest rank)"
    )
    print(_HEADER, flush=True)
    records: list[dict] = []
    status = 0
    try:
        records = run_job(args.nprocs, spec, args.timeout)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"pycollective bench: {exc}", file=sys.stderr)
        status = 1
    for line in summary(records):
        print(line)
    for line in auto_vs_best(records):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nprocs": args.nprocs, "spec": spec, "records": records}, f, indent=1)
    if args.plot and records:
        plot(records, args.plot)
        print(f"# plot: {args.plot}")
    return status
