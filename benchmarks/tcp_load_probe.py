"""A large all_reduce over TCP on a busy machine: where a call's time goes, ours against gloo.

    python benchmarks/tcp_load_probe.py [--size 64M] [--reps 8] [--stress 6]
        [--modes tcp,tcp-norecv,gloo] [--bind-to core] [--json FILE]

Two ranks on this host started by OpenMPI's mpirun (its default binding: a core each, as
compare_peers.py's tcp job), PYCOLLECTIVE_TRANSPORT=tcp; `stress-ng --cpu N` beside them
with --stress (in a session of its own, as compare_peers.py --stress). The modes take turns
call by call in the same ranks, our barrier before each call (gloo's own before gloo's
with --gloo-barrier, as compare_peers.py times it):

  tcp          pycollective as it is;
  tcp-nosend   without the send helper (transport/tcp/sender.py);
  tcp-norecv   without the receive helper (transport/tcp/receiver.py);
  tcp-plain    without either (one thread reads, reduces and writes);
  tcp-nosink   the receive helper for plain payloads only (a reduction reads its own);
  tcp-pNk[-wM] the receive helper reading N KiB pieces (N a power of two up to 1024), at
               most M (default receiver.WINDOWS) ahead of the reduction;
  tcp-slice    as tcp, every thread of the rank asking the scheduler (EEVDF, Linux 6.12+:
               sched_setattr's sched_runtime) for a 0.3 ms slice instead of the default,
               for its calls only (an experiment: x86-64 Linux only);
  gloo         torch.distributed's gloo.

Per call and rank: wall time, the process's CPU time (all threads), the seconds its threads
spent runnable without a core (/proc/self/task/*/schedstat, summed over threads) and
voluntary / involuntary context switches; for ours, the wall and queued time of each of
the 2-rank ring's rounds (the reduce-scatter's exchange, the all-gather's). Printed:
medians over calls of rank 0's numbers, the wall of the slowest rank, and the load around
the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

# What each of our modes switches off, as (module, constant, value) set before its calls.
_NEVER = 1 << 62
OURS = {
    "tcp": (),
    "tcp-nosend": (("sending", "HELPER_BYTES", _NEVER),),
    "tcp-norecv": (("receiving", "RECV_HELPER_BYTES", _NEVER),),
    "tcp-plain": (("sending", "HELPER_BYTES", _NEVER), ("receiving", "RECV_HELPER_BYTES", _NEVER)),
    "tcp-nosink": (("receiving", "SINK_HELPER_BYTES", _NEVER),),
}
MODES = (*OURS, "tcp-pNk[-wM]", "tcp-slice", "gloo")
SLICE_NS = 300_000
KEYS = ("wall", "cpu", "queued", "vcsw", "ivcsw")


def _settings(mode: str) -> tuple[tuple[str, str, int], ...] | None:
    """What our `mode` sets (module, constant, value), or None if it is not ours."""
    if mode in OURS:
        return OURS[mode]
    m = re.fullmatch(r"tcp-p(\d+)k(?:-w(\d+))?", mode)
    if m is None or int(m[1]) not in [1 << i for i in range(11)]:
        return None
    out = [("receiving", "HELPER_PIECE_BYTES", int(m[1]) << 10)]
    if m[2]:
        out.append(("receiver", "WINDOWS", int(m[2])))
    return tuple(out)


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# ---------------------------------------------------------------------------- the ranks


def _queued() -> float:
    """Seconds this process's threads have waited runnable on a run queue, summed."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def _sample() -> tuple[float, ...]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (time.perf_counter(), time.process_time(), _queued(), r.ru_nvcsw, r.ru_nivcsw)


def _set_slice(ns: int) -> None:
    """Ask for an `ns` slice (0: the default) for every thread of this process."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    # struct sched_attr, its first version: size, policy (SCHED_OTHER), flags, nice,
    # priority, runtime (the slice), deadline, period
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, 0, 0, 0, 0, ns, 0, 0))
    for task in os.listdir("/proc/self/task"):
        if libc.syscall(314, int(task), attr, 0) != 0:  # sched_setattr on x86-64
            raise OSError(ctypes.get_errno(), "sched_setattr")


def _rank(cfg: dict) -> None:
    import numpy as np
    import torch.distributed as td

    import pycollective as dist
    import torch
    from pycollective.transport.tcp import receiver, receiving, sending
    from pycollective.transport.tcp.transport import TCPTransport

    rounds: list[tuple[float, float]] = []  # each exchange's wall and queued seconds
    exchange = TCPTransport.exchange

    def timed_exchange(self, *a, **k):  # type: ignore[no-untyped-def]
        t0, q0 = time.perf_counter(), _queued()
        try:
            return exchange(self, *a, **k)
        finally:
            rounds.append((time.perf_counter() - t0, _queued() - q0))

    TCPTransport.exchange = timed_exchange  # type: ignore[method-assign]

    modules = {"sending": sending, "receiving": receiving, "receiver": receiver}
    sets = {mode: _settings(mode) or () for mode in cfg["modes"]}
    defaults = {(m, c): getattr(modules[m], c) for s in sets.values() for m, c, _ in s}
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    if "gloo" in cfg["modes"]:
        td.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{cfg['gloo_port']}", rank=rank,
            world_size=size,
        )  # fmt: skip
    n = cfg["size"] // 4
    x, t = np.ones(n, np.float32), torch.ones(n)
    rows: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KEYS} for m in cfg["modes"]}
    for _ in range(cfg["reps"]):
        for mode in cfg["modes"]:
            for (m, c), v in defaults.items():
                setattr(modules[m], c, v)
            for m, c, v in sets[mode]:
                setattr(modules[m], c, v)
            if "tcp-slice" in cfg["modes"]:
                _set_slice(SLICE_NS if mode == "tcp-slice" else 0)
            if mode == "gloo" and cfg["own_barrier"]:
                td.barrier()  # as compare_peers.py times it: each library's own barrier
            else:
                dist.barrier()
            rounds.clear()
            s0 = _sample()
            if mode == "gloo":
                td.all_reduce(t)
            else:
                dist.all_reduce(x)
            s1 = _sample()
            for key, v0, v1 in zip(KEYS, s0, s1, strict=True):
                rows[mode][key].append(v1 - v0)
            if mode != "gloo":  # a 2-rank ring: the reduce-scatter's round, the all-gather's
                for i, (wall, queued) in enumerate(rounds[:2]):
                    rows[mode].setdefault(f"r{i + 1}_wall", []).append(wall)
                    rows[mode].setdefault(f"r{i + 1}_queued", []).append(queued)
            x[:] = 1
            t.fill_(1)
    out = {}
    for mode, row in rows.items():
        slowest = np.array(row["wall"], np.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[mode] = {k: statistics.median(v) for k, v in row.items()}
        out[mode]["wall_slowest"] = statistics.median(slowest.tolist())
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- the driver


def _run(args: argparse.Namespace, mpirun: str) -> dict:
    import compare_peers as cp

    fd, name = tempfile.mkstemp(prefix="tcp_load_probe.", suffix=".json")  # private
    os.close(fd)
    out = Path(name)
    cfg = {"size": args.size, "reps": args.reps, "modes": args.modes, "out": str(out),
           "gloo_port": cp.free_port(), "own_barrier": args.gloo_barrier}  # fmt: skip
    env = dict(os.environ, PYCOLLECTIVE_TRANSPORT="tcp", PYTHONUNBUFFERED="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cp.free_port()))  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    cmd = [mpirun, "-n", "2"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if args.bind_to:
        cmd += ["--bind-to", args.bind_to]
    for k in ("PYCOLLECTIVE_TRANSPORT", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH"):
        cmd += ["-x", k]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--rank-worker", json.dumps(cfg)]
    load0 = os.getloadavg()[0]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    load1 = os.getloadavg()[0]
    if proc.returncode or not out.stat().st_size:
        why = proc.stderr[-4000:]
        raise SystemExit(f"tcp_load_probe: the job failed ({proc.returncode}):\n{why}")
    cells = json.loads(out.read_text())
    out.unlink()
    return {"load": [load0, load1], "cells": cells}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rank-worker"]:
        _rank(json.loads(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--stress", type=int, default=0, help="stress-ng --cpu N beside the job")
    ap.add_argument("--modes", default="tcp,tcp-norecv,gloo")
    ap.add_argument("--bind-to", default="", help="mpirun --bind-to (default: mpirun's own)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--gloo-barrier",
        action="store_true",
        help="gloo's own barrier before gloo's calls, as compare_peers.py (default: ours)",
    )
    ap.add_argument("--json", help="write every run's cells here")
    args = ap.parse_args(argv)
    args.size = _parse_size(args.size)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES and _settings(m) is None]
    if bad or not args.modes:
        ap.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    if not 1 <= args.reps <= 1000 or not 1 <= args.runs <= 100:
        ap.error("--reps must be in 1..1000 and --runs in 1..100")
    import compare_peers as cp

    mpirun = cp.find_openmpi()
    if mpirun is None or shutil.which("stress-ng") is None and args.stress:
        raise SystemExit("tcp_load_probe: needs OpenMPI's mpirun (and stress-ng for --stress)")
    result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "size": args.size,
              "stress": args.stress, "reps": args.reps, "runs": []}  # fmt: skip
    stress = cp.start_stress(args.stress)
    try:
        for _ in range(args.runs):
            run = _run(args, mpirun)
            result["runs"].append(run)
            print(f"\n{args.size >> 20} MiB, load {run['load'][0]:.1f} -> {run['load'][1]:.1f}")
            print(f"{'mode':<12} {'wall ms':>8} {'cpu ms':>7} {'queued':>7} "
                  f"{'vcsw':>5} {'ivcsw':>5}   round 1 / 2: wall (queued) ms")  # fmt: skip
            for mode, c in run["cells"].items():
                split = "   " + " / ".join(
                    f"{c[f'r{i}_wall'] * 1e3:.0f} ({c[f'r{i}_queued'] * 1e3:.0f})"
                    for i in (1, 2) if f"r{i}_wall" in c
                )  # fmt: skip
                print(f"{mode:<12} {c['wall_slowest'] * 1e3:8.1f} {c['cpu'] * 1e3:7.1f} "
                      f"{c['queued'] * 1e3:7.1f} {c['vcsw']:5.0f} {c['ivcsw']:5.0f}"
                      + split)  # fmt: skip
    finally:
        cp.stop_stress(stress)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
