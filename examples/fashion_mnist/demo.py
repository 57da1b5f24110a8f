"""`make demo`: when does worker-only ring all-reduce replace the parameter server? The
book's Fashion-MNIST model (7.5M parameters, 30.0 MB), measured and extrapolated.

    python examples/fashion_mnist/demo.py [--modes accuracy,contention,predict] [--quick]

Modes (run in this order; each adds its part of results.json, and the report uses what
is there):

  accuracy    one process against 2 workers with ring all-reduce (torch DDP on the
              pycollective backend), and 2 workers accumulating --accumulate micro-batches
              per all-reduce: the same samples in the same order; test accuracy, the curve,
              bytes sent per sample (counted by the backend)
  contention  the compute of one step (one process, one core), then the communication of
              one step of this model's size with 2, 3 and 4 workers on network-namespace
              hosts with 1 Gbit/s links (root; loopback TCP without): ring all-reduce, one
              parameter server, W servers; time and the bytes on the busiest link
  predict     `pycollective simulate` for the measured points (error) and for 8-256 workers
              at 1, 10 and 100 Gbit/s: the crossover, stated as a rule
  elastic     (not in the default list: `--modes elastic`, or `make demo-elastic`) 4 workers
              under `pycollective run --elastic 2:4`: one is SIGKILLed a third of the way
              in, the survivors go on without a restart, a replacement joins; the loss curve
              (elastic_loss.png), the recovery and replacement times, the members' digests

Then the table, out/fashion_mnist/step_times.png and accuracy.png, and results.json. A
mode is one registered function (see `mode`); another one adds a section to the results,
and rows or curves to the report through its own hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import contention  # noqa: E402
import data  # noqa: E402
import elastic_report  # noqa: E402
import report  # noqa: E402

# The house's cost parameters for pycollective over TCP, as `make multihost` uses them
# (benchmarks/multihost.py): latency per round, per extra message, reduction per byte.
sys.path.insert(0, str(REPO / "benchmarks"))
from multihost import ALPHA, GAMMA, OVERHEAD  # noqa: E402

PARAMS = {"small": 93_322, "large": 7_507_850}  # models.py's parameter counts (tested)
LABELS = {"small": "small CNN (93,322 parameters, 0.37 MB)",
          "large": "30 MB model (7,507,850 parameters)"}  # fmt: skip
# The extrapolation's links, as TCP goodput: a 1500-byte frame carries 1448 bytes of
# payload in 1514 on the wire (what `make multihost` measures on its 1 Gbit/s links).
RATES = {"1": 1e9 * 1448 / 1514, "10": 1e10 * 1448 / 1514, "100": 1e11 * 1448 / 1514}


@dataclass
class Context:
    args: argparse.Namespace
    out: Path
    results: dict[str, Any] = field(default_factory=dict)

    def log(self, text: str) -> None:
        print(text, flush=True)


@dataclass(frozen=True)
class Mode:
    """One part of the demo. `run` returns its section of results.json (it may read the
    sections of the modes before it); `text` adds lines to the printed report and `curves`
    curves to the accuracy plot ({"label", "samples": [...], "acc": [...]}), both from the
    whole results, so a new mode (e.g. elastic training) needs no change elsewhere."""

    name: str
    summary: str
    run: Callable[[Context], dict[str, Any]]
    text: Callable[[dict[str, Any]], list[str]] | None = None
    curves: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None


MODES: dict[str, Mode] = {}


def mode(
    name: str,
    summary: str,
    text: Callable[[dict[str, Any]], list[str]] | None = None,
    curves: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
) -> Callable:
    """Register a mode (in the order the demo runs them): a function of the Context
    returning its section of the results; optional report hooks (see Mode)."""

    def register(fn: Callable[[Context], dict[str, Any]]) -> Callable:
        MODES[name] = Mode(name, summary, fn, text, curves)
        return fn

    return register


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # TCP and the ring: bytes on the wire are what a network would carry, and the
    # algorithm is the one the comparison is about (auto may pick another)
    env.update(PYCOLLECTIVE_TRANSPORT="tcp", PYCOLLECTIVE_ALL_REDUCE_ALGORITHM="ring",
               OMP_NUM_THREADS="1", **extra)  # fmt: skip
    return env


def _train(ctx: Context, name: str, workers: int, extra: list[str]) -> subprocess.Popen:
    a = ctx.args
    metrics = ctx.out / f"{name}.json"
    cmd = [str(HERE / "train.py"), "--model", a.model, "--samples", str(a.samples),
           "--lr", str(a.lr), "--metrics", str(metrics), "--no-progress",
           "--eval-points", str(a.eval_points), "--probe", str(a.probe), *extra]  # fmt: skip
    if a.data_dir:
        cmd += ["--data-dir", a.data_dir]
    py = sys.executable
    if workers > 1:
        cmd = [py, "-m", "pycollective", "run", "-n", str(workers), py, *cmd]
    else:
        cmd = [py, *cmd]
    log = open(ctx.out / f"{name}.log", "w")  # noqa: SIM115 - closed by _wait
    proc = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _wait(ctx: Context, name: str, proc: subprocess.Popen) -> dict[str, Any]:
    proc.wait()
    proc.log.close()  # type: ignore[attr-defined]
    text = (ctx.out / f"{name}.log").read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"training run {name} failed ({proc.returncode}):\n{text[-3000:]}")
    for line in text.splitlines():
        if "test accuracy" in line:
            ctx.log(f"  {name}: {line.split(': ', 1)[-1] if line.startswith('[') else line}")
    return json.loads((ctx.out / f"{name}.json").read_text())


@mode("accuracy", "1 process vs 2 workers (ring all-reduce, DDP), same samples; accumulation")
def accuracy(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    b = 2 * a.batch  # the global batch: a.batch per worker at 2 workers
    plan = {
        "single": (1, ["--mode", "single", "--batch", str(b)]),
        "ring": (2, ["--mode", "allreduce", "--batch", str(b)]),
        "ring_k": (2, ["--mode", "allreduce", "--batch", str(b * a.accumulate),
                       "--accumulate", str(a.accumulate)]),
    }  # fmt: skip
    ctx.log(f"  {len(plan)} runs side by side, {a.samples:,} samples each, logs in {ctx.out}/")
    # side by side: 5 processes on the machine's cores; each run's time is not the point
    # here (the contention mode measures time), its accuracy and bytes are
    procs = {name: _train(ctx, name, w, extra) for name, (w, extra) in plan.items()}
    runs = {name: _wait(ctx, name, p) for name, p in procs.items()}
    return {"model": a.model, "model_label": LABELS[a.model], "runs": runs}


@mode("contention", "compute per step, then ring vs 1 server vs W servers at 2-4 workers")
def contention_mode(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    metrics = ctx.out / "compute.json"
    cmd = [sys.executable, str(HERE / "train.py"), "--mode", "single", "--model", a.model,
           "--batch", str(a.batch), "--steps", str(a.compute_steps), "--no-eval",
           "--no-progress", "--metrics", str(metrics)]  # fmt: skip
    if a.data_dir:
        cmd += ["--data-dir", a.data_dir]
    subprocess.run(cmd, env=_env(), check=True, stdout=subprocess.DEVNULL)
    timing = json.loads(metrics.read_text())
    # CPU time, not wall time: what a step costs a core of its own, whatever else runs here
    compute = timing["cpu_ms_median"] / 1000
    ctx.log(f"  compute: {1000 * compute:.1f} ms of CPU per step of {a.batch} samples (one "
            f"process, one thread; median of {timing['steps'] - 2} steps; wall "
            f"{timing['compute_ms_median']:.1f} ms)")  # fmt: skip
    workers = [int(w) for w in a.workers.split(",")]
    res = contention.measure(workers, a.reps, "1gbit", PARAMS[a.model], log=ctx.log,
                             force_loopback=a.loopback)  # fmt: skip
    res["compute"] = {"batch": a.batch, "seconds": compute, "steps": timing["steps"],
                      "wall_seconds": timing["compute_ms_median"] / 1000}  # fmt: skip
    res["accumulate"] = a.accumulate
    return res


def simulate(args: list[str]) -> list[dict[str, Any]]:
    """`pycollective simulate --json`'s rows, with the fields the report reads."""
    cmd = [sys.executable, "-m", "pycollective", "simulate", "--json", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    keep = ("algorithm", "ranks", "servers", "seconds")
    return [{k: r[k] for k in keep} for r in json.loads(res.stdout)]


def _sim_args(workers: list[int], servers: list[int], nbytes: int, link_bps: float) -> list[str]:
    return ["-a", "ring", "-n", ",".join(map(str, workers)), "--bytes", f"{nbytes}B",
            "--alpha", f"{ALPHA}", "--overhead", f"{OVERHEAD}", "--gamma", f"{GAMMA}",
            "--beta", f"{link_bps}bit/s", "--servers", ",".join(map(str, servers))]  # fmt: skip


GRID_WORKERS = [*range(2, 65), *range(72, 257, 8)]  # every W to 64, then every 8th
GRID_SERVERS = [1, 2, 4, 8, 16, 32, 64]
GRID_EQUAL = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]  # S = W points


@mode("predict", "the simulator at the measured points and for 8-256 workers at 1-100 Gbit/s")
def predict(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    nbytes = 4 * PARAMS[a.model]
    cont = ctx.results.get("contention") or {}
    link = cont.get("link_bps") or RATES["1"]  # measured goodput, else the TCP ceiling
    measured_w = sorted(int(w) for w in cont.get("runs", {})) or [2, 3, 4]
    jobs = {"measured": _sim_args(measured_w, list(range(1, max(measured_w) + 1)), nbytes, link)}
    top = a.max_workers
    ws, ss, eq = ([x for x in g if x <= top] for g in (GRID_WORKERS, GRID_SERVERS, GRID_EQUAL))
    for rate, bps in RATES.items():
        jobs[rate] = _sim_args(ws, ss, nbytes, bps)
        jobs[f"{rate}/equal"] = _sim_args(eq, eq, nbytes, bps)
    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(jobs, pool.map(simulate, jobs.values()), strict=True))
    params = {"alpha_s": ALPHA, "overhead_s": OVERHEAD, "gamma_s_per_byte": GAMMA,
              "measured_link_bps": link, "nbytes": nbytes, "rates_bps": RATES}  # fmt: skip
    grid = {}
    for rate in RATES:
        # 'W parameter servers' (S = W) from the second call; ring and fixed S from the first
        equal = [r for r in got[f"{rate}/equal"] if r.get("servers") == r["ranks"]]
        grid[rate] = got[rate] + [dict(r, equal=True) for r in equal]
    ctx.log(f"  {sum(len(g) for g in grid.values())} predictions (alpha {ALPHA * 1e6:.0f} us, "
            f"overhead {OVERHEAD * 1e6:.0f} us per extra message, gamma {GAMMA * 1e9:.2f} ns/B; "
            f"the measured points at {link / 1e9:.3f} Gbit/s)")  # fmt: skip
    return {"params": params, "measured": got["measured"], "grid": grid}


@mode("elastic", "4 workers, one killed mid-training, a replacement joins, no restart",
      text=lambda results: elastic_report.text(results["elastic"]))  # fmt: skip
def elastic_mode(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    workers, batch = 4, 64
    updates = a.elastic_samples // batch
    kill_at = max(2, updates // 3)
    steps_log = ctx.out / "elastic_steps.jsonl"
    steps_log.unlink(missing_ok=True)
    py = sys.executable
    cmd = [py, "-m", "pycollective", "run", "-n", str(workers), "--elastic", f"2:{workers}",
           "--max-restarts", "1", py, str(HERE / "train.py"), "--mode", "elastic",
           "--model", "small", "--samples", str(a.elastic_samples), "--batch", str(batch),
           "--lr", str(a.lr), "--probe", str(a.probe), "--kill-at", str(kill_at),
           "--kill-rank", "2", "--steps-log", str(steps_log), "--no-progress",
           "--metrics", str(ctx.out / "elastic.json")]  # fmt: skip
    if a.data_dir:
        cmd += ["--data-dir", a.data_dir]
    ctx.log(f"  {workers} workers, {updates} updates of {batch}; worker RANK 2 is killed in "
            f"update {kill_at}; log in {ctx.out}/elastic.log")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (ctx.out / "elastic.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"the elastic run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    section = elastic_report.summarize(steps_log, res.stdout)
    metrics = json.loads((ctx.out / "elastic.json").read_text())
    section.update(workers=workers, elastic=f"2:{workers}", batch=batch,
                   probe_accuracy=metrics["probe_accuracy"])  # fmt: skip
    section["plot"] = str(elastic_report.plot(section, ctx.out / "elastic_loss.png"))
    for line in elastic_report.text(section):
        ctx.log("  " + line)
    return section


# ---------------------------------------------------------------------- the driver


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--modes", default="accuracy,contention,predict",
                   help=f"comma-separated, from: {', '.join(MODES)}")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="the small CNN, fewer samples")
    p.add_argument("--model", choices=sorted(PARAMS), default="large")
    p.add_argument("--samples", type=int, default=None,
                   help="training samples per run (default 16,384; --quick 8,192)")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, help="samples per worker per micro-batch")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per all-reduce")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    p.add_argument("--eval-points", type=int, default=10, help="points per accuracy curve")
    p.add_argument("--probe", type=int, default=1000, help="test images the curves use")
    p.add_argument("--workers", default="2,3,4", help="worker counts the contention mode measures")
    p.add_argument("--reps", type=int, default=3, help="timed steps per design and worker count")
    p.add_argument("--compute-steps", type=int, default=12)
    p.add_argument("--max-workers", type=int, default=256, help="the predictions' largest W")
    p.add_argument("--loopback", action="store_true", help="no namespace hosts, even as root")
    p.add_argument("--data-dir", default=None, help="the four IDX files (default: Debian's)")
    p.add_argument("--elastic-samples", type=int, default=60_000,
                   help="the elastic mode's training samples (4 workers, batch 64)")  # fmt: skip
    p.add_argument("--out", default="out/fashion_mnist")
    p.add_argument("--report", metavar="RESULTS_JSON",
                   help="print the table and redraw the plots of a results file")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.model = "small"
    if args.samples is None:
        args.samples = 8_192 if args.quick else 16_384  # whole updates of 64 and of 256
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    return args


def render(results: dict[str, Any], out: Path) -> str:
    """The table, the rule and the captions as text; the plots written to `out`."""
    lines = []
    rows = report.table_rows(results)
    cont = results.get("contention")
    if rows and cont:
        if cont["network"] == "namespaces":
            net = ("namespace hosts with 1 Gbit/s links (TCP goodput "
                   f"{cont['link_bps'] / 1e9:.3f} Gbit/s)")  # fmt: skip
        else:
            net = f"loopback TCP on one host ({cont['why']}): times are CPU, not a network"
        legend = (
            f"comm ms: one step's communication, slowest worker, median of {cont['reps']}; "
            "simulator: `pycollective simulate`, error = (predicted - measured) / measured; "
            "busiest link: bytes per step on the busiest host's link (kernel counters, the "
            "larger direction); per sample: that / samples per step; compute ms: CPU time of "
            "one step in one process on one core; step = compute + comm (no overlap); "
            "samples/s: W x samples per worker per step / step; test acc, sent/sample: the "
            f"training runs at 2 workers (all {_test_images(results)} test images; bytes "
            "counted by the backend)."
        )
        lines += [
            f"{LABELS[results['config']['model']]}, one step = {cont['compute']['batch']} "
            f"samples per worker ('accumulate {cont['accumulate']}': {cont['accumulate']} "
            f"of them per all-reduce); {net}:",
            "",
            report.render_table(rows),
            "",
            report.wrap(legend, 100),
            "",
        ]
    if results.get("accuracy"):
        lines += [report.wrap(report.accuracy_caption(results), 100), ""]
    if results.get("predict"):
        lines += ["The crossover (simulator, one rank per host, synchronous push and pull):"]
        lines += [textwrap.fill(r, 100, initial_indent="- ", subsequent_indent="  ")
                  for r in report.rule(results["predict"])]  # fmt: skip
        lines += [""]
    extra = []
    for m in MODES.values():
        if m.name in results and m.text:
            lines += [*m.text(results), ""]
        if m.name in results and m.curves:
            extra += m.curves(results)
    written = []
    if rows and cont:
        written.append(report.plot_steps(results, out / "step_times.png"))
    if results.get("accuracy"):
        written.append(report.plot_accuracy(results, out / "accuracy.png", extra))
    lines += [f"wrote {p}" for p in written]
    return "\n".join(lines)


def _cpu() -> float:
    """CPU seconds of this process and the children it has waited for (every job's ranks)."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)


def _test_images(results: dict[str, Any]) -> str:
    runs = (results.get("accuracy") or {}).get("runs", {})
    return f"{next(iter(runs.values()))['test_images']:,}" if runs else "the"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        results = json.loads(Path(args.report).read_text())
        print(render(results, out))
        return 0
    try:
        data.load(args.data_dir)
    except data.DatasetError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    ctx = Context(args, out)
    ctx.results["config"] = {k: v for k, v in vars(args).items()}
    ctx.results["load"] = {"before": os.getloadavg()[0], "cpus": os.cpu_count()}
    start = time.perf_counter()
    for name in args.modes.split(","):
        m = MODES[name]
        t0, c0 = time.perf_counter(), _cpu()
        ctx.log(f"\n=== {name}: {m.summary} ===")
        ctx.results[name] = m.run(ctx)
        ctx.results[name]["seconds"] = time.perf_counter() - t0
        ctx.results[name]["cpu_seconds"] = _cpu() - c0
        ctx.results[name]["load_after"] = os.getloadavg()[0]
        sec = ctx.results[name]
        ctx.log(f"  ({sec['seconds']:.0f} s, {sec['cpu_seconds']:.0f} s of CPU; load average "
                f"{os.getloadavg()[0]:.1f})")  # fmt: skip
    ctx.results["seconds"] = time.perf_counter() - start
    ctx.results["cpu_seconds"] = _cpu()
    # one line per section: thousands of prediction rows stay a small file
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in ctx.results.items()]
    (out / "results.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print()
    print(render(ctx.results, out))
    print(f"wrote {out / 'results.json'}")
    print(f"demo finished in {ctx.results['seconds']:.0f} s, {ctx.results['cpu_seconds']:.0f} s "
          f"of CPU in its processes (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores: other jobs' processes share them)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
