"""What the torch backend's layers cost per synchronous call, the collective left out.

    python benchmarks/torch_layer_cost.py [--calls 20000] [--repeat 7]

One process, a "pycollective" group of one rank made to act as one of two (its compiled
per-call path replaced by a C builtin that accepts every call, so no bytes move and no
peer is waited for): what remains is torch's `dist.all_reduce` wrapper, the backend's
method (call forms, views, the Work) and our API's entry. CPU time per call (best of
--repeat blocks), which a loaded machine blurs less than the clock. docs/torch_conformance.md.

The floor no backend can go under: `dist.all_reduce` on a group whose `allreduce` returns
None at once (a no-op ProcessGroup subclass, as ours is one), with the group passed in
both cases so that the default group's look-up is not counted on one side only.
"""

from __future__ import annotations

import argparse
import json
import operator
import time
import timeit
import types
from pathlib import Path

import numpy as np
import torch.distributed as dist

import pycollective
import torch


class _NoOp(dist.ProcessGroup):
    """A backend that does nothing: what torch's own wrapper costs around any backend."""

    def allreduce(self, tensors: object, opts: object = None, *args: object) -> None:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--json", help="also write the numbers and the load here")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("pycollective", store=dist.HashStore(), rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    pg._solo = False  # take the views and the short way, as at 2+ ranks
    ours = pg.pycollective_group
    ours.fast = types.SimpleNamespace(all_reduce=operator.is_not, broadcast=operator.is_not)
    t = torch.ones(1)
    a = np.ones(1, dtype=np.float32)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    noop = _NoOp(0, 1)
    cases = {
        "dist.all_reduce (torch's wrapper + the backend)": lambda: dist.all_reduce(t),
        "dist.all_reduce, group given": lambda: dist.all_reduce(t, group=pg),
        "dist.all_reduce, a no-op backend (torch's floor)": lambda: dist.all_reduce(t, group=noop),
        "the backend's allreduce method": lambda: pg.allreduce([t], opts),
        "pycollective.all_reduce (our API's entry)": lambda: pycollective.all_reduce(a, group=ours),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.repeat):  # interleaved, so a load change falls on every case
        for name, fn in cases.items():
            s = timeit.timeit(fn, number=args.calls, timer=time.process_time)
            best[name] = min(best[name], s / args.calls * 1e6)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    for name, us in best.items():
        print(f"{us:7.2f} us CPU  {name}")
    print(f"load {load}")
    if args.json:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        rows = {name: round(us, 3) for name, us in best.items()}
        out = {"when": when, "load": load, "calls": args.calls, "repeat": args.repeat,
               "cpu_us_best": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
