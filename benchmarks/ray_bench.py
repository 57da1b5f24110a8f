"""pycollective against Ray's gloo backend across two network-namespace hosts (root), one
Ray cluster (head on host 0, worker node on host 1), one run (`make bench-ray`):

* ray.util.collective, the same two actors (one per host) holding a group of each backend:
  numpy float32 allreduce of 4 B and 16 MiB, reducescatter of 16 MiB (the input list is
  16 MiB in all). Seconds per call: the slower actor's, each call timed alone after a
  barrier, the backends alternating in 3 rounds; medians.
* Ray Train: TorchTrainer, 2 workers on different hosts, DDP on an MLP (64 -> width -> 10,
  width 1024: 77 k parameters, one 0.3 MB gradient bucket), pycollective (init_method env
  and tcp) and gloo; the step time of the slower worker, median over 2 runs of each (first
  3 steps of a run dropped); the final parameters' digest per backend.

    python benchmarks/ray_bench.py [--reps 200] [--train-steps 40] [--width 1024] \\
        [--json benchmarks/results/ray.json] [--markdown]

The numbers in docs/ray.md come from this, with the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "ray"))
sys.path.insert(0, str(REPO))

from _hosts import RayHosts  # noqa: E402
from tools import nethosts  # noqa: E402


def markdown(data: dict) -> str:
    lines = [
        f"Load average {data['load_before']} before, {data['load_after']} after; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(data['when']))}.",
        "",
        "| call | size | pycollective | Ray gloo | speedup | best of each | speedup of bests |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]

    def show(seconds: float) -> str:
        us = seconds * 1e6
        return f"{us:,.0f} us" if us < 10000 else f"{us / 1000:,.1f} ms"

    for row in data["collective"]:
        size = f"{row['bytes']} B" if row["bytes"] < 1024 else f"{row['bytes'] >> 20} MiB"
        ours, gloo = row["pycollective"], row["gloo"]
        lines.append(
            f"| {row['call']} | {size} | {show(ours['median_s'])} | {show(gloo['median_s'])} | "
            f"{row['speedup']:.2f}x | {show(ours['min_s'])} / {show(gloo['min_s'])} | "
            f"{gloo['min_s'] / ours['min_s']:.2f}x |"
        )
    lines += ["", "| Ray Train DDP step | median step | vs gloo | final parameters |",
              "|---|--:|--:|---|"]  # fmt: skip
    gloo = data["train"]["gloo/env"]
    for key, entry in data["train"].items():
        same = "= gloo's" if entry["digests"] == gloo["digests"] else "differ"
        lines.append(
            f"| {key} | {entry['median_step_s'] * 1000:.2f} ms | "
            f"{gloo['median_step_s'] / entry['median_step_s']:.2f}x | {same} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true", help="print the tables of a --json file")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.json).read_text())))
        return 0
    why = nethosts.available()
    if why:
        print(f"ray_bench: {why}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d, RayHosts() as cluster:
        out = Path(d) / "bench.json"
        res = cluster.driver(
            [sys.executable, "tests/ray/_multihost_job.py", str(out), "--bench",
             "--reps", str(args.reps), "--train-steps", str(args.train_steps),
             "--width", str(args.width)],
            timeout=3000,
        )  # fmt: skip
        sys.stdout.write(res.stdout[-6000:])
        if res.returncode != 0:
            sys.stderr.write(res.stderr[-8000:])
            return 1
        data = json.loads(out.read_text())
    data["load_before"] = [round(x, 2) for x in load_before]
    data["load_after"] = [round(x, 2) for x in os.getloadavg()]
    data["when"] = time.time()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
