"""One rank of a TCP job whose reductions go through the compiled read-and-reduce
(PYCOLLECTIVE_TCP_NATIVE=1, set by the test): every algorithm's all_reduce of a few MiB in
several dtypes and ops, each checked against the fused reduction of every rank's inputs
(which each rank can compute: the inputs are seeded by rank). Reports the bytes the
compiled path read, so the test knows it ran."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
import numpy as np  # noqa: E402

import pycollective as dist  # noqa: E402
from _workerlib import report  # noqa: E402
from pycollective._dtypes import from_numpy  # noqa: E402
from pycollective._reduce_ops import ReduceOp, fused_reduce  # noqa: E402
from pycollective.api._default import resolve_group  # noqa: E402
from pycollective.transport.tcp import folding, receiving  # noqa: E402


def _inputs(rank: int, n: int, dt: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(100 + rank)
    if dt.kind == "f":
        return rng.standard_normal(n).astype(dt)
    return rng.integers(-1000, 1000, n).astype(dt)


def main() -> None:
    read = [0]
    fold = folding.native_fold()
    assert fold is not None, "PYCOLLECTIVE_TCP_NATIVE=1 and the extension built"

    def counting(*args):  # type: ignore[no-untyped-def]
        out = fold(*args)
        read[0] += out[0]
        return out

    dist.init_process_group()
    transport = resolve_group(None).world.transport  # the TCP transport of this job
    transport._fold = counting
    rank, p = dist.get_rank(), dist.get_world_size()
    bad = []
    n_bytes = (3 << 20) + 8  # several reads a payload; a count no algorithm splits evenly
    for dt in (np.float32, np.float64, np.float16, np.int32):
        dtype = np.dtype(dt)
        n = n_bytes // dtype.itemsize
        everyone = [_inputs(r, n, dtype) for r in range(p)]
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
            if op is ReduceOp.AVG and dtype.kind != "f":
                continue
            want = np.empty(n, dtype)
            fused_reduce(op, from_numpy(dtype), want, everyone, divisor=p)  # type: ignore[arg-type]
            for algo in dist.algorithms("all_reduce"):
                x = everyone[rank].copy()
                dist.all_reduce(x, op=op, algorithm=algo)
                ok = np.allclose(x, want, rtol=1e-2, atol=1e-2, equal_nan=True)
                if not ok:
                    bad.append(f"{algo} {dtype} {op.name}")
    report(step="fold", bad=bad, read=read[0], window=receiving.SINK_BYTES)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
