"""One rank of a job on the compiled path of repeated calls (tests/native/test_fast_path.py).

    python tests/native/_fast_worker.py SCENARIO [ARG...]

Lines it prints: `DIGEST hex` (every result, in order), `OWN "hex"` (bits: the results
that differ by rank, as a reduce's non-roots or reduce_scatter's blocks), `FAST json` (the
group's compiled path: calls it ran and handed back to Python; null when the group has
none), `RESULT json` (one step: error class, message, seconds, .peer, .waiting_on),
`FLIGHT json` (entries).

FAST_TEST_OFF=1 turns the path of repeated calls of the scheduled runner (TCP: runners/
swap.py) off, for the Python reference. FAST_TEST_RECHECK=SECONDS stretches the
millisecond after which a call reads the transport for abort notices through the Python
path, so that every repeated call of a scenario takes the compiled path (abort notices
still come through its polls).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

import pycollective as dist
from pycollective import _dtypes
from pycollective._reduce_ops import ReduceOp, check_op_dtype
from pycollective.core import group as _group

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import attempt, mark, report, wait_for  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])
if os.environ.get("FAST_TEST_OFF"):
    from pycollective.runners.scheduled import ScheduledRunner

    ScheduledRunner.FAST_BYTES = -1
if os.environ.get("FAST_TEST_RECHECK"):
    _group._RECHECK_SECONDS = float(os.environ["FAST_TEST_RECHECK"])


def fast_counts() -> None:
    fast = dist.group.WORLD.fast
    counts = None if fast is None else {"calls": fast.calls, "handed": fast.handed}
    if counts is not None and hasattr(fast, "folded"):  # (the TCP path's, runners/swap.py)
        counts["folded"] = fast.folded
    if counts is not None and hasattr(fast, "compiled"):  # of which C ran (csrc/swappath.c)
        counts["compiled"] = fast.compiled
    print("FAST " + json.dumps(counts), flush=True)


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def data(dtype: _dtypes.DType, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    np_dtype = dtype.numpy
    if dtype.name == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        lo, hi = max(info.min, -50), min(info.max, 50)
        return rng.integers(lo, hi + 1, count).astype(np_dtype)
    if np.issubdtype(np_dtype, np.complexfloating):
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(np_dtype)
    return (rng.standard_normal(count) * 3).astype(np_dtype)


def bits() -> None:
    """Every (op, dtype) of all_reduce, broadcast from every root, barriers, three times each
    (the first runs the Python path, the others the compiled one), signatures interleaved,
    and the calls the compiled path must refuse."""
    h = hashlib.sha256()
    dtypes = [d for d in _dtypes.BY_NAME.values() if d.name != "bfloat16" and d.itemsize]
    for dtype in dtypes:
        for op in ReduceOp:
            try:
                check_op_dtype(op, dtype)
            except dist.UsageError:
                continue
            for count in (0, 1, 7, 1000):
                for rep in range(3):
                    x = data(dtype, count, _seed(RANK, rep, dtype.name, op.name, count))
                    dist.all_reduce(x, op)
                    h.update(x.tobytes())
        for root in range(P):
            for rep in range(3):
                x = data(dtype, 5, _seed(RANK, rep, dtype.name, root))
                dist.broadcast(x, src=root)
                h.update(x.tobytes())
    for _ in range(3):
        dist.barrier()
    mine = hashlib.sha256()
    rooted_and_gathered(h, mine, dtypes)
    # Signatures taking turns: dtype, count, op, root, shape and array change call to call.
    a = np.arange(8, dtype=np.float32) + RANK
    b = np.arange(8, dtype=np.int64) * (RANK + 1)
    for rep in range(4):
        for x, op in ((a, dist.ReduceOp.SUM), (b, dist.ReduceOp.MAX), (a, dist.ReduceOp.MIN)):
            y = x.copy()
            dist.all_reduce(y, op)
            h.update(y.tobytes())
        c = (np.arange(9, dtype=np.float32) + rep) * (RANK + 1)
        dist.all_reduce(c)
        h.update(c.tobytes())
        d = (np.arange(8, dtype=np.float32) + rep).reshape(2, 4) * (RANK + 1)
        dist.all_reduce(d)
        h.update(d.tobytes())
        e = np.arange(8, dtype=np.float32) * (RANK + 2)
        dist.all_reduce(e, dist.ReduceOp.AVG)
        h.update(e.tobytes())
        f = np.arange(8, dtype=np.float32) * (RANK + 1)
        dist.broadcast(f, src=rep % P)
        h.update(f.tobytes())
    # What it must refuse, as the Python path does: every rank passes the same, so each
    # raises the same UsageError and the group stays usable.
    refused = []
    big = np.ones(16 * P, np.float32)
    # signatures the refused calls below resemble, known to the compiled path first
    dist.reduce(np.ones(8, np.float32), dst=0)
    dist.all_gather_into_tensor(np.ones(8 * P, np.float32), big[:8])
    dist.reduce_scatter_tensor(np.ones(8, np.float32), big[: 8 * P])
    dist.reduce_scatter_tensor(np.ones(8, bool), np.ones(8 * P, bool), dist.ReduceOp.MAX)
    for bad, what in (
        (lambda: dist.all_reduce(big[::2]), "non-contiguous"),
        (lambda: dist.all_reduce(np.ones(8, np.float32).reshape(2, 4).T), "transposed"),
        (lambda: dist.all_reduce(_read_only()), "read-only"),
        (lambda: dist.all_reduce(np.ones(8, np.float32), 0), "int op"),
        (lambda: dist.all_reduce(np.ones(8, np.float32), dist.ReduceOp.BAND), "float band"),
        (lambda: dist.reduce(_read_only(), dst=RANK), "read-only at the root"),
        (lambda: dist.reduce(big[::2], dst=0), "non-contiguous reduce"),
        (
            lambda: dist.all_gather_into_tensor(np.ones(8 * P + 1, np.float32), big[:8]),
            "all_gather output of the wrong size",
        ),
        (
            lambda: dist.all_gather_into_tensor(np.ones(8 * P, np.float64), big[:8]),
            "all_gather output of another dtype",
        ),
        (
            lambda: dist.all_gather_into_tensor(_read_only_of(8 * P), big[:8]),
            "read-only all_gather output",
        ),
        (
            lambda: dist.reduce_scatter_tensor(np.ones(8, np.float32), big[: 8 * P - 1]),
            "reduce_scatter input of the wrong size",
        ),
        (
            lambda: dist.reduce_scatter_tensor(_read_only_of(8), np.ones(8 * P, np.float32)),
            "read-only reduce_scatter output",
        ),
        (
            lambda: dist.reduce_scatter_tensor(
                np.ones(8, bool), np.ones(8 * P, bool), dist.ReduceOp.AVG
            ),
            "bool reduce_scatter AVG",
        ),
    ):
        try:
            bad()
            refused.append(f"{what}: accepted")
        except dist.UsageError as exc:
            refused.append(f"{what}: {exc}")
    h.update("\n".join(refused).encode())
    after = np.arange(8, dtype=np.float32) + RANK
    dist.all_reduce(after)
    h.update(after.tobytes())
    print("REFUSED " + json.dumps(refused), flush=True)
    print("DIGEST " + h.hexdigest(), flush=True)
    print("OWN " + json.dumps(mine.hexdigest()), flush=True)
    fast_counts()


def rooted_and_gathered(h, mine, dtypes: list) -> None:
    """reduce to every root, all_gather_into_tensor and reduce_scatter_tensor, for every
    dtype with SUM, and float32's and int32's other ops, twice each (the first runs the
    Python path, the second the compiled one; the kernels are all_reduce's, checked above),
    then their signatures taking turns. What every rank ends with alike goes into `h`;
    what is this rank's own (a reduce's result or untouched data, a reduce_scatter's
    block) into `mine`."""
    for dtype in dtypes:
        for op in ReduceOp:
            try:
                check_op_dtype(op, dtype)
            except dist.UsageError:
                continue
            if op is ReduceOp.SUM:
                counts: tuple[int, ...] = (0, 7)
            elif dtype.name in ("float32", "int32"):
                counts = (3,)
            else:
                continue
            for count in counts:
                for rep in range(2):
                    seed = _seed(RANK, rep, dtype.name, op.name, count, "rooted")
                    for root in range(P):
                        x = data(dtype, count, seed + root)
                        dist.reduce(x, dst=root, op=op)
                        mine.update(x.tobytes())  # the non-roots' own data: unchanged
                    out = np.zeros(P * count, dtype.numpy)
                    dist.all_gather_into_tensor(out, data(dtype, count, seed))
                    h.update(out.tobytes())
                    rs = np.zeros(count, dtype.numpy)
                    dist.reduce_scatter_tensor(rs, data(dtype, P * count, seed + 1), op)
                    mine.update(rs.tobytes())
    for rep in range(4):
        a = np.arange(6, dtype=np.float32) * (RANK + 1) + rep
        b = np.arange(6, dtype=np.int32) - RANK
        for x, root, op in ((a, rep % P, dist.ReduceOp.SUM), (b, 0, dist.ReduceOp.MAX),
                            (a, 0, dist.ReduceOp.AVG)):  # fmt: skip
            y = x.copy()
            dist.reduce(y, dst=root, op=op)
            mine.update(y.tobytes())
        for x in (a, b, a[:3]):
            out = np.zeros(P * x.size, x.dtype)
            dist.all_gather_into_tensor(out, x)
            h.update(out.tobytes())
        for x, op in ((a, dist.ReduceOp.SUM), (b, dist.ReduceOp.MIN), (a, dist.ReduceOp.AVG)):
            out = np.zeros(x.size // P, x.dtype)
            dist.reduce_scatter_tensor(out, x, op)
            mine.update(out.tobytes())


def _read_only() -> np.ndarray:
    return _read_only_of(8)


def _read_only_of(n: int) -> np.ndarray:
    x = np.ones(n, np.float32)
    x.flags.writeable = False
    return x


def flight() -> None:
    """Repeated calls, then what the flight recorder holds of them."""
    x = np.ones(16, np.float32)
    y = np.ones(5, np.int64)
    for _ in range(10):
        dist.all_reduce(x)
        dist.broadcast(y, src=P - 1)
        dist.barrier()
    rec = dist.group.WORLD.world.flight
    entries = rec.entries()[-30:]
    ok = all(
        e["issued_at"] > 0 and e["queued_s"] >= 0 and e["duration_s"] is not None
        and e["duration_s"] >= 0
        for e in entries
    )  # fmt: skip
    keep = ("group", "group_name", "seq", "kind", "count", "dtype", "algorithm", "op", "root",
            "detail", "state", "error", "culprits")  # fmt: skip
    entries = [{k: e[k] for k in keep} for e in entries]
    print("FLIGHT " + json.dumps({"times_ok": ok, "entries": entries}), flush=True)
    fast_counts()


def _repeated(collective: str):
    """A call of `collective` on fixed buffers, to repeat (mismatch, kill)."""
    x = np.ones(8, np.float32)
    gathered = np.ones(8 * P, np.float32)
    big = np.ones(LARGE, np.float32)
    return {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_reduce_large": lambda: dist.all_reduce(big),  # through the arena's pipeline
        "reduce": lambda: dist.reduce(x, dst=0),
        "all_gather": lambda: dist.all_gather_into_tensor(gathered, x),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(x, gathered),
    }[collective]


# What rank 1 calls instead of the repeated call, by what differs: "count", "op" (an
# all_reduce), "reduce-root", "all_gather-count", "reduce_scatter-dtype".
_ODD = {
    "count": lambda: dist.all_reduce(np.ones(9, np.float32)),
    "op": lambda: dist.all_reduce(np.ones(8, np.float32), dist.ReduceOp.MAX),
    "reduce-root": lambda: dist.reduce(np.ones(8, np.float32), dst=1),
    "all_gather-count": lambda: dist.all_gather_into_tensor(
        np.ones(9 * P, np.float32), np.ones(9, np.float32)
    ),
    "reduce_scatter-dtype": lambda: dist.reduce_scatter_tensor(
        np.ones(8, np.float64), np.ones(8 * P, np.float64)
    ),
}


def mismatch(how: str) -> None:
    """Repeated calls, then rank 1 calls a different one (`how`: _ODD's)."""
    call = _repeated(how.split("-")[0] if "-" in how else "all_reduce")
    for _ in range(5):
        call()
    fast_counts()
    attempt("call", _ODD[how] if RANK == 1 else call)
    fast_counts()


def kill(victim: int, collective: str = "all_reduce") -> None:
    """Repeated calls, then the victim is killed while the others wait in one."""
    call = _repeated(collective)
    for _ in range(5):
        call()
    if RANK == victim:
        call()
        time.sleep(0.3)  # the others are in the next call by now
        report(step="killed", error=None, elapsed=0.0, at=time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    call()
    fast_counts()
    attempt("call", call)
    fast_counts()


def never() -> None:
    """Repeated calls, then the last rank stops calling: the others time out naming it."""
    x = np.ones(7, np.float64)
    for _ in range(5):
        dist.all_reduce(x)
    if RANK == P - 1:
        wait_for("timed-out", range(P - 1))  # out of the call until the others gave up on it
        return
    fast_counts()
    attempt("call", lambda: dist.all_reduce(x))
    mark("timed-out", RANK)
    fast_counts()


def threads() -> None:
    """Asynchronous calls queued before repeated synchronous ones, and a second thread
    issuing calls at the same time: the order of operations is the engine's, as ever."""
    h = hashlib.sha256()
    x = np.ones(4, np.float32)
    for _ in range(3):
        dist.all_reduce(x)
    for rep in range(20):
        a = np.full(4, rep + RANK, np.float32)
        work = dist.all_reduce(a, async_op=True)
        b = np.full(4, 2 * rep + RANK, np.float32)
        dist.all_reduce(b)
        work.wait()
        h.update(a.tobytes() + b.tobytes())
    # A thread that waits on a call issued asynchronously runs it itself (run_here) while
    # the main thread issues repeated calls: the engine keeps them in order.
    done = []

    def waiter(work) -> None:
        work.wait()
        done.append(True)

    for rep in range(20):
        a = np.full(4, rep + RANK, np.float32)
        t = threading.Thread(target=waiter, args=(dist.all_reduce(a, async_op=True),))
        t.start()
        b = np.full(4, 3 * rep + RANK, np.float32)
        dist.all_reduce(b)
        t.join()
        h.update(a.tobytes() + b.tobytes())
    assert len(done) == 20
    print("DIGEST " + h.hexdigest(), flush=True)
    fast_counts()


def mixed() -> None:
    """Repeated all_reduces with other frames between them: point-to-point messages sent
    right behind a call's data (they may arrive in the same read), a rank that comes late
    (the other waits past the polling budget, then past PROBE_AFTER: a probe comes first
    at the late one), a barrier and a broadcast (other schedules)."""
    h = hashlib.sha256()
    x = np.ones(8, np.float32)
    t = np.zeros(3, np.int32)
    for rep in range(40):
        x[:] = rep + RANK
        dist.all_reduce(x)
        h.update(x.tobytes())
        if RANK == 1:
            dist.send(np.full(3, rep, np.int32), 0)
        else:
            dist.recv(t, 1)
            h.update(t.tobytes())
        if rep in (10, 30):
            if RANK == rep // 10 % 2:
                time.sleep(0.01 if rep == 10 else 0.7)
        if rep == 20:
            dist.barrier()
            y = np.arange(4, dtype=np.float64) * (RANK + 1)
            dist.broadcast(y, src=1)
            h.update(y.tobytes())
    print("DIGEST " + h.hexdigest(), flush=True)
    fast_counts()


# float32s of the large calls: above the arena's small calls (256 KiB), so all_gather and
# reduce_scatter go by single copy (all_reduce too once told: all_reduce_by_single_copy),
# and not a whole number of its 128 KiB pieces
LARGE = 300_001


def all_reduce_by_single_copy() -> None:
    """Every rank's compiled arena takes all_reduce by single copy above the small calls,
    as it does the other collectives: by default it does only above 4 MiB
    (runners/native.py ALL_REDUCE_SINGLE_COPY_BYTES), past these tests' buffers. Every
    rank calls this at the same point, between calls; without single copy (or over TCP),
    nothing."""
    from pycollective.shm import collectives as _coll
    from pycollective.shm import native as _shm_native

    runner = dist.group.WORLD._fast_runner
    if not getattr(runner, "single_copy", False):  # none, not the arena's (TCP), or off
        return
    runner.native.c.set_single_copy(
        _coll.SMALL_BYTES + 1, _shm_native.SINGLE_COPY_PIECE_BYTES,
        runner.local_group.single_copy_pids, _coll.SMALL_BYTES + 1,
    )  # fmt: skip


def large() -> None:
    """Repeated all_reduces through the arena's pipeline, then by single copy (SUM, MAX,
    AVG taking turns, new data each time), every result digested; then the same signature
    on a `pycollective.empty` buffer, which the compiled path declines (the Python path
    tells the peers it is shared): `LARGE json` with how many of those it ran."""
    h = hashlib.sha256()
    x = np.empty(LARGE, np.float32)
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG)
    for rep in range(24):
        if rep == 12:
            all_reduce_by_single_copy()
        x[:] = data(_dtypes.BY_NAME["float32"], LARGE, _seed(RANK, rep, "large"))
        dist.all_reduce(x, ops[rep % 3])
        h.update(x.tobytes())
    fast = dist.group.WORLD.fast
    before = fast.calls if fast is not None else 0
    shared = dist.empty(LARGE, np.float32)
    for rep in range(3):
        shared[:] = data(_dtypes.BY_NAME["float32"], LARGE, _seed(RANK, rep, "shared"))
        dist.all_reduce(shared, ops[rep % 3])
        h.update(shared.tobytes())
    after = fast.calls if fast is not None else 0
    print("LARGE " + json.dumps({"shared_compiled": after - before}), flush=True)
    print("DIGEST " + h.hexdigest(), flush=True)
    fast_counts()


def large_gather() -> None:
    """Repeated all_gather_into_tensor of large blocks by single copy (new data each time,
    out of place, then in place: the input a block of the output), then
    reduce_scatter_tensor, every result digested."""
    h = hashlib.sha256()
    out = np.empty(LARGE * P, np.float32)
    inp = np.empty(LARGE, np.float32)
    for rep in range(8):
        inp[:] = data(_dtypes.BY_NAME["float32"], LARGE, _seed(RANK, rep, "gather"))
        out[:] = -1
        dist.all_gather_into_tensor(out, inp)
        h.update(out.tobytes())
        mine = out[RANK * LARGE : (RANK + 1) * LARGE]
        mine[:] = inp + 1
        dist.all_gather_into_tensor(out, mine)
        h.update(out.tobytes())
    # reduce_scatter_tensor by single copy: SUM and MAX taking turns
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX)
    for rep in range(8):
        out[:] = data(_dtypes.BY_NAME["float32"], LARGE * P, _seed(RANK, rep, "scatter"))
        dist.reduce_scatter_tensor(inp, out, ops[rep % 2])
        dist.all_gather_into_tensor(out, inp)  # every rank's block: one digest for all
        h.update(out.tobytes())
    print("DIGEST " + h.hexdigest(), flush=True)
    fast_counts()


def unreachable(collective: str = "all_reduce") -> None:
    """Repeated all_reduces by single copy, then every rank's single copy is pointed at a
    process that is gone: the next call fails its copies, and every rank raises."""
    import subprocess

    big = np.ones(LARGE, np.float32)
    gathered = np.ones(LARGE * P, np.float32)
    call = {
        "all_reduce": lambda: dist.all_reduce(big),
        "all_gather": lambda: dist.all_gather_into_tensor(gathered, big),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(big, gathered),
    }[collective]
    for _ in range(3):
        call()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process (until the system reuses it)
    runner = dist.group.WORLD._fast_runner
    from pycollective.shm import collectives as _coll
    from pycollective.shm import native as _shm_native

    runner.native.c.set_single_copy(
        _coll.SMALL_BYTES + 1, _shm_native.SINGLE_COPY_PIECE_BYTES, [gone.pid] * P,
        _coll.SMALL_BYTES + 1,  # all_reduce too (by default only above 4 MiB)
    )  # fmt: skip
    fast_counts()
    attempt("call", call)
    fast_counts()


def repeat(n: int) -> None:
    """After one all_reduce, broadcast, barrier, reduce, all_gather_into_tensor and
    reduce_scatter_tensor (the Python path, which teaches the compiled one their
    signatures), n more of each: `REPEATED n` with how many of those
    the compiled path ran (all of them should)."""
    x = np.ones(1, np.float32)
    y = np.arange(3, dtype=np.int64)
    z = np.arange(2 * P, dtype=np.float64)

    def calls() -> None:
        dist.all_reduce(x)
        dist.broadcast(y, src=0)
        dist.barrier()
        dist.reduce(y, dst=P - 1, op=dist.ReduceOp.MAX)
        dist.all_gather_into_tensor(z, z[2 * RANK : 2 * RANK + 2])  # in place, FSDP's way
        dist.reduce_scatter_tensor(x, np.ones(P, np.float32))

    calls()
    fast = dist.group.WORLD.fast
    before = fast.calls if fast is not None else 0
    for _ in range(n):
        calls()
    after = fast.calls if fast is not None else 0
    print("REPEATED " + json.dumps(after - before), flush=True)


def main() -> None:
    scenario, *args = sys.argv[1:]
    dist.init_process_group()
    {
        "bits": bits,
        "flight": flight,
        "mismatch": lambda: mismatch(args[0]),
        "kill": lambda: kill(int(args[0]), *args[1:]),
        "never": never,
        "threads": threads,
        "mixed": mixed,
        "repeat": lambda: repeat(int(args[0])),
        "large": large,
        "large_gather": large_gather,
        "unreachable": lambda: unreachable(*args),
    }[scenario]()
    if scenario not in ("kill", "never", "mismatch", "unreachable"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
