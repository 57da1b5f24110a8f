"""`pycollective simulate`: predicted times of collectives at any scale, from the cost model.

Nothing runs on a network: every algorithm's schedules go through the alpha-beta-gamma
model (schedule/cost.py; large worlds are priced from closed forms or a sample of ranks,
so 4,096 ranks take about a second). With --ranks-per-host or --hosts the ranks sit on
hosts, and all_reduce is priced with the two-level model of schedule/topology.py: a flat
algorithm is limited by each host's network link, and "hierarchical" is available.

    pycollective simulate --algorithm ring,halving_doubling,hierarchical \\
        --ranks 8,64,1024 --bytes 64MiB --alpha 20us --beta 10Gbit/s --ranks-per-host 8

Units: times 20us, 1.5ms, 2e-5 (seconds); beta and gamma as a rate (10Gbit/s, 1.25GB/s,
100Mbit/s, 8GiB/s) or as time per byte (0.8ns/B, 8e-10); sizes 64MiB, 1GiB (binary),
64MB (decimal), 4096 (bytes). Sizes are the larger buffer of a call, as in nccl-tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys

from .._units import human_bytes, size_arg
from ..schedule import ALGORITHMS
from ..schedule import cost as _cost
from ..schedule import parameter_server as _ps
from ..schedule import topology as _topo

HIERARCHICAL = _topo.HIERARCHICAL
_DTYPES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int32": 4,
    "int64": 8,
}
# Per-rank element count = bytes / itemsize, divided by p for these (count is per block).
_PER_BLOCK = {"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests' bus bandwidth factor (as in `pycollective bench`)."""
    if p <= 1:
        return 0.0 if collective in ("all_reduce", "all_gather", "reduce_scatter") else 1.0
    if collective == "all_reduce":
        return 2 * (p - 1) / p
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


# ---------------------------------------------------------------------- units

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_SI = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_time(text: str) -> float:
    """'20us', '1.5ms', '2e-5' (seconds) -> seconds."""
    m = re.fullmatch(_NUM + r"\s*(s|ms|us|µs|ns)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (examples: 20us, 1.5ms, 2e-5 for seconds)"
        )
    return float(m.group(1)) * _TIME[m.group(2) or "s"]


def parse_per_byte(text: str) -> float:
    """A link or reduction speed -> seconds per byte: '10Gbit/s', '1.25GB/s', '8GiB/s',
    '10Gbps', '0.8ns/B', '8e-10' (seconds per byte)."""
    t = text.strip()
    m = re.fullmatch(_NUM + r"\s*(s|ms|us|µs|ns)?(?:/B)?", t)
    if m and (m.group(2) or "/" not in t or t.endswith("/B")):
        return float(m.group(1)) * _TIME[m.group(2) or "s"]
    m = re.fullmatch(_NUM + r"\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?(bit/s|b/s|bps|B/s|Bps)", t)
    if not m:
        raise argparse.ArgumentTypeError(
            f"not a rate: {text!r} (examples: 10Gbit/s, 1.25GB/s, 8GiB/s, 0.8ns/B)"
        )
    prefix = m.group(2) or ""
    scale = _BIN[prefix] if prefix in _BIN else _SI[prefix]
    per_second = float(m.group(1)) * scale
    if m.group(3) in ("bit/s", "b/s", "bps"):
        per_second /= 8
    if per_second <= 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0: {text!r}")
    return 1.0 / per_second


# Sizes: one rule for every command (pycollective._units: K, KB and KiB all mean 1024).
parse_bytes = size_arg


def _list_of(parse, what: str):
    def run(text: str) -> list:
        items = [s for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list of {what}")
        return [parse(s) for s in items]

    return run


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def human_time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-6:.3g} us"


def human_rate(per_byte: float) -> str:
    if per_byte == 0:
        return "free"
    return f"{8 / per_byte / 1e9:.3g} Gbit/s ({per_byte * 1e9:.3g} ns/B)"


# ---------------------------------------------------------------------- the predictions


@dataclasses.dataclass(frozen=True)
class Row:
    collective: str
    algorithm: str
    ranks: int
    hosts: int
    ranks_per_host: int
    nbytes: int
    seconds: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    detail: str = ""
    servers: int = 0  # parameter-server rows: S servers for `ranks` workers


def predict_ps_row(args: argparse.Namespace, workers: int, servers: int, nbytes: int) -> Row:
    """One synchronous parameter-server step (schedule/parameter_server.py): `workers`
    push nbytes of gradients to `servers` and pull the sums back, one rank per host."""
    itemsize = _DTYPES[args.dtype]
    params = _cost.CostParams(
        alpha=args.alpha, beta=args.beta, gamma=args.gamma, overhead=args.overhead
    )
    scheds = _ps.sample(workers, servers, nbytes // itemsize)
    seconds = _cost.schedule_cost(scheds, itemsize, params)
    algbw = nbytes / seconds / 1e9 if seconds > 0 else math.inf
    busbw = algbw * busbw_factor("all_reduce", workers)
    return Row(
        "all_reduce", _ps.ALGORITHM, workers, workers + servers, 1, nbytes, seconds, algbw,
        busbw, "", servers,
    )  # fmt: skip


def label(r: Row) -> str:
    """The row's algorithm, with the server count for a parameter-server row."""
    return f"{r.algorithm} x{r.servers}" if r.servers else r.algorithm


def predict_row(args: argparse.Namespace, algorithm: str, p: int, nbytes: int) -> Row:
    itemsize = _DTYPES[args.dtype]
    collective = args.collective
    count = nbytes // itemsize
    if collective in _PER_BLOCK:
        count //= p
    if collective == "barrier":
        count = 0
    inter = _cost.CostParams(
        alpha=args.alpha, beta=args.beta, gamma=args.gamma, overhead=args.overhead
    )
    hosts, per_host = layout_of(args, p)
    detail = ""
    if per_host is None:
        seconds = _cost.predict(collective, algorithm, p, count, itemsize, inter)
        hosts, per_host = p, 1
    else:
        intra = _cost.CostParams(alpha=args.intra_alpha, beta=args.intra_beta, gamma=args.gamma)
        topo = _topo.Topology(hosts, per_host, intra, inter)
        if algorithm == HIERARCHICAL:
            h = _topo.hierarchical(count, itemsize, topo)
            seconds = h.total
            detail = (
                f"intra {human_time(h.reduce_scatter + h.all_gather)}, "
                f"across {human_time(h.cross)} ({h.cross_algorithm})"
            )
        else:
            prof = _topo.flat_profile(collective, algorithm, hosts, per_host, count)
            seconds = _topo.price_flat(prof, itemsize, topo)
    algbw = nbytes / seconds / 1e9 if seconds > 0 else math.inf
    busbw = algbw * busbw_factor(collective, p)
    return Row(collective, algorithm, p, hosts, per_host, nbytes, seconds, algbw, busbw, detail)


def layout_of(args: argparse.Namespace, p: int) -> tuple[int, int | None]:
    """(hosts, ranks per host), or (p, None) for the one-level model."""
    if args.ranks_per_host is not None:
        r = args.ranks_per_host
        if p % r:
            raise ValueError(f"{p} ranks do not fill hosts of --ranks-per-host {r}")
        return p // r, r
    if args.hosts is not None:
        h = args.hosts
        if p % h:
            raise ValueError(f"{p} ranks do not split evenly over --hosts {h}")
        return h, p // h
    return p, None


def check(args: argparse.Namespace) -> None:
    """Cross-argument checks, with messages that say what is wrong."""
    known = ALGORITHMS[args.collective]
    allowed = (*known, HIERARCHICAL) if args.collective == "all_reduce" else known
    for a in args.algorithm:
        if a not in allowed:
            raise ValueError(
                f"unknown algorithm {a!r} for {args.collective}; choose from {', '.join(allowed)}"
            )
    if HIERARCHICAL in args.algorithm and args.ranks_per_host is None and args.hosts is None:
        raise ValueError("hierarchical needs a layout: give --ranks-per-host or --hosts")
    for p in args.ranks:
        layout_of(args, p)
    if args.servers:
        if args.collective != "all_reduce":
            raise ValueError("--servers prices a parameter-server step: --collective all_reduce")
        if args.ranks_per_host is not None or args.hosts is not None:
            raise ValueError(
                "--servers prices one worker per host (and one host per server): "
                "not with --ranks-per-host or --hosts"
            )


# ---------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    collectives = sorted(ALGORITHMS)
    parser.add_argument("--collective", default="all_reduce", choices=collectives)
    parser.add_argument(
        "--algorithm",
        "-a",
        type=_list_of(str.strip, "algorithms"),
        default=None,
        help="comma-separated (default: every algorithm of the collective, and hierarchical "
        "for all_reduce when a layout is given)",
    )
    parser.add_argument(
        "--ranks",
        "-n",
        type=_list_of(_positive_int, "rank counts"),
        default=[8, 64, 1024],
        help="comma-separated world sizes",
    )
    parser.add_argument(
        "--bytes",
        "-b",
        type=_list_of(parse_bytes, "sizes"),
        default=[64 << 20],
        help="comma-separated sizes (default 64MiB)",
    )
    parser.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    parser.add_argument(
        "--alpha",
        type=parse_time,
        default=parse_time("20us"),
        help="latency per round between hosts (default 20us)",
    )
    parser.add_argument(
        "--beta",
        type=parse_per_byte,
        default=parse_per_byte("10Gbit/s"),
        help="link speed between hosts, per host (default 10Gbit/s)",
    )
    parser.add_argument(
        "--gamma",
        type=parse_per_byte,
        default=parse_per_byte("0.12ns/B"),
        help="reduction speed (default 0.12ns/B, numpy add on one core)",
    )
    parser.add_argument(
        "--overhead",
        type=parse_time,
        default=0.0,
        help="cost of each message beyond the first a rank sends (or receives) in one round "
        "(default 0; pycollective's TCP: about 100us)",
    )
    parser.add_argument(
        "--servers",
        type=_list_of(_positive_int, "server counts"),
        default=[],
        help="comma-separated server counts: also price a synchronous parameter-server step "
        "(--ranks workers push to and pull from S servers, one rank per host)",
    )
    parser.add_argument(
        "--intra-alpha",
        type=parse_time,
        default=parse_time("2us"),
        help="latency per round inside a host (default 2us)",
    )
    parser.add_argument(
        "--intra-beta",
        type=parse_per_byte,
        default=parse_per_byte("10GB/s"),
        help="copy speed inside a host (default 10GB/s)",
    )
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument("--ranks-per-host", "-r", type=_positive_int, default=None)
    layout.add_argument("--hosts", type=_positive_int, default=None)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the rows as JSON")
    out.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="one row per size and world size, a column per algorithm: time (busbw GB/s)",
    )


def main(args: argparse.Namespace) -> int:
    if args.algorithm is None:
        args.algorithm = list(ALGORITHMS[args.collective])
        if args.collective == "all_reduce" and (args.ranks_per_host or args.hosts):
            args.algorithm.append(HIERARCHICAL)
    try:
        check(args)
    except ValueError as exc:
        print(f"pycollective simulate: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    for nb in args.bytes:
        for p in args.ranks:
            rows += [predict_row(args, a, p, nb) for a in args.algorithm]
            rows += [predict_ps_row(args, p, s, nb) for s in args.servers]
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
        return 0
    print(describe(args))
    print((wide_table if args.wide else table)(rows, markdown=args.markdown))
    return 0


def describe(args: argparse.Namespace) -> str:
    text = (
        f"{args.collective}, {args.dtype}; between hosts alpha {human_time(args.alpha)}, "
        f"beta {human_rate(args.beta)}; gamma {human_rate(args.gamma)}"
    )
    if args.ranks_per_host or args.hosts:
        lay = (
            f"{args.ranks_per_host} ranks per host"
            if args.ranks_per_host
            else f"{args.hosts} hosts"
        )
        text += (
            f"; {lay}, inside a host alpha {human_time(args.intra_alpha)}, "
            f"beta {human_rate(args.intra_beta)}"
        )
    else:
        text += "; one rank per host"
    return text


def table(rows: list[Row], markdown: bool = False) -> str:
    head = [
        "size",
        "ranks",
        "hosts x per host",
        "algorithm",
        "time",
        "algbw GB/s",
        "busbw GB/s",
        "best",
    ]
    best: dict[tuple[int, int], float] = {}
    for r in rows:
        key = (r.nbytes, r.ranks)
        best[key] = min(best.get(key, math.inf), r.seconds)
    body = [
        [
            human_bytes(r.nbytes),
            str(r.ranks),
            f"{r.hosts} x {r.ranks_per_host}",
            label(r) + (f" [{r.detail}]" if r.detail and not markdown else ""),
            human_time(r.seconds),
            f"{r.algbw:.3g}",
            f"{r.busbw:.3g}",
            "*" if r.seconds == best[(r.nbytes, r.ranks)] else "",
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row).rstrip() for row in [head, *body])


def wide_table(rows: list[Row], markdown: bool = False) -> str:
    """Algorithms side by side: `time (busbw)` per cell, the fastest marked with *."""
    algos = list(dict.fromkeys(label(r) for r in rows))
    cells: dict[tuple[int, int], dict[str, Row]] = {}
    for r in rows:
        cells.setdefault((r.nbytes, r.ranks), {})[label(r)] = r
    head = ["size", "ranks", "hosts x per host", *algos]
    body = []
    for (nbytes, ranks), by_algo in cells.items():
        fastest = min(x.seconds for x in by_algo.values())
        any_row = next(iter(by_algo.values()))
        line = [human_bytes(nbytes), str(ranks), f"{any_row.hosts} x {any_row.ranks_per_host}"]
        for a in algos:
            x = by_algo[a]
            star = " *" if x.seconds == fastest else ""
            line.append(f"{human_time(x.seconds)} ({x.busbw:.3g}){star}")
        body.append(line)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row).rstrip() for row in [head, *body])
