"""pycollective as a torch backend beside torch's gloo, in the same ranks: DDP and FSDP2
step times, and what the backend layer itself costs per call.

    python benchmarks/torch_backend.py -n 2,4 [--steps 5] [--rounds 5] [--json OUT]
    python benchmarks/torch_backend.py -n 1 --models ""    # the backend layer's own cost

Each rank has two process groups over the same ranks, the default one on "pycollective"
and a gloo one, and two copies of each model (one per group, same initial weights). The
copies take turns, round by round (the order alternating), so the load of a shared
machine falls on both alike. A step is forward, backward (DDP's buckets all-reduce during
it; FSDP2 all-gathers and reduce-scatters per layer) and an SGD update; its time is the
slowest rank's median over rounds. With DDP the same step is also timed under no_sync()
(its all-reduce left out, the compute floor), in the same rounds: step - floor is the
communication a step exposes, the part a faster backend can shorten. Models: the 30 MB
Fashion-MNIST CNN of examples/fashion_mnist/models.py (7.5 M parameters, batch 32) and a
small transformer block (d_model 256, 4 heads, feed-forward 1024, batch 8 x 64 tokens).
One intra-op thread per rank.

The call rows time one torch.distributed.all_reduce through each group, and the same
through pycollective's own API on the group underneath the torch one (a numpy array): the
difference is what the backend layer adds (torch's Python wrapper, argument forms, tensor
views, Work, futures). Beside each wall time is the process CPU time per call (every
thread), which a loaded machine's scheduling blurs less; at -n 1 no bytes move, so the CPU
time is the layers' own cost.

Prints markdown tables and the machine's load; writes JSON (default
benchmarks/results/torch_backend.json).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import pycollective
import torch
from pycollective._netutil import free_port
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# ---------------------------------------------------------------------- rank side


def _rank_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "examples" / "fashion_mnist"))
    import models  # the example's module, not the package

    torch.set_num_threads(1)
    dist.init_process_group("pycollective")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"pycollective": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}

    def fashion() -> nn.Module:
        return models.large()

    def transformer() -> nn.Module:
        return nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)

    g = torch.Generator().manual_seed(rank)
    inputs = {
        "fashion": (
            torch.randn(32, 1, 28, 28, generator=g),
            torch.randint(0, 10, (32,), generator=g),
        ),
        "transformer": (torch.randn(8, 64, 256, generator=g), torch.randn(8, 64, 256, generator=g)),
    }

    def loss_of(model_name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if model_name == "fashion":
            return F.cross_entropy(out, target)
        return F.mse_loss(out, target)

    def wrap(model_name: str, how: str, pg) -> nn.Module:
        torch.manual_seed(0)
        net = fashion() if model_name == "fashion" else transformer()
        if how == "ddp":
            return DDP(net, process_group=pg)
        mesh = DeviceMesh.from_group(pg, "cpu")
        for m in net.children():  # per layer (attention's own linears stay in the root)
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net

    def slowest(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
        return float(t.item())

    def time_pair(model_name: str, how: str) -> dict:
        nets = {b: wrap(model_name, how, pg) for b, pg in groups.items()}
        opts = {b: torch.optim.SGD(m.parameters(), lr=0.01) for b, m in nets.items()}
        x, y = inputs[model_name]

        def step(b: str) -> None:
            opts[b].zero_grad()
            loss_of(model_name, nets[b](x), y).backward()
            opts[b].step()

        def local_step(b: str) -> None:
            # The same step with DDP's all-reduce left out (no_sync): the compute floor, so
            # step - floor is the communication a step exposes (what overlap did not hide).
            with nets[b].no_sync():
                step(b)

        for b in nets:  # warm-up: buckets built, buffers allocated
            for _ in range(2):
                step(b)
        # "<backend>" rows time the step; with DDP, "<backend>_local" rows time the same
        # step without its all-reduce, in the same rounds (the order alternating).
        kinds = [(b, step) for b in nets]
        if how == "ddp":
            kinds += [(f"{b}_local", local_step) for b in nets]
        times: dict[str, list[float]] = {k: [] for k, _ in kinds}
        cpu: dict[str, list[float]] = {k: [] for k, _ in kinds}
        for r in range(args.rounds):
            for k, fn in kinds if r % 2 == 0 else kinds[::-1]:
                b = k.removesuffix("_local")
                dist.barrier(group=groups[b])
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    fn(b)
                times[k].append((time.perf_counter() - t0) / args.steps)
                cpu[k].append((time.process_time() - c0) / args.steps)
        row = {"model": model_name, "wrapper": how, "ranks": n}
        for k, ts in times.items():
            row[f"{k}_ms"] = round(slowest(statistics.median(ts)) * 1e3, 2)
            # CPU time of the rank's whole process (every thread): what a step costs the
            # machine, which a loaded machine's scheduling does not blur as it does the clock
            row[f"{k}_cpu_ms"] = round(slowest(statistics.median(cpu[k])) * 1e3, 2)
        row["ratio"] = round(row["gloo_ms"] / row["pycollective_ms"], 3)
        if how == "ddp":
            for b in nets:  # exposed communication a step (never below 0: noise)
                row[f"{b}_exposed_ms"] = round(max(0.0, row[f"{b}_ms"] - row[f"{b}_local_ms"]), 2)
            ours = row["pycollective_exposed_ms"]
            row["exposed_ratio"] = round(row["gloo_exposed_ms"] / ours, 3) if ours > 0 else None
        return row

    results = [
        time_pair(model_name, how)
        for model_name in args.models.split(",")
        if model_name
        for how in args.wrappers.split(",")
    ]

    # One call through each layer: torch API on both groups, and (small sizes, where it
    # is the overhead that shows) pycollective's own API on the very group underneath the
    # torch one (same transport, same arena), on a numpy array.
    ours = dist.distributed_c10d._get_default_group().pycollective_group

    def per_call(fn, reps: int) -> tuple[float, float]:
        """Wall and process-CPU microseconds per call (medians of 5 blocks, slowest rank)."""
        wall, cpu = [], []
        for _ in range(5):
            fn()
            dist.barrier(group=groups["gloo"])
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(reps):
                fn()
            wall.append((time.perf_counter() - t0) / reps)
            cpu.append((time.process_time() - c0) / reps)
        return (
            round(slowest(statistics.median(wall)) * 1e6, 1),
            round(slowest(statistics.median(cpu)) * 1e6, 1),
        )

    calls = []
    for nbytes in (int(b) for b in args.sizes.split(",") if b):
        count = max(1, nbytes // 4)
        t = torch.ones(count)
        reps = 300 if nbytes <= 4096 else 20
        row = {"bytes": nbytes, "ranks": n}
        gl = functools.partial(dist.all_reduce, t, group=groups["gloo"])
        row["gloo_us"], row["gloo_cpu_us"] = per_call(gl, reps)
        row["pycollective_us"], row["pycollective_cpu_us"] = per_call(
            functools.partial(dist.all_reduce, t), reps
        )
        if nbytes <= 4096:
            a = np.ones(count, dtype=np.float32)
            own = functools.partial(pycollective.all_reduce, a, group=ours)
            row["own_api_us"], row["own_api_cpu_us"] = per_call(own, reps)
        calls.append(row)
    if rank == 0:
        print("RESULT " + json.dumps({"steps": results, "calls": calls}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------- launcher side


def _launch(n: int, args: argparse.Namespace) -> dict:
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            __file__,
            "--rank-side",
            "--models",
            args.models,
            "--wrappers",
            args.wrappers,
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
            "--sizes",
            args.sizes,
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed at n={n}: exit codes {[p.returncode for p in procs]}")
    for line in outs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"rank 0 printed no result at n={n}")


def _tables(runs: list[dict], load: list[str]) -> str:
    lines = [
        "| model | wrapper | ranks | gloo ms/step | pycollective ms/step | gloo / pycollective "
        "| CPU ms/step gloo | CPU ms/step pycollective "
        "| exposed comm ms gloo | exposed comm ms pycollective | gloo / pycollective, exposed |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        for r in run["steps"]:
            exposed = "| - | - | - |"
            if "exposed_ratio" in r:
                x = r["exposed_ratio"]
                exposed = f"| {r['gloo_exposed_ms']} | {r['pycollective_exposed_ms']} | " + (
                    f"{x:.2f}x |" if x is not None else "- |"
                )
            lines.append(
                f"| {r['model']} | {r['wrapper']} | {r['ranks']} | {r['gloo_ms']} | "
                f"{r['pycollective_ms']} | {r['ratio']:.2f}x | {r['gloo_cpu_ms']} | "
                f"{r['pycollective_cpu_ms']} {exposed}"
            )
    lines += [
        "",
        "| all_reduce | ranks | gloo µs | pycollective µs | own API µs "
        "| CPU µs gloo | CPU µs pycollective | CPU µs own API |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        for r in run["calls"]:
            size = f"{r['bytes'] >> 20} MiB" if r["bytes"] >= 1 << 20 else f"{r['bytes']} B"
            lines.append(
                f"| {size} | {r['ranks']} | {r['gloo_us']} | {r['pycollective_us']} | "
                f"{r.get('own_api_us', '')} | {r['gloo_cpu_us']} | {r['pycollective_cpu_us']} | "
                f"{r.get('own_api_cpu_us', '')} |"
            )
    lines += ["", "Load (uptime) before and after: " + " / ".join(load)]
    return "\n".join(lines)


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load " + " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", default="2,4", help="world sizes, comma separated")
    p.add_argument("--models", default="fashion,transformer")
    p.add_argument("--wrappers", default="ddp,fsdp2")
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=5, help="timed blocks per backend")
    p.add_argument(
        "--sizes", default="4,4096,1048576,16777216", help='call rows\' bytes ("": no rows)'
    )
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--json", default=str(HERE / "results" / "torch_backend.json"))
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        _rank_main(args)
        return
    load = [_uptime()]
    runs = [_launch(int(n), args) for n in args.n.split(",")]
    load.append(_uptime())
    table = _tables(runs, load)
    print(table)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"runs": runs, "load": load}, indent=1))


if __name__ == "__main__":
    main()
