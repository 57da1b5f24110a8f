"""One rank of a shared-memory job (tests/shm/test_shm_jobs.py). Run by tests/_launch.

    python tests/shm/_worker.py SCENARIO [ARG]

Reports each step as a line `RESULT {json}` (error class, message, seconds taken, .peer).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import pycollective as dist

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def report(**fields) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def attempt(step: str, fn) -> BaseException | None:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report(step=step, error=type(exc).__name__, msg=str(exc),
               elapsed=time.monotonic() - t0, peer=getattr(exc, "peer", None),
               waiting_on=list(getattr(exc, "waiting_on", ()) or ()))
        return exc
    report(step=step, error=None, elapsed=time.monotonic() - t0)
    return None


def info() -> None:
    g = dist.group.WORLD
    x = np.full(1000, RANK + 1, np.float64)
    dist.all_reduce(x)
    sub = dist.new_group(list(range(0, P, 2)))
    y = np.ones(10, np.int32)
    if RANK % 2 == 0:
        dist.all_reduce(y, group=sub)
    report(step="info", error=None, elapsed=0.0, shm=g.shm is not None,
           sub_shm=sub.shm is not None if RANK % 2 == 0 else None,
           algorithms=dist.algorithms("all_reduce"),
           ok=bool((x == P * (P + 1) / 2).all() and (RANK % 2 or (y == len(sub.ranks)).all())))


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
        report(step="loop", error=type(exc).__name__, msg=str(exc),
               elapsed=time.monotonic() - last, peer=getattr(exc, "peer", None))


def mixed() -> None:
    """Rank 0 runs an arena collective while the others run one over TCP."""
    if RANK == 0:
        attempt("call", lambda: dist.all_reduce(np.ones(8, np.float32)))
    else:
        attempt("call", lambda: dist.gather(np.ones(8, np.float32), dst=1 if P > 1 else 0,
                                            gather_list=[np.zeros(8, np.float32)] * P
                                            if RANK == 1 else None))
    attempt("after", lambda: dist.all_reduce(np.ones(8, np.float32)))


def never() -> None:
    if RANK == P - 1:
        time.sleep(2.5)
    else:
        attempt("call", lambda: dist.all_reduce(np.ones(1 << 16, np.float32)))


def hang() -> None:
    print("READY", flush=True)
    while True:
        dist.all_reduce(np.ones(1000, np.float32))
        time.sleep(0.01)


def main() -> None:
    scenario, *args = sys.argv[1:]
    report(step="pid", error=None, elapsed=0.0, pid=os.getpid())
    if attempt("init", dist.init_process_group) is not None:
        return
    if scenario == "info":
        info()
    elif scenario == "kill":
        kill(int(args[0]), int(args[1]))
    elif scenario == "mixed":
        mixed()
    elif scenario == "never":
        never()
    elif scenario == "hang":
        hang()
    elif scenario == "raise":
        dist.all_reduce(np.ones(4, np.float32))
        raise RuntimeError("deliberate")
    t0 = time.monotonic()
    dist.destroy_process_group()
    report(step="destroy", error=None, elapsed=time.monotonic() - t0)


if __name__ == "__main__":
    main()
