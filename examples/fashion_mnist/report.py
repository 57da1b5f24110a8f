"""What `make demo` concludes, computed from its runs: the table, the rule, the two plots.

Pure functions of the results dictionary the demo's modes fill (results.json), so the
tests can feed them made-up measurements and check that every column moves with its
inputs. Nothing here imports torch.

Results, by mode (demo.py):
  accuracy:   {"model", "runs": {"single"|"ring"|"ring_k": train.py's report}}
  contention: {"compute": {"batch", "seconds"}, "accumulate", contention.measure()'s dict}
  predict:    {"params": {...}, "measured": [simulate rows], "grid": {"1"|"10"|"100": [rows]}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The designs compared, in table order: key -> label (W workers, S servers).
DESIGNS = {
    "ring": "ring all-reduce",
    "ring_k": "ring all-reduce, accumulate {k}",
    "ps1": "1 parameter server",
    "psW": "W parameter servers",
}
COLORS = {"single": "C7", "ring": "C0", "ring_k": "C9", "ps1": "C3", "psW": "C1"}


def servers_of(design: str, workers: int) -> int:
    return {"ring": 0, "ring_k": 0, "ps1": 1, "psW": workers}[design]


def label(design: str, k: int) -> str:
    return DESIGNS[design].format(k=k)


@dataclass
class Row:
    design: str
    label: str
    workers: int
    servers: int
    comm_s: float | None  # measured communication per update (slowest worker, median)
    predicted_s: float | None  # the simulator's, for the measured link
    busiest_bytes: float | None  # per update, the busiest host's link (max of in and out)
    samples_per_update: int
    compute_s: float  # per update: k x the measured compute of one micro-batch
    accuracy: float | None = None  # test accuracy of the training run, if one was made
    trained_bytes_per_sample: float | None = None  # sent per sample in that run (counters)
    shaped: bool = True  # measured on shaped links (the predictions' link), not loopback

    @property
    def error(self) -> float | None:
        if self.comm_s is None or self.predicted_s is None or not self.comm_s or not self.shaped:
            return None
        return (self.predicted_s - self.comm_s) / self.comm_s

    @property
    def step_s(self) -> float:
        return self.compute_s + (self.comm_s if self.comm_s is not None else self.predicted_s or 0)

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_update / self.step_s

    @property
    def bytes_per_sample(self) -> float | None:
        if self.busiest_bytes is None:
            return None
        return self.busiest_bytes / self.samples_per_update


def predicted(rows: list[dict], workers: int, servers: int) -> float | None:
    """The simulator's seconds for ring (servers 0) or a parameter server with `servers`."""
    for r in rows:
        if r["ranks"] == workers and r.get("servers", 0) == servers:
            if servers or r["algorithm"] == "ring":
                return r["seconds"]
    return None


def _fixed(rows: list[dict], workers: int, servers: int) -> float | None:
    """A parameter server with a fixed number of servers (not the S = W rows)."""
    for r in rows:
        if r["ranks"] == workers and r.get("servers") == servers and not r.get("equal"):
            return r["seconds"]
    return None


def table_rows(results: dict[str, Any]) -> list[Row]:
    """One row per design and measured worker count (plus 1 process), every number taken
    from the runs: contention's times and link bytes, the measured compute per micro-batch,
    the simulator's predictions, the training runs' accuracy and bytes."""
    cont = results.get("contention")
    acc = (results.get("accuracy") or {}).get("runs", {})
    pred = (results.get("predict") or {}).get("measured", [])
    if not cont:
        return []
    b = cont["compute"]["batch"]
    compute = cont["compute"]["seconds"]
    k = cont["accumulate"]
    shaped = cont.get("network") == "namespaces"
    rows = [
        Row("single", "1 process", 1, 0, 0.0, None, 0.0, b, compute,
            accuracy=_get(acc, "single", "test_accuracy"),
            trained_bytes_per_sample=_get(acc, "single", "bytes_sent_per_sample"))
    ]  # fmt: skip
    for design in DESIGNS:
        for w in sorted(int(x) for x in cont["runs"]):
            run = cont["runs"][str(w)].get("ring" if design == "ring_k" else design)
            if run is None:
                continue
            s = servers_of(design, w)
            steps = k if design == "ring_k" else 1
            trained = acc.get(design) if acc.get(design, {}).get("workers") == w else None
            rows.append(Row(
                design, label(design, k), w, s, run["seconds"], predicted(pred, w, s),
                run.get("busiest_bytes"), w * b * steps, steps * compute,
                accuracy=trained["test_accuracy"] if trained else None,
                trained_bytes_per_sample=trained["bytes_sent_per_sample"] if trained else None,
                shaped=shaped,
            ))  # fmt: skip
    return rows


def _get(d: dict, key: str, field: str) -> Any:
    return d.get(key, {}).get(field)


def render_table(rows: list[Row], markdown: bool = False) -> str:
    head = ["design", "W", "S", "comm ms", "simulator", "error", "busiest link", "per sample",
            "compute ms", "step ms", "samples/s", "test acc", "sent/sample"]  # fmt: skip
    body = []
    for r in rows:
        body.append([
            r.label, str(r.workers), str(r.servers) if r.servers else "-",
            _ms(r.comm_s), _ms(r.predicted_s),
            f"{r.error:+.0%}" if r.error is not None else "-",
            human(r.busiest_bytes), human(r.bytes_per_sample),
            _ms(r.compute_s), _ms(r.step_s), f"{r.samples_per_s:.0f}",
            f"{100 * r.accuracy:.2f}%" if r.accuracy is not None else "",
            human(r.trained_bytes_per_sample) if r.trained_bytes_per_sample is not None else "",
        ])  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = [(lambda c, w: c.ljust(w)) if i == 0 else (lambda c, w: c.rjust(w)) for i in
           range(len(head))]  # fmt: skip
    lines = ["  ".join(f(c, w) for f, c, w in zip(fmt, row, widths, strict=True)).rstrip()
             for row in [head, *body]]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1000 * s:.0f}" if s >= 0.0095 else f"{1000 * s:.1f}"


def human(n: float | None) -> str:
    """Decimal units, as link rates are quoted: 30.0 MB, 469 kB."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


# ---------------------------------------------------------------------- the rule


def _bands(ws: list[int], wins: set[int]) -> list[list[int]]:
    """Runs of consecutive grid points in `wins`, as [first, last]."""
    bands: list[list[int]] = []
    for i, w in enumerate(ws):
        if w not in wins:
            continue
        if bands and i and ws[i - 1] == bands[-1][1]:
            bands[-1][1] = w
        else:
            bands.append([w, w])
    return bands


def crossovers(grid: list[dict], servers: int | None) -> dict[str, Any]:
    """Where a parameter server beats ring all-reduce, from the simulator's rows: with
    `servers` servers at every worker count of the grid, or (servers=None) with as many
    servers as workers. The bands of W it wins in, and its largest lead (fraction)."""
    ring = {r["ranks"]: r["seconds"] for r in grid if r["algorithm"] == "ring"}
    if servers is None:
        ps = {r["ranks"]: r["seconds"] for r in grid if r.get("equal")}
    else:
        ps = {r["ranks"]: r["seconds"] for r in grid
              if r.get("servers") == servers and not r.get("equal")}  # fmt: skip
    ws = sorted(set(ring) & set(ps))
    wins = {w for w in ws if ps[w] < ring[w]}
    lead = max((1 - ps[w] / ring[w] for w in wins), default=0.0)
    return {"servers": servers, "grid": [ws[0], ws[-1]] if ws else None,
            "ps_wins": _bands(ws, wins), "lead": lead}  # fmt: skip


def rule(predict: dict[str, Any]) -> list[str]:
    """The crossover per link speed, read off the simulator's grid (never typed in): 'with
    S servers, ring all-reduce is faster once W > ...'."""
    out = []
    for rate, rows in predict.get("grid", {}).items():
        fixed = sorted({r["servers"] for r in rows if r.get("servers") and not r.get("equal")})
        always, parts = [], []
        lo = hi = None
        for s in fixed:
            c = crossovers(rows, s)
            if c["grid"] is None:
                continue
            lo, hi = c["grid"]
            if not c["ps_wins"]:
                always.append(s)
                continue
            first, last = c["ps_wins"][0][0], c["ps_wins"][-1][1]
            lead = f"by up to {c['lead']:.0%}" if c["lead"] >= 0.01 else "by under 1%"
            if last == hi:
                parts.append(f"{s} servers are faster from W = {first} to at least {hi} ({lead})")
            else:
                parts.append(f"with {s} servers, ring all-reduce is faster once W > {last} "
                             f"(the servers win at W = {first}-{last}, {lead})")  # fmt: skip
        text = f"{rate} Gbit/s: "
        if always:
            text += (f"ring all-reduce is faster than {_servers(always, fixed)} at every W "
                     f"from {lo} to {hi}")  # fmt: skip
        text += ("; " if always and parts else "") + "; ".join(parts)
        eq = crossovers(rows, None)
        if eq["grid"]:
            if not eq["ps_wins"]:
                text += (f". As many servers as workers never catch up (W = "
                         f"{eq['grid'][0]}-{eq['grid'][1]})")  # fmt: skip
            else:
                first = eq["ps_wins"][0][0]
                text += (f". As many servers as workers (W more hosts) win from W = {first} "
                         f"(by up to {eq['lead']:.0%})")  # fmt: skip
        out.append(text + ".")
    return out


def short_rule(predict: dict[str, Any]) -> list[str]:
    """The rule in one line per link speed, for captions."""
    out = []
    for rate, rows in predict.get("grid", {}).items():
        fixed = sorted({r["servers"] for r in rows if r.get("servers") and not r.get("equal")})
        cs = [crossovers(rows, s) for s in fixed]
        cs = [c for c in cs if c["grid"]]
        if not cs:
            continue
        hi = cs[0]["grid"][1]
        always = [c["servers"] for c in cs if not c["ps_wins"]]
        once = [c for c in cs if c["ps_wins"] and c["ps_wins"][-1][1] < hi]
        edge = [c for c in cs if c["ps_wins"] and c["ps_wins"][-1][1] == hi]
        bits = []
        if always:
            bits.append(f"ring all-reduce beats {_servers(always, fixed)} at every W <= {hi}")
        if once:
            ss = "/".join(str(c["servers"]) for c in once)
            ws = "/".join(str(c["ps_wins"][-1][1]) for c in once)
            bits.append(f"with {ss} servers it is faster once W > {ws}")
        for c in edge:
            bits.append(f"{c['servers']} servers win from W = {c['ps_wins'][0][0]} on")
        out.append(f"{rate} Gbit/s: " + "; ".join(bits) + ".")
    return out


def _servers(some: list[int], tried: list[int]) -> str:
    """'1 server', '1 to 32 servers' (every count tried up to 32) or '1, 4 or 8 servers'."""
    if some == [1]:
        return "1 server"
    if some == tried[: len(some)]:
        return f"{some[0]} to {some[-1]} servers"
    return f"{_list(some)} servers"


def _list(xs: list[int]) -> str:
    if len(xs) == 1:
        return str(xs[0])
    return ", ".join(map(str, xs[:-1])) + f" or {xs[-1]}"


# ---------------------------------------------------------------------- the plots


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_steps(results: dict[str, Any], path: Path) -> Path:
    """Step time, compute + communication stacked, against workers, per design: measured
    (namespace hosts, 1 Gbit/s) top left, the simulator's 2-256 workers at 1, 10 and 100
    Gbit/s in the other panels."""
    plt = _matplotlib()
    rows = table_rows(results)
    cont = results["contention"]
    k = cont["accumulate"]
    compute = cont["compute"]["seconds"]
    b = cont["compute"]["batch"]
    grid = results.get("predict", {}).get("grid", {})
    fig, axs = plt.subplots(2, 2, figsize=(14, 10))
    axes = list(axs.flat)
    ax = axes[0]
    designs = [d for d in DESIGNS if any(r.design == d for r in rows)]
    ws = sorted({r.workers for r in rows if r.design != "single"})
    width = 0.8 / max(1, len(designs))
    shaped = cont.get("network") == "namespaces"
    net = "namespace hosts, 1 Gbit/s links" if shaped else "loopback TCP, one host (no root)"
    ylabel = f"ms per step of {b} samples per worker"
    for i, d in enumerate(designs):
        xs, comp, comm, pred = [], [], [], []
        for r in rows:
            if r.design == d:
                per = k if d == "ring_k" else 1  # per micro-batch of b samples per worker
                xs.append(ws.index(r.workers) + (i - (len(designs) - 1) / 2) * width)
                comp.append(1000 * r.compute_s / per)
                comm.append(1000 * (r.comm_s or 0) / per)
                pred.append(None if r.predicted_s is None else 1000 * r.predicted_s / per)
        ax.bar(xs, comp, width, color=COLORS[d], alpha=0.3, edgecolor=COLORS[d])
        ax.bar(xs, comm, width, bottom=comp, color=COLORS[d], label=label(d, k))
        pts = [(x, c + p) for x, c, p in zip(xs, comp, pred, strict=True) if p is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "_", color="black", markersize=14,
                    markeredgewidth=2)  # fmt: skip
    ax.set_xticks(range(len(ws)), [f"{w} workers" for w in ws])
    ax.set_xlabel("workers W (one host each; servers on hosts of their own)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Measured: {net}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)

    for ax, (rate, rows_r) in zip(axes[1:], grid.items(), strict=False):
        wgrid = sorted({r["ranks"] for r in rows_r})
        ax.axhspan(0, 1000 * compute, color="grey", alpha=0.2)
        for d in designs:
            pts = []
            for w in wgrid:
                t = predicted(rows_r, w, servers_of(d, w))
                if t is not None:
                    pts.append((w, 1000 * (compute + t / (k if d == "ring_k" else 1))))
            if pts:
                ax.plot(*zip(*pts, strict=True), "-", color=COLORS[d], linewidth=1.8)
        for s, style in ((16, ":"), (64, "--")):  # fixed server counts, as in the rule
            pts = [(w, 1000 * (compute + t)) for w in wgrid
                   if (t := _fixed(rows_r, w, s)) is not None]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color="C4", linewidth=1.4)
        if rate == "1" and shaped:
            for r in rows:
                if r.design != "single":
                    per = k if r.design == "ring_k" else 1
                    y = 1000 * (compute + (r.comm_s or 0) / per)
                    ax.plot(r.workers, y, "o", color=COLORS[r.design], markersize=5,
                            markeredgecolor="black")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(2, max(wgrid))
        ax.set_ylim(0.7 * 1000 * compute, None)
        ticks = [w for w in (2, 4, 8, 16, 32, 64, 128, 256) if w <= max(wgrid)]
        ax.set_xticks(ticks, [str(w) for w in ticks])
        ax.set_xlabel("workers W ('W parameter servers': S = W)")
        ax.set_ylabel(ylabel + " (log)")
        ax.set_title(f"Predicted (simulator): {rate} Gbit/s links", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = axes[0].get_legend_handles_labels()
    keys = [
        (Patch(color="grey", alpha=0.3), "compute, measured (pale bar part; grey band)"),
        (Line2D([], [], color="black", marker="_", ls="", markersize=12, markeredgewidth=2),
         "compute + the simulator's communication"),
        (Line2D([], [], color="grey", marker="o", ls="", markeredgecolor="black"),
         "measured (top left), on the 1 Gbit/s prediction"),
        (Line2D([], [], color="grey"), "predicted: compute + communication"),
        (Line2D([], [], color="C4", ls=":"), "16 parameter servers"),
        (Line2D([], [], color="C4", ls="--"), "64 parameter servers"),
    ]  # fmt: skip
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9,
               frameon=False)  # fmt: skip
    fig.legend(*zip(*keys, strict=True), loc="upper center", bbox_to_anchor=(0.5, 0.975),
               ncol=3, fontsize=8.5, frameon=False)  # fmt: skip
    fig.text(0.01, 0.005, steps_caption(results), fontsize=9, va="bottom")
    fig.tight_layout(rect=(0, 0.085, 1, 0.93))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def steps_caption(results: dict[str, Any]) -> str:
    """What the step-time figure shows, in numbers from the runs."""
    rows = table_rows(results)
    by = {(r.design, r.workers): r for r in rows}
    ws = sorted({r.workers for r in rows if r.design != "single"})
    w = ws[-1]
    ring, ps1, psw = by.get(("ring", w)), by.get(("ps1", w)), by.get(("psW", w))
    parts = []
    if ring and ps1 and psw and ring.comm_s:
        errs = [abs(r.error) for r in rows if r.error is not None]
        worst = f"; the simulator is within {max(errs):.0%} of every measured time" if errs else ""
        parts.append(
            f"Measured at {w} workers: ring all-reduce communicates {_ms(ring.comm_s)} ms per "
            f"step, one parameter server {_ms(ps1.comm_s)} ms ({ps1.comm_s / ring.comm_s:.1f}x; "
            f"its link carries {human(ps1.busiest_bytes)} each way), {w} servers "
            f"{_ms(psw.comm_s)} ms ({psw.comm_s / ring.comm_s:.1f}x, on {w} more hosts){worst}."
        )
    acc = by.get(("ring_k", w))
    if ring and acc:
        parts[-1] += (
            f" Accumulating {acc.samples_per_update // ring.samples_per_update} micro-batches "
            f"per all-reduce: {ring.samples_per_s:.0f} -> {acc.samples_per_s:.0f} samples/s."
        )
    parts += short_rule(results.get("predict", {}))
    return "\n".join(wrap(p, 175) for p in parts)


def wrap(text: str, width: int) -> str:
    words, lines, cur = text.split(), [], ""
    for word in words:
        if len(cur) + len(word) + 1 > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    return "\n".join([*lines, cur])


def plot_accuracy(
    results: dict[str, Any], path: Path, extra_curves: list[dict] | None = None
) -> Path:
    """Test accuracy against samples seen, one curve per training run (the probe of test
    images), the whole test set's accuracy at the end marked apart."""
    plt = _matplotlib()
    acc = results["accuracy"]
    runs = acc["runs"]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    names = {
        "single": "1 process",
        "ring": "{w} workers, ring all-reduce (DDP)",
        "ring_k": "{w} workers, ring, accumulate {k} (one all-reduce per {k} micro-batches)",
    }
    probe = None
    for key, r in runs.items():
        xs = [p["samples"] for p in r["curve"]]
        ys = [100 * p["acc"] for p in r["curve"]]
        name = names.get(key, key).format(w=r["workers"], k=r["accumulate"])
        name += f", batch {r['global_batch']} per update"
        color = COLORS.get(key)
        style = {"single": dict(linewidth=5, alpha=0.45)}.get(key, dict(linewidth=1.5))
        ax.plot(xs, ys, ".-" if key != "single" else "-", color=color, label=name, **style)
        ax.plot([r["samples"]], [100 * r["test_accuracy"]], "D", color=color, markersize=7,
                markeredgecolor="black")  # fmt: skip
        probe = r["probe_images"]
    for c in extra_curves or []:
        ax.plot(c["samples"], [100 * a for a in c["acc"]], ".-", label=c["label"])
    ax.plot([], [], "D", color="white", markeredgecolor="black",
            label="all 10,000 test images, after the last update")  # fmt: skip
    ax.set_xlabel("training samples seen (all workers together)")
    ax.set_ylabel(f"test accuracy (%; curve: first {probe:,} test images)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Fashion-MNIST, {acc['model_label']}: measured, same samples in the same order",
                 fontsize=10)  # fmt: skip
    fig.text(0.01, 0.01, wrap(accuracy_caption(results), 130), fontsize=8.5, va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_caption(results: dict[str, Any]) -> str:
    runs = results["accuracy"]["runs"]
    single, ring, ring_k = runs.get("single"), runs.get("ring"), runs.get("ring_k")
    parts = []
    if single and ring:
        diff = 100 * (ring["test_accuracy"] - single["test_accuracy"])
        n = single["test_images"]
        p = single["test_accuracy"]
        se = 100 * math.sqrt(p * (1 - p) / n)
        verdict = "equal within noise" if abs(diff) <= 2 * se else "NOT equal within noise"
        parts.append(
            f"One process reaches {100 * single['test_accuracy']:.2f}% and {ring['workers']} "
            f"workers with ring all-reduce {100 * ring['test_accuracy']:.2f}% after the same "
            f"{ring['samples']:,} samples ({diff:+.2f} points; the test set's standard error is "
            f"{se:.2f}): {verdict}."
        )
    if ring_k and ring:
        ratio = ring["bytes_sent_per_sample"] / max(ring_k["bytes_sent_per_sample"], 1e-9)
        parts.append(
            f"Accumulating {ring_k['accumulate']} micro-batches per all-reduce sends "
            f"{ratio:.2f}x fewer bytes per sample ({human(ring_k['bytes_sent_per_sample'])} vs "
            f"{human(ring['bytes_sent_per_sample'])}, counted) and makes {ring_k['accumulate']}x "
            f"fewer updates: {100 * ring_k['test_accuracy']:.2f}% at the same samples."
        )
    return " ".join(parts)
