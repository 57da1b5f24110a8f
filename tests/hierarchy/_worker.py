"""One rank of a job whose ranks pretend to sit on several hosts (PYCOLLECTIVE_HOST_ID).
Run by tests/hierarchy/test_hierarchy_jobs.py.

    python tests/hierarchy/_worker.py SCENARIO[,SCENARIO...]

Prints `RESULT {json}` lines; exits 0 only if every check passed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "api"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
if "correctness" not in sys.argv[1].split(","):
    # only the scenario that checks every dtype needs bfloat16 (ml_dtypes' import: half a
    # second of CPU in every rank); battery.py reads the flag when imported
    sys.argv.append("--no-bfloat16")
import battery  # noqa: E402  (data and numpy references shared with the API battery)

import pycollective as dist  # noqa: E402
from _workerlib import report  # noqa: E402
from pycollective import ReduceOp  # noqa: E402
from pycollective._dtypes import from_numpy  # noqa: E402
from pycollective.runners import HierarchicalRunner
from pycollective.transport._base import Transport  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])
F32 = from_numpy(np.dtype(np.float32))


class PeerBytes(Transport):
    """Counts payload bytes sent to each peer (delegates everything to the transport)."""

    def __init__(self, inner: Transport) -> None:
        self.inner, self.rank, self.size = inner, inner.rank, inner.size
        self.sent: dict[int, int] = {}
        self.lock = threading.Lock()

    def exchange(self, sends, recvs, deadline, group, label=""):
        with self.lock:
            for m in sends:
                self.sent[m.peer] = self.sent.get(m.peer, 0) + m.payload.nbytes
        self.inner.exchange(sends, recvs, deadline, group, label)

    def abort(self, peers, group, error, seq=0):
        self.inner.abort(peers, group, error, seq)

    def close(self):
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def correctness() -> None:
    """Every dtype x op (explicit and auto), awkward counts, checked against numpy."""
    for dt in battery.DTYPES:
        for op in battery.OPS:
            if not battery.valid(op, dt):
                continue
            x = battery.data(RANK, 13, dt, op)
            dist.all_reduce(x, op=op, algorithm="hierarchical")
            want = battery.reference(op, [battery.data(i, 13, dt, op) for i in range(P)], P)
            battery.check(f"{np.dtype(dt)} {op!r}", x, want)
    x = battery.data(RANK, 1001, np.int32)
    dist.all_reduce(x)  # auto
    battery.check("auto", x, sum(battery.data(i, 1001, np.int32) for i in range(P)))
    for n in (0, 1, 2, 3, P - 1, P + 1, 1000 + P, 300_001):
        for dt, op in (
            (np.float32, ReduceOp.SUM),
            (np.int64, ReduceOp.MAX),
            (np.float64, ReduceOp.AVG),
        ):
            x = battery.data(RANK, n, dt, op)
            dist.all_reduce(x, op=op, algorithm="hierarchical")
            want = battery.reference(op, [battery.data(i, n, dt, op) for i in range(P)], P)
            battery.check(f"n={n} {np.dtype(dt)} {op!r}", x, want)
    # inexact floats: every rank ends with bitwise the same result
    x = np.random.default_rng(RANK).standard_normal(7777).astype(np.float32)
    dist.all_reduce(x, algorithm="hierarchical")
    everyone = np.zeros(P * x.size, np.float32)
    dist.all_gather_into_tensor(everyone, x)
    battery.check("bitwise identical", everyone.reshape(P, -1), np.broadcast_to(x, (P, x.size)))
    # a subgroup of the world (every other rank) has a layout of its own
    sub = dist.new_group(list(range(0, P, 2)))
    if RANK % 2 == 0:
        y = np.full(5, RANK, np.int32)
        dist.all_reduce(y, group=sub, algorithm="hierarchical")
        battery.check("subgroup", y, np.full(5, sum(range(0, P, 2)), np.int32))
    g = dist.group.WORLD
    hier = g.runner(HierarchicalRunner).hierarchy
    report(
        step="correctness",
        checks=battery.checks,
        failures=battery.failures[:10],
        hosts=[list(h) for h in hier.layout.hosts],
        arena=hier.arena is not None,
        compiled=hier.compiled is not None,
        single_copy=hier.compiled is not None and hier.compiled.single_copy,
        auto=g.choose_algorithm("all_reduce", None, 1 << 20, F32, 0),
        algorithms=dist.algorithms("all_reduce"),
    )


def traffic() -> None:
    """Bytes sent over TCP to each peer by one all_reduce, auto vs flat ring."""
    world = dist.group.WORLD.world
    counter = PeerBytes(world.transport)
    world.transport = counter
    n = 1 << 16
    out = {}
    ok = True
    for algo in (None, "ring"):
        dist.all_reduce(np.ones(n, np.float32), algorithm=algo)  # warm-up, first-call set-up
        dist.barrier()
        counter.sent.clear()
        x = np.ones(n, np.float32)
        dist.all_reduce(x, algorithm=algo)
        ok = ok and bool((x == P).all())
        out[algo or "auto"] = {str(k): v for k, v in counter.sent.items()}
        dist.barrier()
    hosts = [list(h) for h in dist.group.WORLD.runner(HierarchicalRunner).hierarchy.layout.hosts]
    report(
        step="traffic",
        sent=out,
        hosts=hosts,
        nbytes=4 * n,
        ok=ok,
        arena=dist.group.WORLD.runner(HierarchicalRunner).hierarchy.arena is not None,
    )


def _attempt(step: str, fn) -> None:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report(
            step=step, error=type(exc).__name__, msg=str(exc)[:500], elapsed=time.monotonic() - t0
        )
        return
    report(step=step, error=None, elapsed=time.monotonic() - t0)


def mismatch(kind: str) -> None:
    x = np.ones(64, np.float32)
    dist.all_reduce(x)  # set-up done, one good call
    host = dist.group.WORLD.runner(HierarchicalRunner).hierarchy.layout.host_of(dist.get_rank())
    if kind == "count_in_host" and RANK == 0:
        x = np.ones(65, np.float32)
    elif kind == "count_across_hosts" and host == 0:
        x = np.ones(80, np.float32)
    elif kind == "dtype_in_host" and RANK == P - 1:
        x = np.ones(64, np.float64)
    elif kind == "algorithm" and RANK == 0:
        _attempt("call", lambda: dist.all_reduce(x, algorithm="ring"))
        _attempt("after", lambda: dist.all_reduce(np.ones(4, np.float32)))
        return
    _attempt("call", lambda: dist.all_reduce(x))
    _attempt("after", lambda: dist.all_reduce(np.ones(4, np.float32)))


def kill() -> None:
    """The last rank dies mid-loop; every other rank must raise, not hang."""
    if RANK == P - 1:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), 9)).start()
    x = np.ones(1 << 14, np.float32)

    def loop() -> None:
        for _ in range(100_000):
            dist.all_reduce(x, algorithm="hierarchical")

    _attempt("loop", loop)


def main() -> int:
    os.environ.setdefault("PYCOLLECTIVE_TIMEOUT", "20")
    dist.init_process_group()
    # several scenarios run one after the other in the same job (traffic last: it wraps the
    # transport in a counter)
    for scenario in sys.argv[1].split(","):
        if scenario == "correctness":
            correctness()
        elif scenario == "traffic":
            traffic()
        elif scenario == "kill":
            kill()
        elif scenario.startswith("mismatch:"):
            mismatch(scenario.split(":", 1)[1])
        else:
            raise SystemExit(f"unknown scenario {scenario}")
    failed = bool(battery.failures)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a failed group may not tear down cleanly
        pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
