"""`make demo`: train the small CNN on Fashion-MNIST for the same budget three ways — one
process; 2 workers with ring all-reduce (DDP on the pycollective backend); 2 workers and 1
parameter server — then print a comparison table and write plots.

    python examples/fashion_mnist/demo.py [--epochs 0.75] [--out out/fashion_mnist]

Each run is a real job under `pycollective run`, over TCP (PYCOLLECTIVE_TRANSPORT=tcp, so
bytes on the wire are what a network would carry), one core per worker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import data  # noqa: E402

RUNS = [
    ("single", "1 process", []),
    ("allreduce", "2 workers, ring all-reduce", ["-n", "2"]),
    ("ps", "2 workers + 1 parameter server", ["-n", "2", "--servers", "1"]),
]


def run(mode: str, launch: list[str], args: argparse.Namespace) -> dict:
    metrics = Path(args.out) / f"{mode}.json"
    train = [str(HERE / "train.py"), "--mode", mode, "--epochs", str(args.epochs),
             "--lr", str(args.lr), "--metrics", str(metrics),
             "--checkpoint", str(Path(args.out) / f"{mode}.pt")]  # fmt: skip
    if args.data_dir:
        train += ["--data-dir", args.data_dir]
    py = sys.executable
    cmd = [py, *train] if not launch else [py, "-m", "pycollective", "run", *launch, py, *train]
    # ring: the algorithm the comparison is about (auto may pick another for small sizes)
    env = dict(
        os.environ,
        PYCOLLECTIVE_TRANSPORT="tcp",
        PYCOLLECTIVE_ALL_REDUCE_ALGORITHM="ring",
        OMP_NUM_THREADS="1",
    )
    subprocess.run(cmd, check=True, env=env)
    return json.loads(metrics.read_text())


def table(reports: list[tuple[str, dict]]) -> str:
    head = ("mode", "test acc", "samples/s", "step ms", "compute ms", "comm ms",
            "sent/step", "recv/step")  # fmt: skip
    rows = [head]
    for label, r in reports:
        rows.append((
            label, f"{100 * r['test_accuracy']:.2f}%", f"{r['samples_per_s']:.0f}",
            f"{r['step_ms']:.1f}", f"{r['compute_ms']:.1f}", f"{r['comm_ms']:.1f}",
            _size(r["bytes_sent_per_step"]), _size(r["bytes_recv_per_step"]),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def plot(reports: list[tuple[str, dict]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, r in reports:
        t = [p["t"] for p in r["curve"]]
        ax_loss.plot(t, [p["loss"] for p in r["curve"]], marker=".", label=label)
        ax_acc.plot(t, [100 * p["acc"] for p in r["curve"]], marker=".", label=label)
    ax_loss.set(xlabel="training time (s)", ylabel="training loss (moving average)",
                title="Loss against time")  # fmt: skip
    ax_acc.set(xlabel="training time (s)", ylabel="test accuracy (%, 1,000 test images)",
               title="Accuracy against time")  # fmt: skip
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    curves = out / "loss_accuracy.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [label for label, _ in reports]
    ax.bar(labels, [r["samples_per_s"] for _, r in reports], color=["C0", "C1", "C2"])
    ax.set(ylabel="samples / s", title="Training throughput per mode (small CNN, 2 cores)")
    for i, (_, r) in enumerate(reports):
        ax.text(i, r["samples_per_s"], f"{r['samples_per_s']:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    bars = out / "throughput.png"
    fig.savefig(bars, dpi=120)
    plt.close(fig)
    return [curves, bars]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=0.75)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="out/fashion_mnist")
    args = p.parse_args()
    try:
        data.load(args.data_dir)
    except data.DatasetError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    reports = []
    for mode, label, launch in RUNS:
        print(f"\n=== {label} ({mode}) ===", flush=True)
        reports.append((label, run(mode, launch, args)))
    print(f"\nFashion-MNIST, small CNN ({reports[0][1]['parameters']:,} parameters), "
          f"{args.epochs:g} epoch, global batch {reports[0][1]['global_batch']}, "
          f"Adam lr {args.lr:g}; per worker per step:")  # fmt: skip
    print(table(reports))
    for path in plot(reports, Path(args.out)):
        print(f"wrote {path}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
