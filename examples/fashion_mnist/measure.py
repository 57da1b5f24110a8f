"""Bytes per worker per step and samples per second, all-reduce against parameter server,
at several worker counts: the numbers behind the note's comparison.

    python examples/fashion_mnist/measure.py [--workers 2 4] [--models small large]

Every run is a short real training job (per-worker batch 32, a fixed number of steps)
under `pycollective run` over TCP; the parameter-server runs use one server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one(model: str, mode: str, workers: int, steps: int, out: Path) -> dict:
    metrics = out / f"{model}-{mode}-{workers}.json"
    launch = ["-n", str(workers)] + (["--servers", "1"] if mode == "ps" else [])
    py = sys.executable
    cmd = [py, "-m", "pycollective", "run", *launch, py, str(HERE / "train.py"),
           "--mode", mode, "--model", model, "--batch", str(32 * workers),
           "--steps", str(steps), "--eval-every", "1e9", "--no-progress",
           "--metrics", str(metrics)]  # fmt: skip
    # ring: the algorithm the comparison is about (auto may pick another for small sizes)
    env = dict(
        os.environ,
        PYCOLLECTIVE_TRANSPORT="tcp",
        PYCOLLECTIVE_ALL_REDUCE_ALGORITHM="ring",
        OMP_NUM_THREADS="1",
    )
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(metrics.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--models", nargs="+", default=["small", "large"])
    p.add_argument("--steps", type=int, nargs=2, default=[40, 12], metavar=("SMALL", "LARGE"))
    args = p.parse_args()
    rows = [
        "| model | mode | workers | sent / worker / step | received / worker / step "
        "| samples/s | step ms | comm ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            steps = args.steps[0] if model == "small" else args.steps[1]
            for workers in args.workers:
                for mode in ("allreduce", "ps"):
                    r = one(model, mode, workers, steps, Path(tmp))
                    rows.append(
                        f"| {model} ({r['parameters']:,}) | {mode} | {workers} | "
                        f"{r['bytes_sent_per_step'] / 1e6:.3f} MB | "
                        f"{r['bytes_recv_per_step'] / 1e6:.3f} MB | {r['samples_per_s']:.0f} | "
                        f"{r['step_ms']:.0f} | {r['comm_ms']:.0f} |"
                    )
                    print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
