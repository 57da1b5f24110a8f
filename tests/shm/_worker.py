"""One rank of a shared-memory job (tests/shm/test_shm_jobs.py). Run by tests/_launch.

    python tests/shm/_worker.py SCENARIO [ARG]

Reports each step as a line `RESULT {json}` (error class, message, seconds taken, .peer).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

import pycollective as dist
from pycollective.runners import ArenaRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import attempt, mark, report, wait_for  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def info() -> None:
    g = dist.group.WORLD
    x = np.full(1000, RANK + 1, np.float64)
    dist.all_reduce(x)
    sub = dist.new_group(list(range(0, P, 2)))
    y = np.ones(10, np.int32)
    if RANK % 2 == 0:
        dist.all_reduce(y, group=sub)
    report(
        step="info",
        error=None,
        elapsed=0.0,
        shm=g.runner(ArenaRunner) is not None,
        sub_shm=sub.runner(ArenaRunner) is not None if RANK % 2 == 0 else None,
        algorithms=dist.algorithms("all_reduce"),
        ok=bool((x == P * (P + 1) / 2).all() and (RANK % 2 or (y == len(sub.ranks)).all())),
    )


def kill(victim: int, n: int) -> None:
    if RANK == victim:
        threading.Timer(0.4, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    data = np.ones(n, np.float32)
    last = time.monotonic()
    try:
        for _ in range(100000):
            last = time.monotonic()
            dist.all_reduce(data)
    except Exception as exc:  # noqa: BLE001
        report(
            step="loop",
            error=type(exc).__name__,
            msg=str(exc),
            elapsed=time.monotonic() - last,
            peer=getattr(exc, "peer", None),
        )


def kill_waiting(victim: int, n: int) -> None:
    """The peers wait (in the arena, compiled or not) for a rank that is killed instead of
    joining; each survivor reports the wall-clock time it raised, the victim when it died."""
    if RANK == victim:
        dist.barrier()
        time.sleep(0.3)  # the others are in all_reduce by now, waiting for this rank
        report(step="killed", error=None, elapsed=0.0, at=time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    try:
        dist.all_reduce(np.ones(n, np.float32))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report(step="call", error=type(exc).__name__, msg=str(exc), elapsed=0.0, at=time.time())
        return
    report(step="call", error=None, elapsed=0.0, at=time.time())


def mixed() -> None:
    """Rank 0 runs an arena collective while the others run one over TCP."""
    if RANK == 0:
        attempt("call", lambda: dist.all_reduce(np.ones(8, np.float32)))
    else:
        attempt(
            "call",
            lambda: dist.gather(
                np.ones(8, np.float32),
                dst=1 if P > 1 else 0,
                gather_list=[np.zeros(8, np.float32)] * P if RANK == 1 else None,
            ),
        )
    attempt("after", lambda: dist.all_reduce(np.ones(8, np.float32)))


def never() -> None:
    if RANK == P - 1:
        wait_for("timed-out", range(P - 1))  # out of the call until the others gave up on it
    else:
        attempt("call", lambda: dist.all_reduce(np.ones(1 << 16, np.float32)))
        mark("timed-out", RANK)


def hang() -> None:
    print("READY", flush=True)
    while True:
        dist.all_reduce(np.ones(1000, np.float32))
        time.sleep(0.01)


def shared_buffers() -> None:
    """Collectives on pycollective.empty() buffers: all shared (the direct path), only some
    shared (the arena path), views at an offset, fresh buffers each call. (Torch tensors
    from torch.from_numpy are the same memory; importing torch here would take seconds.)"""
    from pycollective.shm import shared

    def fill(a: np.ndarray, salt: int) -> None:
        a[...] = (np.arange(a.size) % 13 + RANK * 5 + salt).reshape(a.shape)

    def want(n: int, salt: int, dt, reduce=np.add) -> np.ndarray:
        every = [(np.arange(n) % 13 + q * 5 + salt).astype(dt) for q in range(P)]
        out = every[0]
        for x in every[1:]:
            out = reduce(out, x)
        return out

    ok = []
    for n in (1, 5000, 60_000):  # small path, one chunk, several chunks
        for dt in (np.float32, np.int64):
            a = dist.empty(n, dt)
            fill(a, 1)
            dist.all_reduce(a)
            ok.append(np.array_equal(a, want(n, 1, dt)))
            fill(a, 2)
            dist.all_reduce(a, op=dist.ReduceOp.MAX)
            ok.append(np.array_equal(a, want(n, 2, dt, np.maximum)))
            fill(a, 3)
            dist.reduce(a, dst=P - 1)
            mine = (np.arange(n) % 13 + RANK * 5 + 3).astype(dt)
            ok.append(np.array_equal(a, want(n, 3, dt) if RANK == P - 1 else mine))
    n = 40_000
    mixed = dist.empty(n, np.float64) if RANK % 2 == 0 else np.zeros(n, np.float64)
    fill(mixed, 4)  # some ranks shared, some not: the arena path
    dist.all_reduce(mixed)
    ok.append(np.array_equal(mixed, want(n, 4, np.float64)))
    big = dist.empty((3, n), np.float32)  # a view at an offset in its block
    fill(big[1], 5)
    dist.all_reduce(big[1], op=dist.ReduceOp.AVG)
    ok.append(np.allclose(big[1], want(n, 5, np.float64) / P))
    for i in range(8):  # a fresh buffer per call: peers' cached mappings stay bounded
        fresh = dist.empty(n, np.float32)
        fill(fresh, i)
        dist.all_reduce(fresh)
        ok.append(np.array_equal(fresh, want(n, i, np.float32)))
    maps = (
        len(dist.group.WORLD.runner(ArenaRunner).local_group.peer_maps)
        if dist.group.WORLD.runner(ArenaRunner) is not None
        else 0
    )
    report(
        step="shared",
        error=None,
        elapsed=0.0,
        ok=all(ok),
        failed=[i for i, good in enumerate(ok) if not good],
        maps=maps,
        shared_alive=len(shared._REGISTRY),
    )


def shared_kill() -> None:
    """Every rank holds a shared buffer it used in a collective; then the last is killed."""
    a = dist.empty(1 << 18, np.float32)
    a[:] = 1
    dist.all_reduce(a)
    report(step="used", error=None, elapsed=0.0, ok=bool((a == P).all()))
    if RANK == P - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)


def single_copy() -> None:
    """Whether the group agreed on single copy, and all_reduce on ordinary arrays above
    and below its threshold (and on a shared buffer on one rank only) against numpy."""
    from pycollective.runners.native import NativeArenaRunner

    x = np.ones(4, np.float32)
    dist.all_reduce(x)
    runner = dist.group.WORLD.runner(NativeArenaRunner)
    pids = runner.local_group.single_copy_pids if runner is not None else None
    ok = True
    # float32 counts: below the arena's small calls, past them (the pipeline), past
    # all_reduce's single-copy threshold (runners/native.py)
    for n in (1000, 65536, 65537, 1 << 20, (1 << 20) + 3):
        for dt in (np.float32, np.int64):
            every = [np.arange(n, dtype=dt) * (q + 1) + q for q in range(P)]
            y = every[RANK].copy()
            dist.all_reduce(y)
            ok &= bool(np.array_equal(y, sum(every[1:], every[0])))
    s = dist.empty(1 << 18, np.float32) if RANK == 0 else np.zeros(1 << 18, np.float32)
    s[:] = RANK + 1
    dist.all_reduce(s)
    ok &= bool((s == P * (P + 1) / 2).all())
    report(step="single", error=None, elapsed=0.0, ok=ok, agreed=pids is not None)


def main() -> None:
    scenario, *args = sys.argv[1:]
    report(step="pid", error=None, elapsed=0.0, pid=os.getpid())
    if attempt("init", dist.init_process_group) is not None:
        return
    if scenario == "info":
        info()
    elif scenario == "kill":
        kill(int(args[0]), int(args[1]))
    elif scenario == "kill_waiting":
        kill_waiting(int(args[0]), int(args[1]))
        return  # the survivors exit without destroy (their peer is gone)
    elif scenario == "mixed":
        mixed()
    elif scenario == "never":
        never()
    elif scenario == "hang":
        hang()
    elif scenario == "shared":
        shared_buffers()
    elif scenario == "shared_kill":
        shared_kill()
        return  # the survivors exit without destroy (their peer is gone)
    elif scenario == "single":
        single_copy()
    elif scenario == "raise":
        dist.all_reduce(np.ones(4, np.float32))
        raise RuntimeError("deliberate")
    t0 = time.monotonic()
    dist.destroy_process_group()
    report(step="destroy", error=None, elapsed=time.monotonic() - t0)


if __name__ == "__main__":
    main()
