"""Instructions a small call costs on the compiled per-call path, counted by callgrind.

    python benchmarks/percall_instructions.py [--calls 5000] [--bytes 4] [--collective all_reduce]
                                              [--python | --torch] [--transport tcp]

A 2-rank job over shared memory (`--transport tcp`: over loopback TCP, where the repeated
small all_reduce is the swap of runners/swap.py): rank 0 runs under
`valgrind --tool=callgrind`, its peer natively (so rank 0 hardly ever waits). Rank 0 is
run twice, making `--calls` more calls the second time; the difference of the two
instruction totals divided by `--calls` is the
cost of one call, with start-up and teardown cancelled out. Instruction counts do not
depend on the machine's load (times do), so the number compares builds.
`--python` runs the same calls with algorithm="shm", which the per-call path does not
take: the Python path's cost in the same build. `--torch` makes the calls through
torch.distributed on the "pycollective" backend, on torch tensors (torch's wrapper, the
backend's short way, then the same path). `--bytes` is the data's (all_gather's input,
reduce_scatter's output); the gathered side is twice that.

The per-call path leaves a call to the Python path when the transport was last read for
abort notices a millisecond ago or more (core/group.py _RECHECK_SECONDS), and a rank under
callgrind runs some fifty times slower: the worker stretches that millisecond to an hour,
so that every repeated call is counted on the path it measures.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import pycollective
from pycollective._netutil import free_port

WARM = 200  # calls before counting: the first of a signature runs the Python path


def worker(calls: int, nbytes: int, collective: str, python: bool, through_torch: bool) -> None:
    from pycollective.core import group as _group

    _group._RECHECK_SECONDS = 3600.0  # see the module's docstring
    n = max(1, nbytes // 4)
    dist: Any = pycollective
    if through_torch:
        import torch.distributed as dist

        import torch

        torch.set_num_threads(1)
        dist.init_process_group("pycollective")
        x, whole, out = torch.ones(n), torch.ones(2 * n), torch.zeros(2 * n)
        group = dist.distributed_c10d._get_default_group().pycollective_group
    else:
        dist.init_process_group()
        x, whole, out = (np.ones(n, np.float32), np.ones(2 * n, np.float32),
                         np.zeros(2 * n, np.float32))  # fmt: skip
        group = dist.group.WORLD
    kw = {"algorithm": "shm"} if python else {}
    # torch 2.13's names of the flat gathers (its older ones warn on every call)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn = {
        "all_reduce": lambda: dist.all_reduce(x, **kw),
        "broadcast": lambda: dist.broadcast(x, src=0, **kw),
        "barrier": lambda: dist.barrier(),
        "reduce": lambda: dist.reduce(x, dst=0, **kw),
        "all_gather_into_tensor": lambda: gather(out, x, **kw),
        "reduce_scatter_tensor": lambda: scatter(x, whole, **kw),
    }[collective]
    for _ in range(WARM + calls):
        fn()
    fast = group.fast
    if int(os.environ["RANK"]) == 0 and not python:
        taken = 0 if fast is None else fast.calls
        print(f"compiled calls: {taken} of {WARM + calls}", file=sys.stderr)
    dist.destroy_process_group()


def run(extra: int, args: argparse.Namespace, out: Path) -> int:
    """Rank 0's instruction total for a job of WARM + args.base + extra calls."""
    port = free_port()
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYCOLLECTIVE_TRANSPORT=args.transport, PYCOLLECTIVE_TIMEOUT="600")  # fmt: skip
    cmd = [sys.executable, __file__, "--worker", "--calls", str(args.base + extra),
           "--bytes", str(args.bytes), "--collective", args.collective]  # fmt: skip
    if args.python:
        cmd.append("--python")
    if args.torch:
        cmd.append("--torch")
    peer = subprocess.Popen(cmd, env=dict(env, RANK="1"))
    grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    done = subprocess.run(grind + cmd, env=dict(env, RANK="0"), capture_output=True, text=True)
    peer.wait(timeout=600)
    if done.returncode:
        raise SystemExit(f"rank 0 failed:\n{done.stderr[-3000:]}")
    print(
        "".join(line for line in done.stderr.splitlines(True) if "compiled calls" in line), end=""
    )
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    assert totals, f"no totals in {out}"
    return int(totals.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls counted (the difference)")
    ap.add_argument("--base", type=int, default=500, help="calls of the shorter run")
    ap.add_argument("--bytes", type=int, default=4)
    ap.add_argument("--collective", default="all_reduce",
                    choices=("all_reduce", "broadcast", "barrier", "reduce",
                             "all_gather_into_tensor", "reduce_scatter_tensor"))  # fmt: skip
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--python", action="store_true", help='algorithm="shm": the Python path')
    how.add_argument("--torch", action="store_true", help="through torch.distributed")
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.python and args.transport != "shm":
        ap.error('--python is algorithm="shm": the shared-memory transport only')
    if args.worker:
        worker(args.calls, args.bytes, args.collective, args.python, args.torch)
        return
    with tempfile.TemporaryDirectory() as tmp:
        short = run(0, args, Path(tmp) / "short.out")
        long = run(args.calls, args, Path(tmp) / "long.out")
    per_call = (long - short) / args.calls
    path = "Python path" if args.python else "torch.distributed" if args.torch else "our API"
    tree = Path(pycollective.__file__).parent  # which tree's, for before/after pairs
    print(f"{args.collective} {args.bytes} B, p=2, {args.transport}, {path}: "
          f"{per_call:,.0f} instructions a call (rank 0; {short:,} and {long:,} in all; "
          f"{tree})")  # fmt: skip


if __name__ == "__main__":
    main()
