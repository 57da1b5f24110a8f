"""The compiled arena against the Python one, with forked ranks and no job: every arena
collective, ranks all compiled and ranks mixed (even ranks in Python, odd ranks compiled,
in the same calls), results checked bit for bit against the rank-order reference. Small
slots, so calls take the one-phase path, the pipelines and many chunks."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from tests._arena_ranks import run_on_new_arena

from pycollective import _dtypes
from pycollective._reduce_ops import ReduceOp, fused_reduce
from pycollective.shm import arena, collectives, native
from pycollective.transport import _wire

pytestmark = [
    pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm"),
    pytest.mark.skipif(
        os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0", reason="PYCOLLECTIVE_NATIVE=0"
    ),
]

SLOT = 4096
COUNTS = (0, 1, 7, 1000, 3000, 9000)
CASES = (
    ("float32", ReduceOp.SUM),
    ("float16", ReduceOp.SUM),
    ("bfloat16", ReduceOp.AVG),
    ("float64", ReduceOp.PRODUCT),
    ("int64", ReduceOp.MAX),
    ("int8", ReduceOp.AVG),
    ("bool", ReduceOp.BOR),
    ("complex64", ReduceOp.PRODUCT),
)


def _data(rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + n)
    if dtype.kind == "b":
        return rng.random(n) < 0.3
    if dtype.kind in "iu":
        return rng.integers(-50, 50, n).astype(dtype.numpy)
    real = rng.uniform(0.5, 1.5, n * (2 if dtype.kind == "c" else 1)).astype(np.float32)
    if dtype.name == "bfloat16":
        return (real.view(np.uint32) >> 16).astype(np.uint16).view(dtype.numpy)
    if dtype.kind == "c":
        return real.view(np.complex64).astype(dtype.numpy)
    return real.astype(dtype.numpy)


def _rank_main(name: str, nbytes: int, p: int, r: int, compiled: bool, out) -> None:
    try:
        seg = arena.Segment.attach(name, nbytes)
        a = arena.Arena(seg, p, r, SLOT)
        na = (
            # nt_bytes=0: every copy into a result takes the non-temporal path too
            native.NativeArena(a, collectives.SMALL_BYTES, collectives.CHUNK_BYTES, nt_bytes=0)
            if compiled
            else None
        )
        deadline = time.monotonic() + 60

        def poll(target: int) -> None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {r} waited for phase {target} too long")

        def check(q: int, target: int) -> None:
            raise AssertionError(f"rank {r}: peer {q} announced another call")

        sync = collectives.Sync(a, poll)
        seq = 0

        def call(coll, dtype, op, root, inp, data, divisor=0) -> None:
            nonlocal seq
            if na is not None:
                count = 0 if data is None else int(data.size)
                hdr = (_wire.KIND_CODE[coll], dtype.code, count, root, int(op), 0)
                plan = na.plan(hdr[0], dtype.code, int(op), root, divisor, hdr)
                na.run(plan, inp, data, seq, None, poll, check, lambda: None)
            else:
                red = collectives.reducer(op, dtype, divisor)
                if coll == "all_reduce":
                    collectives.all_reduce(a, data, red, sync)
                elif coll == "reduce":
                    collectives.reduce(a, data, red, sync, root)
                elif coll == "broadcast":
                    collectives.broadcast(a, data, sync, root)
                elif coll == "all_gather":
                    collectives.all_gather(a, inp, data, sync)
                elif coll == "reduce_scatter":
                    collectives.reduce_scatter(a, inp, data, red, sync)
                else:
                    collectives.barrier(a, sync)
            seq += 1

        for dt_name, op in CASES:
            dtype = _dtypes.BY_NAME[dt_name]
            divisor = p if op is ReduceOp.AVG else 0
            for n in COUNTS:
                every = [_data(q, n, dtype) for q in range(p)]
                want = np.empty(n, dtype.numpy)
                fused_reduce(op, dtype, want, every, divisor)
                x = every[r].copy()
                call("all_reduce", dtype, op, -1, None, x, divisor)
                assert x.tobytes() == want.tobytes(), ("all_reduce", dt_name, n)
                for root in sorted({0, p - 1}):
                    x = every[r].copy()
                    call("reduce", dtype, op, root, None, x, divisor)
                    expect = want if r == root else every[r]
                    assert x.tobytes() == expect.tobytes(), ("reduce", dt_name, n, root)
                    x = every[r].copy()
                    call("broadcast", dtype, op, root, None, x)
                    assert x.tobytes() == every[root].tobytes(), ("broadcast", dt_name, n)
                gathered = np.zeros(n * p, dtype.numpy)
                call("all_gather", dtype, op, -1, every[r], gathered)
                assert gathered.tobytes() == np.concatenate(every).tobytes(), ("all_gather", n)
                blocks = [
                    np.concatenate([_data(q + 7 * b, n, dtype) for b in range(p)]) for q in range(p)
                ]
                want_rs = np.empty(n, dtype.numpy)
                fused_reduce(op, dtype, want_rs, [b[r * n : (r + 1) * n] for b in blocks], divisor)
                got = np.zeros(n, dtype.numpy)
                call("reduce_scatter", dtype, op, -1, blocks[r], got, divisor)
                assert got.tobytes() == want_rs.tobytes(), ("reduce_scatter", dt_name, n)
                call("barrier", dtype, op, -1, None, None)
        out.put((r, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put((r, repr(exc)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "p,mode", [(2, "compiled"), (3, "compiled"), (2, "mixed"), (3, "mixed"), (4, "mixed")]
)
def test_compiled_arena_matches_the_reference_and_the_python_arena(p: int, mode: str) -> None:
    results = run_on_new_arena(p, SLOT, _rank_main, lambda r: (mode == "compiled" or r % 2 == 1,))
    assert results == {r: None for r in range(p)}
