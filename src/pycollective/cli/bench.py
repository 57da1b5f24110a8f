"""`pycollective bench`: collectives x sizes x algorithms x transports measured by real
ranks on this host, printed as nccl-tests prints them.

It starts N ranks (bench_worker.py) with the torchrun environment; in them, every
transport asked for (shm, tcp; gloo, i.e. torch.distributed's gloo backend, for
comparison) runs each size in turns, repetition by repetition, so that the load of a
shared machine falls on all alike. Rank 0 reports; this prints one table per collective:

    size (B), size, count, type, redop, root, transport, algorithm,
    out-of-place time(us) algbw busbw #wrong, in-place time(us) algbw busbw #wrong

time is the median over repetitions of the slowest rank's time per call; algbw = size /
time, busbw = algbw x nccl-tests' factor (all_reduce 2(p-1)/p; all_gather, reduce_scatter,
all_to_all (p-1)/p; broadcast, reduce 1); size is the larger buffer of the call, as in
nccl-tests; #wrong counts the elements of a checked call that differ from what the
collective must give (bench_worker.py). A mode the API does not have shows "n/a". The
algorithm column shows what ran: "auto:ring" when auto chose ring. After the tables: the
#wrong total and "# Avg bus bandwidth" per transport and algorithm (the mean busbw over
sizes and modes, nccl-tests' footer). `--json FILE` writes every record; `--plot FILE.png`
draws time and busbw against size (matplotlib). Also: `make bench`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from .. import _files, schedule
from .._netutil import free_port
from .._units import human_bytes, size_arg
from ..runners.arena import COLLECTIVES as ARENA_COLLECTIVES
from ._args import seconds
from .bench_worker import MODES, OPS, REDUCING

# The names benchmarks/compare_peers.py imports.
human = human_bytes
parse_size = size_arg

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


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, n = [], max(1, lo)
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def run_job(
    nprocs: int, spec: dict, timeout: float, on_record: Callable[[dict], None] | None = None
) -> list[dict]:
    """Start the ranks; return rank 0's records, each also given to `on_record` as it
    arrives (raises on failure)."""
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
                if on_record is not None:
                    on_record(rec)
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


_MODE_COLS = f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
_MODE_UNITS = f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
_ALGO_WIDTH = 2 + max(len("auto:" + a) for names in schedule.ALGORITHMS.values() for a in names)
_LEFT = (
    f"{'size':>12} {'':>9} {'count':>11} {'type':>8} {'redop':>6} {'root':>5}  "
    f"{'transport':<9} {'algorithm':<{_ALGO_WIDTH}}"
)
_LEFT_UNITS = f"{'(B)':>12} {'':>9} {'(elements)':>11}"


def table_header(collective: str, nprocs: int) -> list[str]:
    """The lines before a collective's rows, as nccl-tests: '#' lines, then the columns."""
    gap = " " * (len(_LEFT) - len(_LEFT_UNITS))
    oop, ip = "out-of-place", "in-place"
    return [
        "#",
        f"# {collective}, {nprocs} ranks",
        f"#{' ' * (len(_LEFT) - 1)}  {oop:^{len(_MODE_COLS)}}  {ip:^{len(_MODE_COLS)}}",
        f"#{_LEFT[1:]}  {_MODE_COLS}  {_MODE_COLS}",
        f"#{_LEFT_UNITS[1:]}{gap}  {_MODE_UNITS}  {_MODE_UNITS}",
    ]


def _cells(m: dict | None) -> str:
    if m is None:
        return f"{'n/a':>9} {'':>7} {'':>7} {'':>6}"
    wrong = "-" if m.get("wrong") is None else str(m["wrong"])
    return f"{m['time_us']:>9.1f} {m['algbw']:>7.3f} {m['busbw']:>7.3f} {wrong:>6}"


def algorithm_label(rec: dict) -> str:
    """What ran: 'ring', or 'auto:ring' when auto chose it."""
    algo = rec["algorithm"]
    if algo == "auto" and rec.get("ran") and rec["ran"] != "auto":
        return f"auto:{rec['ran']}"
    return algo


def table_row(rec: dict) -> str:
    """One record as a row of its collective's table."""
    coll = rec["collective"]
    nbytes = rec.get("bytes", 0)
    op = rec.get("op") or ("sum" if coll in REDUCING else "none")
    root = rec.get("root", 0 if coll in ("broadcast", "reduce") else -1)
    left = (
        f"{nbytes:>12} {human_bytes(nbytes):>9} {rec.get('count', ''):>11} "
        f"{rec.get('dtype', ''):>8} {op:>6} {root:>5}  {rec['transport']:<9} "
        f"{algorithm_label(rec):<{_ALGO_WIDTH}}"
    )
    if "error" in rec:
        return f"{left}  error: {rec['error']}"
    modes = MODES.get(coll, ("in_place",))
    if "in_place" not in rec and "out_of_place" not in rec:  # a record of one mode only
        rec = {**rec, modes[0]: rec}
    return f"{left}  {_cells(rec.get('out_of_place'))}  {_cells(rec.get('in_place'))}"


class Table:
    """Prints records as they arrive: a header whenever the collective changes."""

    def __init__(self, nprocs: int, out=None) -> None:
        self.nprocs = nprocs
        self.out = out if out is not None else sys.stdout
        self.current: str | None = None

    def add(self, rec: dict) -> None:
        if rec["collective"] != self.current:
            self.current = rec["collective"]
            for line in table_header(self.current, self.nprocs):
                print(line, file=self.out)
        print(table_row(rec), file=self.out, flush=True)


def footer(records: Sequence[dict]) -> tuple[list[str], int]:
    """nccl-tests' closing lines: the #wrong total, then the mean busbw over sizes and
    modes of each transport and algorithm. Returns the lines and the #wrong total."""
    wrong = 0
    checked = 0
    bw: dict[str, list[float]] = {}
    for r in records:
        if "error" in r or r["collective"] == "barrier":
            continue
        for mode in ("out_of_place", "in_place"):
            m = r.get(mode)
            if m is None:
                continue
            if m.get("wrong") is not None:
                wrong += m["wrong"]
                checked += 1
            bw.setdefault(f"{r['transport']} {r['algorithm']}", []).append(m["busbw"])
    verdict = "OK" if wrong == 0 else "FAILED"
    lines = ["#", f"# Out of bounds values : {wrong} {verdict} ({checked} calls checked)"]
    for label, values in bw.items():
        lines.append(f"# Avg bus bandwidth    : {sum(values) / len(values):.4g} GB/s  {label}")
    return lines + ["#"], wrong


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


def _choices(recs: Sequence[dict]) -> str:
    """What auto ran across the sizes, in order: 'tree', or 'tree, then ring'."""
    seen: list[str] = []
    for r in sorted(recs, key=lambda r: r["bytes"]):
        ran = r.get("ran") or r["algorithm"]
        if not seen or seen[-1] != ran:
            seen.append(ran)
    return ", then ".join(seen)


def plot(records: Sequence[dict], path: str) -> None:
    """Per collective, time and busbw against size (log scales, sizes as 4 KiB, 1 MiB),
    the median with a band from the fastest to the slowest repetition; a line per
    transport and algorithm, auto's labelled with what it chose."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    collectives = [
        c
        for c in COLLECTIVES
        if c != "barrier" and any(r["collective"] == c and "error" not in r for r in records)
    ]
    if not collectives:
        raise ValueError("nothing to plot (only barrier or errors)")
    fig, axes = plt.subplots(
        len(collectives), 2, figsize=(12, 3.8 * len(collectives)), squeeze=False
    )
    for (ax_t, ax_b), coll in zip(axes, collectives, strict=True):
        lines: dict[tuple[str, str], list[dict]] = {}
        for r in records:
            if r["collective"] == coll and "error" not in r:
                lines.setdefault((r["transport"], r["algorithm"]), []).append(r)
        xs_all: set[int] = set()
        for (transport, algo), recs in sorted(lines.items()):
            recs.sort(key=lambda r: r["bytes"])
            xs = [r["bytes"] for r in recs]
            xs_all.update(xs)
            t = [r["time_us"] for r in recs]
            lo = [r.get("min_us", r["time_us"]) for r in recs]
            hi = [r.get("max_us", r["time_us"]) for r in recs]
            label = f"{transport} {algo}"
            if algo == "auto":
                label += f" ({_choices(recs)})"
            (line,) = ax_t.plot(xs, t, marker="o", markersize=3, label=label)
            ax_t.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            factor = [r["busbw"] / r["algbw"] if r["algbw"] else 0.0 for r in recs]
            bw = [r["busbw"] for r in recs]
            # busbw is size / time x factor: the slowest repetition gives the low edge
            bw_lo = [x / h / 1e3 * f for x, h, f in zip(xs, hi, factor, strict=True)]
            bw_hi = [x / m / 1e3 * f for x, m, f in zip(xs, lo, factor, strict=True)]
            ax_b.plot(xs, bw, marker="o", markersize=3, color=line.get_color(), label=label)
            ax_b.fill_between(xs, bw_lo, bw_hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ranks = next(r["ranks"] for r in records if r["collective"] == coll and "ranks" in r)
        ticks = sorted(xs_all)
        step = max(1, -(-len(ticks) // 7))  # at most 7 labels
        for ax, ylabel in ((ax_t, "time per call (us)"), (ax_b, "busbw (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator(ticks[::step]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_bytes(x)))
            ax.tick_params(axis="x", labelrotation=30)
            ax.set_xlabel("size (the larger buffer, as nccl-tests)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_title(f"{coll}, {ranks} ranks: time (median; band: fastest-slowest rep)")
        ax_b.set_title(f"{coll}, {ranks} ranks: bus bandwidth")
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    kind = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    with _files.replacing(path, text=False) as f:  # 0600; a link planted there is replaced
        fig.savefig(f, format=kind, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="ranks")
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
    parser.add_argument(
        "-b", "--min-bytes", type=size_arg, default=4, metavar="SIZE",
        help="smallest size (K, KB, KiB = 1024; M, G likewise)",
    )  # fmt: skip
    parser.add_argument(
        "-e", "--max-bytes", type=size_arg, default=256 << 20, metavar="SIZE",
        help="largest size (default 256M)",
    )  # fmt: skip
    parser.add_argument("-f", "--factor", type=int, default=4, help="size step")
    parser.add_argument("-d", "--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    parser.add_argument(
        "-o", "--op", default="sum", help=f"the reduce-op of reducing collectives: {', '.join(OPS)}"
    )
    parser.add_argument("--reps", type=int, default=20, help="most repetitions per size")
    parser.add_argument("--min-reps", type=int, default=3, help="fewest repetitions per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per size")
    parser.add_argument(
        "--budget",
        type=seconds,
        default=1.0,
        help="seconds of timed repetitions per size, all variants",
    )
    parser.add_argument("--timeout", type=seconds, default=1800.0, help="seconds per job")
    parser.add_argument("--json", metavar="FILE", help="write every record as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot time and busbw against size")


DTYPES = tuple(
    name for name in ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
                      "int64", "uint8", "uint16", "uint32", "uint64")
)  # fmt: skip
_INSTALL = {
    "matplotlib": "pip install 'pycollective[plot]'  (or: pip install matplotlib)",
    "torch": "pip install 'pycollective[torch]'  (torch's CPU build is enough)",
    "ml_dtypes": "pip install ml_dtypes",
}


def _known_algorithms(collective: str) -> list[str]:
    names = ["auto", *schedule.ALGORITHMS[collective]]
    if collective in ARENA_COLLECTIVES:
        names.append("shm")
    if collective == "all_reduce":
        names.append("hierarchical")
    return names


def check_arguments(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Every argument checked before any rank starts: the job's spec, and notes to print.
    Raises ValueError with what was wrong and what is accepted."""
    colls = list(COLLECTIVES) if args.collectives == "all" else args.collectives.split(",")
    transports = args.transports.split(",")
    for name, given, known in (
        ("collective", colls, COLLECTIVES),
        ("transport", transports, TRANSPORTS),
    ):
        bad = [g for g in given if g not in known]
        if bad or not given:
            given_text = ", ".join(bad) or "(none)"
            raise ValueError(f"unknown {name} {given_text}; one of {', '.join(known)}")
    if args.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {args.dtype!r}; one of {', '.join(DTYPES)}")
    if args.op not in OPS:
        raise ValueError(f"unknown op {args.op!r}; one of {', '.join(OPS)}")
    for what, value, lowest in (
        ("-n/--nprocs", args.nprocs, 1),
        ("-f/--factor", args.factor, 2),
        ("--reps", args.reps, 1),
        ("--min-reps", args.min_reps, 1),
        ("--warmup", args.warmup, 0),
    ):
        if value < lowest:
            raise ValueError(f"{what} must be >= {lowest}, got {value}")
    for what, value in (("--budget", args.budget), ("--timeout", args.timeout)):
        if not value > 0:
            raise ValueError(f"{what} must be > 0 seconds, got {value}")
    if args.min_bytes > args.max_bytes:
        raise ValueError(
            f"-b/--min-bytes ({human_bytes(args.min_bytes)}) is larger than -e/--max-bytes "
            f"({human_bytes(args.max_bytes)})"
        )
    algos = args.algorithms.split(",")
    notes = []
    if algos != ["all"] and [t for t in transports if t != "gloo"]:
        everywhere = {a for c in COLLECTIVES for a in _known_algorithms(c)}
        unknown = [a for a in algos if a not in everywhere]
        if unknown:
            raise ValueError(
                f"unknown algorithm {', '.join(unknown)}; "
                + "; ".join(f"{c}: {', '.join(_known_algorithms(c))}" for c in colls)
            )
        for c in colls:
            runs = [a for a in algos if a in _known_algorithms(c)]
            if not runs:
                raise ValueError(
                    f"no algorithm of {', '.join(algos)} runs {c}; {c} has "
                    f"{', '.join(_known_algorithms(c))} (or leave -a out: auto)"
                )
            if len(runs) < len(algos):
                skipped = ", ".join(a for a in algos if a not in runs)
                notes.append(f"# {c}: {skipped} does not run {c} (left out)")
    needs = []
    if args.plot:
        needs.append(("matplotlib", "--plot"))
    if "gloo" in transports:
        needs.append(("torch", "-t gloo"))
    if args.dtype == "bfloat16":
        needs.append(("ml_dtypes", "-d bfloat16"))
    for module, option in needs:
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{option} needs {module}, which is not installed: {_INSTALL[module]}")
    spec = {
        "collectives": colls,
        "algorithms": algos,
        "sizes": sizes(args.min_bytes, args.max_bytes, args.factor),
        "dtype": args.dtype,
        "op": args.op,
        "reps": args.reps,
        "min_reps": min(args.min_reps, args.reps),
        "warmup": max(1, args.warmup),
        "budget": args.budget,
        "transports": transports,
        "modes_all": True,
    }
    return spec, notes


def main(args: argparse.Namespace) -> int:
    try:
        spec, notes = check_arguments(args)
    except ValueError as exc:
        print(f"pycollective bench: {exc}", file=sys.stderr)
        return 2
    print(
        f"# pycollective bench: {args.nprocs} ranks, {args.dtype}, op {args.op}, "
        f"{human_bytes(spec['sizes'][0])} .. {human_bytes(spec['sizes'][-1])} x{args.factor}, "
        f"transports {','.join(spec['transports'])}; time: median of up to {args.reps} "
        "repetitions of the slowest rank"
    )
    for line in notes:
        print(line)
    table = Table(args.nprocs)
    records: list[dict] = []
    status = 0
    try:
        records = run_job(args.nprocs, spec, args.timeout, table.add)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"pycollective bench: {exc}", file=sys.stderr)
        status = 1
    lines, wrong = footer(records)
    for line in lines:
        print(line)
    if wrong:
        print(f"pycollective bench: {wrong} wrong elements in the checked calls", file=sys.stderr)
        status = status or 1
    for line in summary(records):
        print(line)
    for line in auto_vs_best(records):
        print(line)
    if args.json:
        with _files.replacing(args.json) as f:
            json.dump({"nprocs": args.nprocs, "spec": spec, "records": records}, f, indent=1)
    if args.plot and any("error" not in r and r["collective"] != "barrier" for r in records):
        plot(records, args.plot)
        print(f"# plot: {args.plot}")
    return status
