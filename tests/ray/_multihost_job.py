"""The driver of the two-host Ray job (tests/ray/test_multihost_ray.py, and with --bench
benchmarks/ray_bench.py), run on host 0 of tests/ray/_hosts.py's cluster.

    python tests/ray/_multihost_job.py OUT.json            # the checks
    python tests/ray/_multihost_job.py OUT.json --bench    # the timings (docs/ray.md)

Checks: two actors, one on each host, each with a pycollective group and a Ray gloo group,
every call on numpy and torch buffers, both backends' results; then TorchTrainer with two
workers on different hosts (STRICT_SPREAD) on pycollective (init_method env and tcp) and on
gloo. Writes everything to OUT.json for the test to judge.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _actors  # noqa: E402
import _train  # noqa: E402
import ray  # noqa: E402
from ray import cloudpickle  # noqa: E402

import pycollective.ray  # noqa: E402

cloudpickle.register_pickle_by_value(_actors)
cloudpickle.register_pickle_by_value(_train)


def pair() -> list:
    members = [_actors.Member.options(resources={f"host{k}": 1}).remote(k) for k in range(2)]
    ray.get([m.setup.remote("default", 2, backend="gloo") for m in members])
    ray.get([m.setup.remote("pc", 2) for m in members])
    return members


def checks(out: dict) -> None:
    members = pair()
    out["nodes"] = ray.get([m.node.remote() for m in members])
    before = ray.get([m.tcp_bytes_sent.remote("pc") for m in members])  # counting from here
    calls = {}
    for what in _actors.CALLS:
        for kind in ("numpy", "torch"):
            kw = {"kind": kind, "n": 1000, "root": 1}
            ours = ray.get([m.call.remote("pc", what, **kw) for m in members])
            gloo = ray.get([m.call.remote("default", what, **kw) for m in members])
            want = [_actors.expected(what, 2, r, "float32", 1000, "sum", 1) for r in range(2)]
            calls[f"{what}/{kind}"] = {"ours": ours, "gloo": gloo, "expected": want}
    out["calls"] = calls
    after = ray.get([m.tcp_bytes_sent.remote("pc") for m in members])
    out["tcp_bytes"] = [b - a for a, b in zip(before, after, strict=True)]
    for m in members:
        ray.kill(m)
    with tempfile.TemporaryDirectory(prefix="pcr-train-") as storage:
        out["train"] = {
            f"{backend}/{init}": _train.fit(
                backend, init, steps=5, width=32, storage=storage, spread=True
            )  # fmt: skip
            for backend, init in (
                ("pycollective", "env"),
                ("pycollective", "tcp"),
                ("gloo", "env"),
            )  # fmt: skip
        }


def bench(out: dict, reps: int, train_steps: int, width: int) -> None:
    members = pair()
    out["nodes"] = ray.get([m.node.remote() for m in members])
    rows = []
    for what, nbytes in (("allreduce", 4), ("allreduce", 16 << 20), ("reducescatter", 16 << 20)):
        # one run, the same actors: the two backends alternate, several rounds each
        times: dict[str, list[float]] = {"pycollective": [], "gloo": []}
        calls = reps if nbytes < 1 << 20 else max(2, reps // 50)
        for _ in range(3):
            for name, group in (("pycollective", "pc"), ("gloo", "default")):
                got = ray.get([m.bench.remote(group, what, nbytes, calls, 5) for m in members])
                times[name] += [max(each) for each in zip(*got, strict=True)]
        row = {"call": what, "bytes": nbytes, "calls_per_round": calls}
        for name, ts in times.items():
            row[name] = {"median_s": statistics.median(ts), "min_s": min(ts), "n": len(ts)}
        row["speedup"] = row["gloo"]["median_s"] / row["pycollective"]["median_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out["collective"] = rows
    for m in members:
        ray.kill(m)
    train = {}
    with tempfile.TemporaryDirectory(prefix="pcr-train-") as storage:
        for rnd in range(2):
            for backend, init in (("pycollective", "env"), ("gloo", "env"),
                                  ("pycollective", "tcp")):  # fmt: skip
                reports = _train.fit(backend, init, steps=train_steps, width=width,
                                     storage=storage, spread=True)  # fmt: skip
                steps = [max(ts) for ts in zip(*(rep["step_times"] for rep in reports),
                                               strict=True)][3:]  # fmt: skip
                key = f"{backend}/{init}"
                entry = train.setdefault(key, {"step_s": [], "digests": set()})
                entry["step_s"] += steps
                entry["digests"].add(reports[0]["digest"])
                print(key, rnd, statistics.median(steps), flush=True)
    out["train"] = {
        k: {"median_step_s": statistics.median(v["step_s"]), "steps": len(v["step_s"]),
            "digests": sorted(v["digests"])}
        for k, v in train.items()
    }  # fmt: skip
    out["train_width"] = width


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=1024)
    args = ap.parse_args()
    pycollective.ray.register()
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), runtime_env={
        "worker_process_setup_hook": "pycollective.ray.register",
        "env_vars": {"PYCOLLECTIVE_TIMEOUT": "60", "OMP_NUM_THREADS": "1"},
    })  # fmt: skip
    pycollective.ray.register()
    out: dict = {"started": time.time()}
    if args.bench:
        bench(out, args.reps, args.train_steps, args.width)
    else:
        checks(out)
    out["seconds"] = time.time() - out["started"]
    with open(args.out, "w") as f:
        json.dump(out, f)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
