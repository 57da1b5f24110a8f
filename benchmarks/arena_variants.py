"""The compiled arena's all_reduce under several settings, alternating in the same ranks.

Two (or -n) forked ranks, rank r pinned to CPU r % cores, share one arena segment; every
variant is a NativeArena over it (its own small/chunk/non-temporal thresholds), and the
variants take turns repetition by repetition, so load that comes and goes hits them
alike. A repetition is a batch of calls lasting about --batch-ms, timed on every rank
from a common phase and reported as the slowest rank's; each variant's median per size is
printed, with the machine's load before and after. No job, no TCP: the arena alone.

    python benchmarks/arena_variants.py -s 1M,4M,16M \\
        --variant old:262144:1048576:33554432 --variant c256k:262144:262144:33554432

A variant is name:small_bytes:chunk_bytes:nt_bytes[:spin_us] (NativeArena's thresholds;
spin_us: how long a waiting rank pause-spins before it yields, as set_spin takes it).
A variant whose name starts with "py" runs the Python arena (shm/collectives.py) with
its chunk_bytes instead; one whose name starts with "sc" runs all_reduce above small_bytes
by single copy (csrc/arena.c run_single: the peers' buffers read and written directly),
chunk_bytes at a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

from pycollective import _dtypes
from pycollective._reduce_ops import ReduceOp
from pycollective.shm import arena, collectives, native
from pycollective.transport import _wire

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def parse_variant(text: str) -> tuple[str, int, int, int, float | None]:
    name, small, chunk, nt, *spin = text.split(":")
    spin_us = float(spin[0]) if spin else None
    return name, parse_size(small), parse_size(chunk), parse_size(nt), spin_us


def _rank(args, name: str, nbytes: int, r: int, out) -> None:
    try:
        cores = os.cpu_count() or 1
        os.sched_setaffinity(0, {r % cores})
        if args.nice:
            os.nice(args.nice)  # negative (root): the ranks ahead of the machine's other load
        p = args.nprocs
        seg = arena.Segment.attach(name, nbytes)
        a = arena.Arena(seg, p, r, args.slot)
        a.ctrl[r * arena.WORDS + arena.PID] = os.getpid()
        variants = []
        python: dict[native.NativeArena, int] = {}
        single: list[tuple[native.NativeArena, int]] = []
        for v in map(parse_variant, args.variant):
            na = native.NativeArena(a, v[1], v[2], v[3])
            if v[4] is not None:  # a pinned rank's pause-spin before it yields, in us
                na.c.set_spin(
                    a.pure_spins, int(a.yield_seconds * 1e9), a.oversubscribed, int(v[4] * 1e3)
                )
            variants.append((v[0], na))
            if v[0].startswith("py"):  # run by the Python arena instead (small_bytes: its own)
                python[na] = v[2]
            if v[0].startswith("sc"):  # single copy above small_bytes, chunk_bytes a piece
                single.append((na, v[2]))
        dtype = _dtypes.BY_NAME["float32"]
        deadline = time.monotonic() + args.timeout

        def poll(target: int) -> None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {r} waited for phase {target} too long")

        def check(q: int, target: int) -> None:
            raise AssertionError(f"rank {r}: peer {q} announced another call")

        seq = 0
        next_buf = 0

        sync = collectives.Sync(a, poll)
        red = collectives.reducer(ReduceOp.SUM, dtype)

        def call(na: native.NativeArena, x: np.ndarray) -> None:
            nonlocal seq, next_buf
            if na in python:  # the Python arena, with this variant's chunk
                a.chunk_bytes = python[na]
                a.next_buf = next_buf
                collectives.all_reduce(a, x, red, sync)
                next_buf = a.next_buf
                seq += 1
                return
            hdr = (_wire.KIND_CODE["all_reduce"], dtype.code, int(x.size), -1, int(ReduceOp.SUM), 0)
            plan = na.plan(hdr[0], dtype.code, int(ReduceOp.SUM), -1, 0, hdr)
            na.c.next_buf = next_buf  # the variants share one arena: hand its state over
            na.run(plan, None, x, seq, None, poll, check, lambda: None)
            next_buf = na.c.next_buf
            seq += 1

        def barrier(na: native.NativeArena) -> None:
            nonlocal seq
            hdr = (_wire.KIND_CODE["barrier"], dtype.code, 0, -1, 0, 0)
            plan = na.plan(hdr[0], dtype.code, 0, -1, 0, hdr)
            na.run(plan, None, None, seq, None, poll, check, lambda: None)
            seq += 1

        first = variants[0][1]
        barrier(first)  # every rank's PID word written
        pids = [int(a.ctrl[q * arena.WORDS + arena.PID]) for q in range(p)]
        for na, piece in single:
            na.c.set_single_copy(1, piece, pids)  # C still leaves small calls to the arena
        results: dict[str, dict[int, list[float]]] = {v: {} for v, _ in variants}
        for size in map(parse_size, args.sizes.split(",")):
            x = np.ones(size // 4, np.float32)
            # calls per batch: from one timed call of the first variant, agreed by rank 0
            for na in (v for _, v in variants):
                for _ in range(args.warmup):
                    call(na, x)
            barrier(first)
            t0 = time.perf_counter()
            call(first, x)
            per = time.perf_counter() - t0
            calls = np.array([max(1, int(args.batch_ms / 1e3 / max(per, 1e-7)))], np.int64)
            shared = np.frombuffer(seg.mm, np.int64, 1, 0)  # header word 0: unused scratch
            if r == 0:
                shared[0] = int(calls[0])
            barrier(first)
            n_calls = int(shared[0])
            barrier(first)
            for _rep in range(args.reps):
                for vname, na in variants:
                    barrier(first)
                    w0 = sum(v.c.wait_ns for _, v in variants)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(n_calls):
                        call(na, x)
                    dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
                    waited = (sum(v.c.wait_ns for _, v in variants) - w0) / 1e9
                    results[vname].setdefault(size, []).append(
                        (dt / n_calls, waited / n_calls, cpu / n_calls)
                    )
        out.put((r, results))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nprocs", type=int, default=2)
    ap.add_argument("-s", "--sizes", default="1M,4M,16M")
    ap.add_argument(
        "--slot", type=parse_size, default=None, help="slot bytes (default: slot_bytes_for)"
    )
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-ms", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--nice", type=int, default=0, help="niceness increment of the ranks (-20: as if alone)"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    if args.slot is None:
        args.slot = arena.slot_bytes_for(args.nprocs, cores)
    nbytes = arena.layout(args.nprocs, args.slot)[2]
    seg = arena.Segment.create(nbytes)
    arena.Arena(seg, args.nprocs, 0, args.slot).init_header()
    load0 = os.getloadavg()[0]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(args, seg.name, nbytes, r, out)) for r in range(args.nprocs)
    ]
    try:
        for proc in procs:
            proc.start()
        got = dict(out.get(timeout=args.timeout + 10) for _ in range(args.nprocs))
    finally:
        seg.unlink()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    load1 = os.getloadavg()[0]
    for r, res in got.items():
        if isinstance(res, str):
            print(f"rank {r}: {res}", file=sys.stderr)
            return 1
    # slowest rank per repetition
    summary: dict[str, dict[str, float]] = {}
    for vname in got[0]:
        summary[vname] = {}
        for size, times in got[0][vname].items():
            slowest = sorted(max(got[q][vname][size][i][0] for q in got) for i in range(len(times)))
            waits = [
                got[0][vname][size][i][1] / got[0][vname][size][i][0] for i in range(len(times))
            ]
            summary[vname][str(size)] = {
                "min": slowest[0],
                "p25": slowest[len(slowest) // 4],
                "median": statistics.median(slowest),
                "rank0_wait_fraction": statistics.median(waits),
                # CPU seconds a call, the median over batches of the busier rank: steadier
                # than wall time on a shared machine (a descheduled rank costs none)
                "cpu_median": statistics.median(
                    max(got[q][vname][size][i][2] for q in got) for i in range(len(times))
                ),
            }
    print(f"load {load0:.1f} -> {load1:.1f}, slot {args.slot}, p={args.nprocs}, nice {args.nice}")
    sizes = list(next(iter(summary.values())))
    print("variant".ljust(12) + "".join(f"{int(s) >> 10:>31}K" for s in sizes))
    print(" " * 12 + "min/p25/median us, wait, cpu" * len(sizes))
    for vname, row in summary.items():
        print(
            vname.ljust(12)
            + "".join(
                "{:>7.0f}{:>7.0f}{:>7.0f}{:>5.0%}{:>6.0f}".format(
                    row[s]["min"] * 1e6,
                    row[s]["p25"] * 1e6,
                    row[s]["median"] * 1e6,
                    row[s]["rank0_wait_fraction"],
                    row[s]["cpu_median"] * 1e6,
                )
                for s in sizes
            )
        )
    if args.json:
        record = {
            "load": [load0, load1],
            "slot": args.slot,
            "p": args.nprocs,
            "variants": args.variant,
            "nice": args.nice,
            "seconds": summary,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
