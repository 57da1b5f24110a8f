"""CPU time of one synchronous small `torch.distributed.all_reduce` at 2+ real ranks: on
the "pycollective" backend, through pycollective's own API on the group underneath it,
and on torch's gloo, in the same ranks.

    python benchmarks/torch_call_cpu.py [-n 2] [--bytes 4] [--calls 3000] [--blocks 15]
                                        [--json OUT]

Each rank holds the default "pycollective" group and a gloo group over the same ranks.
The cases take turns block by block (the order rotating), each block a barrier and then
--calls calls, so a load change on the shared machine falls on every case alike. Per
block and rank: the process's CPU time per call (every thread: gloo's own threads count)
and the wall time. A synchronous call's CPU includes its wait for the peer (the arena
spins, then yields), so a microsecond cut from one rank's layers is about two from the
call. Prints, per case and rank, the minimum and median of the blocks, with the machine's
load before and after; writes JSON (default benchmarks/results/torch_call_cpu.json) with
every block's CPU too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist

import pycollective
import torch
from pycollective._netutil import free_port

HERE = Path(__file__).resolve().parent


def _rank_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("pycollective")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    ours = dist.distributed_c10d._get_default_group().pycollective_group
    count = max(1, args.bytes // 4)
    t = torch.ones(count)
    tg = torch.ones(count)
    a = np.ones(count, dtype=np.float32)
    cases = {
        "torch, pycollective": lambda: dist.all_reduce(t),
        "own API (numpy)": lambda: pycollective.all_reduce(a, group=ours),
        "own API (tensor)": lambda: pycollective.all_reduce(t, group=ours),
        "torch, gloo": lambda: dist.all_reduce(tg, group=gloo),
    }
    names = list(cases)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    wall: dict[str, list[float]] = {k: [] for k in names}
    for name in names:  # warm-up: views, plans, connections
        for _ in range(200):
            cases[name]()
    for b in range(args.blocks):
        order = names[b % len(names) :] + names[: b % len(names)]
        for name in order:
            fn = cases[name]
            dist.barrier(group=gloo)
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                fn()
            wall[name].append((time.perf_counter() - t0) / args.calls * 1e6)
            cpu[name].append((time.process_time() - c0) / args.calls * 1e6)
    mine = {
        name: {
            "cpu_us_min": round(min(cpu[name]), 2),
            "cpu_us_median": round(statistics.median(cpu[name]), 2),
            "wall_us_min": round(min(wall[name]), 2),
            "wall_us_median": round(statistics.median(wall[name]), 2),
            # every block, in the order run: this machine's two vCPUs can halve each
            # other's speed for minutes at a time, which a median alone hides
            "cpu_us_blocks": [round(v, 2) for v in cpu[name]],
        }
        for name in names
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine, group=gloo)
    if rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _launch(args: argparse.Namespace) -> list[dict]:
    port = free_port()
    procs = []
    for rank in range(args.n):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(args.n),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(args.n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, __file__, "--rank-side", "--bytes", str(args.bytes),
               "--calls", str(args.calls), "--blocks", str(args.blocks)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    for line in outs[0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit("rank 0 printed no result")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return "load " + " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=2, help="ranks (2+)")
    p.add_argument("--bytes", type=int, default=4, help="float32 bytes per call")
    p.add_argument("--calls", type=int, default=3000, help="calls per block")
    p.add_argument("--blocks", type=int, default=15, help="blocks per case")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", default=str(HERE / "results" / "torch_call_cpu.json"))
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        _rank_main(args)
        return
    if args.n < 2:
        p.error("-n must be 2 or more: the point is a call with a peer")
    load = [_load()]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ranks = _launch(args)
    load.append(_load())
    print(f"{args.bytes} B all_reduce, {args.n} ranks, {args.blocks} blocks of {args.calls} "
          f"calls, {when}; {load[0]} before, {load[1]} after")  # fmt: skip
    print("| case | rank | CPU µs min | CPU µs median | wall µs min | wall µs median |")
    print("|---|--:|--:|--:|--:|--:|")
    for name in ranks[0]:
        for r, row in enumerate(ranks):
            x = row[name]
            print(f"| {name} | {r} | {x['cpu_us_min']} | {x['cpu_us_median']} | "
                  f"{x['wall_us_min']} | {x['wall_us_median']} |")  # fmt: skip
    out = {"when": when, "load": load, "ranks": args.n, "bytes": args.bytes,
           "calls": args.calls, "blocks": args.blocks, "per_rank": ranks}  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
