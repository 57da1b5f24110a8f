"""`pycollective calibrate`: start ranks on this host that measure the cost model's
parameters (api/calibrate.py) and cache the result per host (tuning/cache.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from .. import _files
from .._netutil import free_port
from ..api import groups
from ..api.calibrate import calibrate
from ..schedule.cost import CostParams
from ..tuning import params as _tuning
from ._args import seconds

HELP = "measure this host's cost-model parameters (alpha, beta, gamma, ...) and cache them"


# ---------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--nprocs",
        default="",
        help="world sizes, comma separated (default: the cores, then cores + 2 for the "
        "CPU-sharing side when the host has 4 cores or fewer)",
    )
    parser.add_argument("--budget", type=seconds, default=2.0, help="seconds of timing per run")
    parser.add_argument("--no-save", action="store_true", help="do not write the cache")
    parser.add_argument(
        "--force", action="store_true", help="cache the result even if the machine was busy"
    )
    parser.add_argument("--json", metavar="FILE", help="write what was measured")
    parser.add_argument("--timeout", type=seconds, default=300.0, help="per run")


def default_sizes(cores: int) -> list[int]:
    first = max(2, min(cores, 4))
    return [first, cores + 2] if cores <= 4 else [first]


def main(args: argparse.Namespace) -> int:
    cores = _tuning.cores()
    try:
        sizes = [int(x) for x in args.nprocs.split(",")] if args.nprocs else default_sizes(cores)
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        print("pycollective calibrate: -n takes world sizes >= 2, e.g. -n 2,4", file=sys.stderr)
        return 2
    before = _tuning.host_params("tcp")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before our own ranks
    print(f"# pycollective calibrate: TCP on this host ({cores} cores), world sizes {sizes}")
    print(f"# before ({_tuning.source('tcp')}): {_fmt(before)}")
    runs = []
    for n in sizes:
        try:
            spec = {
                "save": not args.no_save,
                "budget": args.budget,
                "force": args.force,
                "load": load,
            }
            res = _run_job(n, spec, args.timeout)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"pycollective calibrate: {n} ranks: {exc}", file=sys.stderr)
            return 1
        runs.append(res)
        fitted = ", ".join(res["fitted"])
        print(
            f"{n} ranks ({res['ranks_per_core']:.2g} per core, load average {res['load']:.1f}),"
            f" fitted {fitted}:"
        )
        if res["note"]:
            print(f"    {res['note']}")
        print(f"    {_fmt(CostParams(**res['params']))}")
        for m in res["measured"]:
            print(
                f"    {m['collective']:<10} {m['algorithm']:<19} {m['count']:>9} x f32 "
                f"{m['seconds'] * 1e6:>10.0f} us  model {m['model'] * 1e6:>9.0f} us"
            )
    _tuning.host_params.cache_clear()
    print(f"# after ({_tuning.source('tcp')}): {_fmt(_tuning.host_params('tcp'))}")
    if args.json:
        with _files.replacing(args.json) as f:
            json.dump({"cores": cores, "runs": runs}, f, indent=1)
    return 0


def _fmt(p: CostParams) -> str:
    return (
        f"alpha {p.alpha * 1e6:.0f} us, beta {p.beta * 1e9:.3g} ns/B, gamma {p.gamma * 1e9:.3g} "
        f"ns/B, overhead {p.overhead * 1e6:.0f} us, msg_cpu {p.msg_cpu * 1e6:.0f} us, "
        f"byte_cpu {p.byte_cpu * 1e9:.3g} ns/B, call_cpu {p.call_cpu * 1e6:.0f} us"
    )


def _run_job(nprocs: int, spec: dict, timeout: float) -> dict:
    """Start nprocs ranks of this module on loopback; rank 0's result."""
    port = free_port()
    procs = []
    errs = [tempfile.TemporaryFile("w+") for _ in range(nprocs)]  # a pipe could fill up
    for rank in range(nprocs):
        env = dict(os.environ)
        for key in ("PYCOLLECTIVE_STORE_HOSTED", "TORCHELASTIC_USE_AGENT_STORE"):
            env.pop(key, None)
        env.update(
            RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            PYCOLLECTIVE_TRANSPORT="tcp",
        )  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pycollective.cli.calibrate", json.dumps(spec)],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stderr=errs[rank],
                text=True,
            )
        )
    try:
        out, _ = procs[0].communicate(timeout=timeout)
        for proc in procs[1:]:
            proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the ranks took longer than {timeout:.0f} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        for rank, proc in enumerate(procs):
            if proc.returncode != 0:
                errs[rank].seek(0)
                tail = errs[rank].read()[-2000:]
                raise RuntimeError(f"rank {rank} exited with {proc.returncode}:\n{tail}")
    finally:
        for f in errs:
            f.close()
    lines = [ln for ln in out.splitlines() if ln.startswith("CALIBRATE ")]
    if not lines:
        raise RuntimeError("rank 0 reported nothing")
    return json.loads(lines[-1][len("CALIBRATE ") :])


def _worker(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    groups.init_process_group()
    try:
        res = calibrate(
            save=spec["save"], budget=spec["budget"], force=spec["force"], load=spec["load"]
        )
        if groups.get_rank() == 0:
            print("CALIBRATE " + json.dumps(res), flush=True)
    finally:
        groups.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
