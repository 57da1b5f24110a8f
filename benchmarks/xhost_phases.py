"""Where a cross-host all_reduce's time goes: per phase, wall against CPU against waiting.

    sudo python benchmarks/xhost_phases.py [--per-host 2] [--sizes 16M,64M] [--reps 8]
        [--runs 3] [--modes auto,leaders,ring,gloo] [--json FILE]

Two network-namespace hosts (tools/nethosts.py), the ranks started by OpenMPI's mpirun
through the same `ip netns exec` agent as compare_peers.py's cross-host job
(_crosshost.py), --per-host ranks on each. The modes take turns call by call in the same
ranks, a barrier before each call:

  auto      the default group as a user gets it (across hosts with several ranks on a
            host: runners/hierarchical.py: in-host reduce-scatter over shared memory,
            all-reduce of a block across hosts over TCP, in-host all-gather);
  leaders   the hierarchy's leader variant (reduce to each host's first rank, all-reduce
            among those, broadcast), forced on an even layout;
  ring      the flat ring over TCP across every rank;
  recursive_doubling, halving_doubling
            those flat algorithms forced, the same way;
  gloo      torch.distributed's gloo (its flat ring over TCP, loopback inside a host);
  auto_py, ring_py
            auto and ring with TCP reductions in Python (the window and numpy, the
            reference and the default) where auto and ring use the compiled
            read-and-reduce (csrc/sockio.c): run with PYCOLLECTIVE_TCP_NATIVE=1 to
            compare the two call by call (without it both are the Python path);
  auto_seg4, auto_seg8
            auto on 4 (8) consecutive slices of the buffer, one call each: what splitting
            a large call into segments run one after another costs or buys;
  auto_pipe2, auto_pipe4
            a prototype of a pipelined hierarchy (2 hosts x 2 ranks, sizes divisible by
            4 x segments; defined here only): 2 (4) segments, the in-host steps on a
            helper thread while the cross-host steps of earlier segments run.

Per call and rank: wall time, the process's CPU time (all its threads), the time it was
blocked waiting for peers (select() and the arena's waits, as the timeline measures it:
observe/timeline.WAIT) and context switches; for auto and leaders the same per phase
(the hierarchy's steps, timed by wrapping them in this process only). What is left of
the wall after CPU and blocking is time spent runnable without a core. Beside them, the
machine's busy and softirq CPU seconds over the call (/proc/stat, every process's: the
other jobs' too), to see work done for the call outside its processes, and the seconds
the rank's threads spent runnable on a run queue (schedstat, summed over its threads;
unlike "blocked", also seen for gloo), and "idle": the core-ms no process used over rank
0's wall of the phase (cores x wall - machine busy), the most a pipeline overlapping the
phases could put to work on this machine. Printed: medians
over calls of rank 0's numbers (the slowest rank's wall per call for the totals), each run
with the load around it. PYCOLLECTIVE_* variables set here reach every rank.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

MODES = (
    "auto", "leaders", "ring", "recursive_doubling", "halving_doubling", "gloo", "auto_py",
    "ring_py", "auto_seg4", "auto_seg8", "auto_pipe2", "auto_pipe4",
)  # fmt: skip
KEYS = ("wall", "cpu", "blocked", "csw", "machine_busy", "machine_softirq", "queued")


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# ---------------------------------------------------------------------------- the ranks


def _rank(cfg: dict) -> None:
    import numpy as np

    import pycollective as dist
    from pycollective.observe.timeline import WAIT
    from pycollective.runners import executor
    from pycollective.runners import hierarchical as hier

    WAIT.on = True  # waits add their blocked seconds to WAIT.total
    if cfg.get("pin"):  # one core per rank, round robin over the machine's (all threads)
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ["OMPI_COMM_WORLD_RANK"]) % len(cpus)]})
    phases: dict[str, list[float]] = {}
    leaders = [False]
    pipeline = [0]  # segments of the auto_pipe modes

    tick = os.sysconf("SC_CLK_TCK")

    def machine() -> tuple[float, float]:
        """The whole machine's CPU seconds so far: busy (user, nice, system, irq,
        softirq) and of those softirq (the kernel's packet work, wherever it ran)."""
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / tick, v[6] / tick

    def queued() -> float:
        """Seconds this process's threads have waited on a run queue (runnable, no
        core), summed over its threads (/proc/self/task/*/schedstat)."""
        total = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended meanwhile
        return total / 1e9

    def sample() -> tuple[float, float, float, int, float, float, float]:
        r = resource.getrusage(resource.RUSAGE_SELF)
        busy, softirq = machine()
        return (time.perf_counter(), time.process_time(), WAIT.total,
                r.ru_nvcsw + r.ru_nivcsw, busy, softirq, queued())  # fmt: skip

    def timed(name: str, fn, *a, **k):
        s0 = sample()
        out = fn(*a, **k)
        s1 = sample()
        for key, v0, v1 in zip(KEYS, s0, s1, strict=True):
            phases.setdefault(f"{name}:{key}", []).append(v1 - v0)
        return out

    intra, cross, run = hier.Hierarchy._intra, hier.Hierarchy._cross, hier.Hierarchy.run

    def run_(self, arrays, dtype, kernel, header, deadline, label, transport, pool):
        if pipeline[0]:
            return pipelined(self, arrays["data"], dtype, kernel, header, deadline, label,
                             transport, pool, pipeline[0])  # fmt: skip
        if not leaders[0]:
            return run(self, arrays, dtype, kernel, header, deadline, label, transport, pool)
        call = hier._Call(dtype, kernel, header, deadline, label, transport, pool)
        saved = self.cross
        self.cross = tuple(h[0] for h in self.layout.hosts)  # the leaders' group
        try:
            self._run_leaders(arrays["data"], call)
        finally:
            self.cross = saved

    def pipelined(self, data, dtype, kernel, header, deadline, label, transport, pool, segs):
        """Prototype, measured here only: the call cut in `segs` segments, the in-host
        steps on a helper thread (reduce-scatter of every segment, then each segment's
        all-gather once its cross-host step is done) while this thread runs the cross-host
        steps. The helper's arena polls no transport (the transport's progress engine is
        this thread's): no abort notices nor lost peers reach it, the deadline does."""
        L, H = len(self.intra), len(self.cross)
        per = -(-data.size // segs)  # ceil
        seg = -(-per // L) * L
        parts = [data[i : i + seg] for i in range(0, data.size, seg)]
        assert all(p.size % L == 0 for p in parts), "prototype: sizes divisible by L"
        blocks = [np.empty(p.size // L, data.dtype) for p in parts]
        arena = copy.copy(self.arena)
        arena.transport = None
        reduced = [threading.Event() for _ in parts]
        crossed = [threading.Event() for _ in parts]
        failed: list[BaseException] = []

        def helper() -> None:
            try:
                for k, p in enumerate(parts):
                    arena.run("reduce_scatter", {"input": p, "output": blocks[k]}, dtype,
                              kernel, header, deadline, label)  # fmt: skip
                    reduced[k].set()
                for k, p in enumerate(parts):
                    crossed[k].wait()
                    if failed:
                        return
                    arena.run("all_gather", {"input": blocks[k], "output": p}, dtype,
                              kernel, header, deadline, label)  # fmt: skip
            except BaseException as exc:
                failed.append(exc)
                for e in reduced:
                    e.set()

        thread = threading.Thread(target=helper, daemon=True)
        thread.start()
        ranks = tuple(self.global_ranks[r] for r in self.cross)
        try:
            for k, b in enumerate(blocks):
                reduced[k].wait()
                if failed:
                    break
                algo = hier.flat_algorithm(H, b.size, dtype.itemsize, self.tuning.params("tcp"))
                plan = hier._plan("all_reduce", algo, self.local_host, H, b.size, 1 + 3 * k)
                executor.run_schedule(plan, {"data": b}, dtype, kernel, transport, ranks,
                                      header, deadline, pool, label)  # fmt: skip
                crossed[k].set()
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            for e in crossed:
                e.set()
            thread.join()
        if failed:
            raise failed[0]

    hier.Hierarchy._intra = lambda self, c, *a, **k: timed(c, intra, self, c, *a, **k)
    hier.Hierarchy._cross = lambda self, *a, **k: timed("cross", cross, self, *a, **k)
    hier.Hierarchy.run = run_
    fold_codes, python_only = executor.fold_codes, [False]
    # the *_py modes: no receive says what its reduction is, so the transport reduces
    # through the sink in Python
    executor.fold_codes = lambda op, dtype: None if python_only[0] else fold_codes(op, dtype)

    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    if "gloo" in cfg["modes"]:
        import torch.distributed as td

        import torch

        td.init_process_group(
            "gloo", init_method=f"tcp://{cfg['addr']}:{cfg['gloo_port']}", rank=rank,
            world_size=size,
        )  # fmt: skip
    out: dict[str, dict] = {}
    for nbytes in cfg["sizes"]:
        n = nbytes // 4
        x = np.ones(n, np.float32)
        t = torch.ones(n) if "gloo" in cfg["modes"] else None
        rows: dict[str, dict[str, list[float]]] = {m: {} for m in cfg["modes"]}
        for _ in range(cfg["reps"]):
            for mode in cfg["modes"]:
                leaders[0] = mode == "leaders"
                pipeline[0] = int(mode.removeprefix("auto_pipe")) if "_pipe" in mode else 0
                python_only[0] = mode.endswith("_py")
                phases.clear()
                dist.barrier()
                s0 = sample()
                if mode == "gloo":
                    td.all_reduce(t)
                elif mode.startswith("auto_seg"):
                    for part in np.array_split(x, int(mode.removeprefix("auto_seg"))):
                        dist.all_reduce(part)
                else:
                    algo = mode.removesuffix("_py")
                    algo = "auto" if algo.startswith("auto_pipe") else algo
                    dist.all_reduce(x, algorithm=None if algo in ("auto", "leaders") else algo)
                s1 = sample()
                for key, v0, v1 in zip(KEYS, s0, s1, strict=True):
                    rows[mode].setdefault(key, []).append(v1 - v0)
                for key, v in phases.items():
                    rows[mode].setdefault(key, []).append(sum(v))
                if mode != "gloo" and not np.all(x == size):  # every mode's answer, untimed
                    raise SystemExit(f"rank {rank}: {mode} gave a wrong sum")
                x[:] = 1
                if t is not None:
                    t.fill_(1)
        for mode, row in rows.items():
            walls = dist_max(dist, np, row["wall"])  # the slowest rank's, call by call
            med = {k: statistics.median(v) for k, v in row.items()}
            med["wall_slowest"] = statistics.median(walls)
            med["wall_slowest_range"] = [min(walls), max(walls)]  # the spread over calls
            out[f"{nbytes}/{mode}"] = med
    # a file each: mpirun interleaves the ranks' stdout
    Path(cfg["outdir"], f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def dist_max(dist, np, values: list[float]) -> list[float]:
    a = np.array(values, np.float64)
    dist.all_reduce(a, op=dist.ReduceOp.MAX)
    return a.tolist()


# ---------------------------------------------------------------------------- the driver


def _load() -> float:
    return os.getloadavg()[0]


def _one_run(args: argparse.Namespace, per_host: int) -> dict:
    import _crosshost as xh
    from tools import nethosts

    mpirun = shutil.which("mpirun")
    why = xh.why_not(mpirun)
    if why:
        raise SystemExit(f"xhost_phases: cannot run here: {why}")
    assert mpirun is not None
    with nethosts.NetHosts(xh.HOSTS, rate=args.rate) as hosts:
        workdir = xh.private_dir()
        agent, hostfile = xh.write_launch_files(workdir, hosts, per_host)
        cfg = {
            "sizes": args.sizes, "reps": args.reps, "modes": args.modes, "pin": args.pin,
            "addr": hosts.addrs[0], "gloo_port": 29500 + os.getpid() % 400,
            "outdir": str(workdir),
        }  # fmt: skip
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYCOLLECTIVE_SECRET=secrets.token_hex(16))
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])
        )
        worker = [sys.executable, str(Path(__file__).resolve()), "--rank-worker", json.dumps(cfg)]
        cmd = xh.mpirun_command(
            mpirun, hosts, per_host, agent, hostfile, 29100 + os.getpid() % 400, worker,
            [a for k in env if k.startswith("PYCOLLECTIVE_") for a in ("-x", k)],
        )  # fmt: skip
        load0 = _load()
        proc = hosts.popen(
            0, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        out, err = proc.communicate(timeout=args.timeout)
        load1 = _load()
        ranks = {}
        for f in workdir.glob("rank*.json"):
            ranks[int(f.stem.removeprefix("rank"))] = json.loads(f.read_text())
        shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode or 0 not in ranks:
        raise SystemExit(f"xhost_phases: the job failed (exit {proc.returncode}):\n{err[-4000:]}")
    return {"load": [load0, load1], "cells": ranks[0], "ranks": ranks}


def _print_run(run: dict, per_host: int) -> None:
    # idle: core-ms no process used over rank 0's wall (cores x wall - machine busy): the
    # most that overlapping the phases (a pipeline) could put to work
    cores = os.cpu_count() or 1
    rate = f", links {run['rate']}" if run.get("rate") else ""
    load = f"load {run['load'][0]:.1f} -> {run['load'][1]:.1f}"
    print(f"\n2 hosts x {per_host} rank(s){rate}, {load}")
    print(f"{'size/mode':<22} {'phase':<16} {'wall ms':>9} {'cpu ms':>8} {'blocked':>8} "
          f"{'no core':>8} {'csw':>6} {'machine':>8} {'softirq':>8} {'queued':>7} "
          f"{'idle':>6}")  # fmt: skip
    for key, cell in run["cells"].items():
        names = ["total"] + sorted({k.split(":")[0] for k in cell if ":" in k})
        for name in names:
            pre = "" if name == "total" else name + ":"
            wall = cell["wall_slowest"] if name == "total" else cell[pre + "wall"]
            cpu, blocked = cell[pre + "cpu"], cell[pre + "blocked"]
            rest = max(0.0, cell[pre + "wall"] - cpu - blocked)
            idle = max(0.0, cores * cell[pre + "wall"] - cell[pre + "machine_busy"])
            spread = cell.get("wall_slowest_range") if name == "total" else None
            if spread:  # the slowest rank's wall: fastest-slowest call
                name = f"total {spread[0] * 1e3:.0f}-{spread[1] * 1e3:.0f}"
            print(f"{key:<22} {name:<16} {wall * 1e3:9.1f} {cpu * 1e3:8.1f} "
                  f"{blocked * 1e3:8.1f} {rest * 1e3:8.1f} {cell[pre + 'csw']:6.0f} "
                  f"{cell[pre + 'machine_busy'] * 1e3:8.0f} "
                  f"{cell[pre + 'machine_softirq'] * 1e3:8.0f} "
                  f"{cell[pre + 'queued'] * 1e3:7.0f} "
                  f"{idle * 1e3:6.0f}")  # fmt: skip
    print("per rank, wall ms (blocked ms) of each phase:")
    for r, cells in sorted(run["ranks"].items()):
        parts = []
        for key, cell in cells.items():
            names = sorted({k.split(":")[0] for k in cell if ":" in k})
            steps = " ".join(
                f"{n} {cell[n + ':wall'] * 1e3:.0f} ({cell[n + ':blocked'] * 1e3:.0f})"
                for n in names
            )
            parts.append(f"{key}: {cell['wall'] * 1e3:.0f} {steps}".rstrip())
        print(f"  rank {r}: " + "; ".join(parts))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rank-worker"]:
        _rank(json.loads(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-host", default="2", help="ranks per host, e.g. 2 or 1,2")
    ap.add_argument("--sizes", default="16M,64M")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--modes", default="auto,leaders,ring,gloo")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--rate",
        help="shape every host's link (tools/nethosts.py), e.g. 1gbit: the link a "
        "resource of its own, as between real hosts (unshaped, it is this machine's CPU)",
    )
    ap.add_argument("--json", help="write every run's cells here")
    ap.add_argument(
        "--pin", action="store_true", help="pin rank r (all its threads) to core r mod cores"
    )
    args = ap.parse_args(argv)
    args.sizes = [_parse_size(s) for s in args.sizes.split(",")]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        ap.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    if not 1 <= args.reps <= 1000 or not 1 <= args.runs <= 100:
        ap.error("--reps must be in 1..1000 and --runs in 1..100")
    result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
              "sizes": args.sizes, "modes": args.modes, "reps": args.reps, "runs": []}  # fmt: skip
    for _ in range(args.runs):
        for per_host in [int(p) for p in args.per_host.split(",")]:
            run = _one_run(args, per_host)
            run["per_host"] = per_host
            run["rate"] = args.rate
            _print_run(run, per_host)
            result["runs"].append(run)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
