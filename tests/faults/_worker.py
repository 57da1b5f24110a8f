"""One rank of a fault-injection job (tests/faults). Run by tests/_launch.run_ranks.

    python tests/faults/_worker.py SCENARIO [ARG]

Every attempted operation prints one line `RESULT {json}` (step name, error class and
its bases, message, seconds taken), so the test can check each rank's outcome and how
long it took. The last lines report how long destroy_process_group took and which
threads were still alive after it.
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
from pycollective import ReduceOp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import attempt, mark, report, wait_for  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def finish() -> None:
    t0 = time.monotonic()
    dist.destroy_process_group()
    elapsed = time.monotonic() - t0
    # Give threads that were told to stop a moment to return.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        alive = [t for t in threading.enumerate() if t is not threading.main_thread()]
        if not alive:
            break
        time.sleep(0.02)
    alive = [t for t in threading.enumerate() if t is not threading.main_thread()]
    report(
        step="destroy",
        error=None,
        elapsed=elapsed,
        threads=[t.name for t in alive],
        non_daemon=[t.name for t in alive if not t.daemon],
    )


# ---------------------------------------------------------------------- mismatched calls


def _ar(n=8, dt=np.float32, op=ReduceOp.SUM, algorithm=None):
    return lambda: dist.all_reduce(np.ones(n, dt), op=op, algorithm=algorithm)


def _bc(src, n=8, dt=np.float32):
    return lambda: dist.broadcast(np.ones(n, dt), src=src)


def mismatch(variant: str) -> None:
    first = RANK == 0
    if variant == "kind":
        call = _ar() if first else _bc(0)
    elif variant == "count":
        call = _ar(10 if first else 12)
    elif variant == "dtype":
        call = _ar(dt=np.float32 if first else np.float64)
    elif variant == "op":
        call = _ar(op=ReduceOp.SUM if first else ReduceOp.MAX)
    elif variant == "root":
        call = _bc(0 if first else 1)
    elif variant == "algorithm":
        call = _ar(n=64, algorithm="ring" if first else "tree")
    elif variant == "extra":
        # everyone agrees on #0; rank 0 then does one more all_reduce while the others
        # move on to a broadcast
        attempt("agree", _ar())
        if first:
            attempt("extra", _ar())
        call = _ar() if first else _bc(0)
    elif variant == "late":
        # rank 0 does an extra barrier first: its #0 meets everyone else's all_reduce #0
        call = (lambda: (dist.barrier(), _ar()())) if first else _ar()
    elif variant in ("p2p-dtype", "p2p-size"):
        if first:
            call = lambda: dist.send(np.ones(4, np.float32), dst=1)  # noqa: E731
        elif RANK == 1:
            dt, n = (np.float64, 2) if variant == "p2p-dtype" else (np.float32, 6)
            call = lambda: dist.recv(np.zeros(n, dt), src=0)  # noqa: E731
        else:
            call = lambda: None  # noqa: E731
    elif variant in MORE_MISMATCHES:
        call = MORE_MISMATCHES[variant](first)
    else:
        raise SystemExit(f"unknown variant {variant}")
    attempt("mismatch", call)
    attempt("after", _ar())


def _z(n, dt=np.float32):
    return np.zeros(n, dt)


def _async_ar(n):
    return lambda: dist.all_reduce(np.ones(n, np.float32), async_op=True).wait()


def _sub_ar(n):
    def run():
        g = dist.new_group(list(range(P)))
        dist.all_reduce(np.ones(n, np.float32), group=g)

    return run


def _obj_bcast(src):
    return lambda: dist.broadcast_object_list([{"from": RANK}], src=src)


# More kinds of mismatched calls: variant -> (is rank 0) -> the call this rank makes.
MORE_MISMATCHES = {
    "gather-kind": lambda f: (
        (lambda: dist.all_gather_into_tensor(_z(8 * P), np.ones(8, np.float32))) if f else _ar()
    ),
    "barrier-kind": lambda f: dist.barrier if f else _ar(),
    "reduce-kind": lambda f: (lambda: dist.reduce(np.ones(8, np.float32), dst=0)) if f else _ar(),
    "reduce-op": lambda f: (
        lambda: dist.reduce(np.ones(8, np.float32), dst=0, op=ReduceOp.SUM if f else ReduceOp.MIN)
    ),
    "reduce-dst": lambda f: lambda: dist.reduce(np.ones(8, np.float32), dst=0 if f else 1),
    "gather-dst": lambda f: (
        lambda: dist.gather(
            np.ones(4, np.float32),
            [_z(4) for _ in range(P)] if RANK == (0 if f else 1) else None,
            dst=0 if f else 1,
        )
    ),
    "scatter-src": lambda f: (
        lambda: dist.scatter(
            _z(4),
            [np.ones(4, np.float32) for _ in range(P)] if RANK == (0 if f else 1) else None,
            src=0 if f else 1,
        )
    ),
    "gather-vs-scatter": lambda f: (
        (lambda: dist.gather(np.ones(4, np.float32), [_z(4) for _ in range(P)], dst=0))
        if f
        else (lambda: dist.scatter(_z(4), None, src=0))
    ),
    "rs-count": lambda f: (
        lambda: dist.reduce_scatter_tensor(
            _z(4 if f else 5), np.ones((4 if f else 5) * P, np.float32)
        )
    ),
    "rs-op": lambda f: (
        lambda: dist.reduce_scatter_tensor(
            _z(4), np.ones(4 * P, np.float32), op=ReduceOp.SUM if f else ReduceOp.PRODUCT
        )
    ),
    "a2a-count": lambda f: (
        lambda: dist.all_to_all_single(
            _z((4 if f else 6) * P), np.ones((4 if f else 6) * P, np.float32)
        )
    ),
    "bcast-dtype": lambda f: lambda: dist.broadcast(np.ones(8, np.int32 if f else np.float32), 0),
    "bcast-count": lambda f: _bc(0, n=8 if f else 9),
    "ag-dtype": lambda f: (
        lambda: dist.all_gather_into_tensor(
            _z(8 * P, np.int64 if f else np.float64), np.ones(8, np.int64 if f else np.float64)
        )
    ),
    "avg-sum": lambda f: _ar(op=ReduceOp.AVG if f else ReduceOp.SUM),
    "subgroup-count": lambda f: _sub_ar(8 if f else 16),
    "async-count": lambda f: _async_ar(8 if f else 16),
    "object-src": lambda f: _obj_bcast(0 if f else 1),
}


# ---------------------------------------------------------------------- a rank dies


def die(how: str, algorithm: str, victim: int, n: int) -> None:
    """Loop all_reduce; the victim dies from a timer thread, mid-collective."""
    if RANK == victim:

        def kill() -> None:
            if how == "exit":
                os._exit(17)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(0.4, kill).start()
    data = np.ones(n, np.float32)
    t_end = time.monotonic() + 20
    i = 0
    last = time.monotonic()
    try:
        while time.monotonic() < t_end:
            last = time.monotonic()
            dist.all_reduce(data, algorithm=algorithm)
            data[:] = 1
            i += 1
        report(step="loop", error=None, elapsed=0.0, iterations=i)
    except Exception as exc:  # noqa: BLE001
        report(
            step="loop",
            error=type(exc).__name__,
            bases=[c.__name__ for c in type(exc).__mro__],
            msg=str(exc),
            elapsed=time.monotonic() - last,
            iterations=i,
            peer=getattr(exc, "peer", None),
        )
    attempt("after", _ar())


# ---------------------------------------------------------------------- a rank never calls


def sleeper() -> None:
    """The last rank keeps out of the call until every other rank has timed out in it."""
    sleepy = P - 1
    if RANK == sleepy:
        wait_for("timed-out", range(sleepy))
        attempt("late", _ar())
        mark("late-called", RANK)
    else:
        exc = attempt("timeout", _ar())
        if exc is not None:
            report(
                step="timeout-info",
                error=None,
                elapsed=0.0,
                waiting_on=list(getattr(exc, "waiting_on", ()) or ()),
            )
        mark("timed-out", RANK)
        # stay up until the sleeper has called, so it hears the news from us
        wait_for("late-called", [sleepy])
        attempt("after", _ar())


# ---------------------------------------------------------------------- async work


def async_error(kind: str) -> None:
    if kind == "mismatch":
        work = dist.all_reduce(np.ones(8 if RANK == 0 else 9, np.float32), async_op=True)
    else:  # a rank dies while the others' async all_reduce is in flight
        if RANK == P - 1:
            time.sleep(0.3)
            os._exit(17)
        work = dist.all_reduce(np.ones(8, np.float32), async_op=True)
    attempt("wait", lambda: work.wait())
    attempt("after-async", lambda: dist.all_reduce(np.ones(8, np.float32), async_op=True).wait())


def pending_at_destroy() -> None:
    """Destroy with an async collective still waiting on a rank that never joins it."""
    if RANK == 0:
        work = dist.all_reduce(np.ones(8, np.float32), async_op=True)
        time.sleep(0.2)
        report(step="pending", error=None, elapsed=0.0, done=work.is_completed())
        finish()
        attempt("wait-after-destroy", lambda: work.wait(timeout=5))
        mark("done", RANK)
        return
    wait_for("done", [0])  # never joins the call rank 0 destroyed its group under
    finish()


def monitored() -> None:
    """Everyone arrives at one monitored_barrier; then the last rank is late for the next:
    it comes once every other rank has found it missing."""
    attempt("all-arrive", lambda: dist.monitored_barrier(timeout=10))
    if RANK == P - 1:
        wait_for("missed", range(P - 1))
        attempt("late", lambda: dist.monitored_barrier(timeout=10))
        mark("late-called", RANK)
        return
    exc = attempt("missing", lambda: dist.monitored_barrier(timeout=1.0, wait_all_ranks=True))
    report(
        step="missing-info",
        error=None,
        elapsed=0.0,
        waiting_on=list(getattr(exc, "waiting_on", ()) or ()),
    )
    mark("missed", RANK)
    wait_for("late-called", [P - 1])  # stay until the late rank has heard from us


def main() -> None:
    scenario, *args = sys.argv[1:]
    dist.init_process_group()
    if scenario == "mismatch":
        mismatch(args[0])
    elif scenario == "die":
        die(args[0], args[1], int(args[2]), int(args[3]))
    elif scenario == "sleep":
        sleeper()
    elif scenario == "async":
        async_error(args[0])
    elif scenario == "monitored":
        monitored()
    elif scenario == "pending":
        pending_at_destroy()
        return
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    finish()


if __name__ == "__main__":
    main()
