"""CPU time of synchronous small torch.distributed collectives at 2+ real ranks on the
"pycollective" backend: all_reduce, broadcast, reduce, all_gather_into_tensor and
reduce_scatter_tensor, each repeated on the same tensors (the short way and the compiled
per-call path's case).

    python benchmarks/torch_collectives_cpu.py [-n 2] [--bytes 4] [--calls 2000] [--blocks 9]
                                               [--json OUT]

The cases take turns block by block (the order rotating), each block a barrier and then
--calls calls, so a load change on the shared machine falls on every case alike. Per
block and rank: the process's CPU time per call. A synchronous call's CPU includes its
wait for the peer. Prints, per case, rank 0's minimum and median of the blocks and the
load before and after; for before/after pairs, run it with PYTHONPATH set to each tree
(it says which it imported).
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

import torch.distributed as dist

import pycollective
import torch
from pycollective._netutil import free_port


def _rank_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("pycollective")
    n = dist.get_world_size()
    count = max(1, args.bytes // 4)
    x, whole, out = torch.ones(count), torch.ones(n * count), torch.zeros(n * count)
    # torch 2.13 names the flat gathers all_gather_single and reduce_scatter_single (the
    # older names warn on every call)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    cases = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "reduce": lambda: dist.reduce(x, 0),
        "all_gather_into_tensor": lambda: gather(out, x),
        "reduce_scatter_tensor": lambda: scatter(x, whole),
    }
    names = list(cases)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for name in names:  # warm-up: views, plans, the compiled path's signatures
        for _ in range(200):
            cases[name]()
    for b in range(args.blocks):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            fn = cases[name]
            dist.barrier()
            c0 = time.process_time()
            for _ in range(args.calls):
                fn()
            cpu[name].append((time.process_time() - c0) / args.calls * 1e6)
    if dist.get_rank() == 0:
        mine = {
            k: {"cpu_us_min": round(min(v), 2), "cpu_us_median": round(statistics.median(v), 2)}
            for k, v in cpu.items()
        }
        print("RESULT " + json.dumps(mine), flush=True)
    dist.destroy_process_group()


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=2, help="ranks (2+)")
    p.add_argument("--bytes", type=int, default=4, help="float32 bytes of the data")
    p.add_argument("--calls", type=int, default=2000, help="calls per block")
    p.add_argument("--blocks", type=int, default=9, help="blocks per case")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", help="also write the numbers and the load here")
    p.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_side:
        _rank_main(args)
        return
    port, before = free_port(), _load()
    procs = []
    for rank in range(args.n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.n), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
        cmd = [sys.executable, __file__, "--rank-side", "--bytes", str(args.bytes),
               "--calls", str(args.calls), "--blocks", str(args.blocks)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    result = next(json.loads(x[7:]) for x in outs[0].splitlines() if x.startswith("RESULT "))
    tree = str(Path(pycollective.__file__).parent)
    load = [before, _load()]
    print(f"{tree}; load {load[0]} -> {load[1]}; rank 0's CPU us a call, min / median:")
    for name, r in result.items():
        print(f"  {name:24s} {r['cpu_us_min']:7.2f} / {r['cpu_us_median']:7.2f}")
    if args.json:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        row = {"when": when, "tree": tree, "load": load, "ranks": args.n, "bytes": args.bytes,
               "calls": args.calls, "blocks": args.blocks, "rank0": result}  # fmt: skip
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
