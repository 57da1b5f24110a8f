"""One rank of a job calling pycollective's own API with torch tensors
(tests/api/test_torch_tensor_calls.py): repeated synchronous calls reach the group's
compiled path through the tensors' views, and a tensor changed since its view was made
(storage, length, dtype, contiguity, negative or conjugate bit) is reduced right or
refused, never run on a stale view.

Prints `FAST json` (compiled calls before and after the repeated all_reduce and broadcast
calls), `FAST_OTHERS json` (the same around repeated reduce, all_gather_into_tensor and
reduce_scatter_tensor calls) and `ok`.
"""

from __future__ import annotations

import json
import os

import pycollective as dist
import torch
from pycollective.core import group as _group

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])
_group._RECHECK_SECONDS = 3600.0  # every repeated call compiled, however loaded the machine
REPEATS = 20


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError(f"rank {RANK}: {what}: got {got.tolist()}, want {want.tolist()}")


def refused(call, match: str, what: str) -> None:
    try:
        call()
    except dist.UsageError as exc:
        if match not in str(exc):
            raise AssertionError(f"rank {RANK}: {what}: refused for {exc}") from None
        return
    raise AssertionError(f"rank {RANK}: {what}: accepted")


def main() -> None:
    dist.init_process_group()
    g = dist.group.WORLD
    total = P * (P + 1) / 2  # sum of rank + 1 over the ranks
    t = torch.full((6,), RANK + 1.0)
    for i in range(3):  # the first teaches the compiled path the view's signature
        t.fill_(RANK + 1.0 + i)
        dist.all_reduce(t)
        same(t, torch.full((6,), total + P * i), f"all_reduce {i}")
    b = torch.full((4,), float(RANK))
    dist.broadcast(b, src=P - 1)
    before = g.fast.calls if g.fast is not None else None
    for i in range(REPEATS):
        t.fill_(RANK + 1.0)
        dist.all_reduce(t)
        same(t, torch.full((6,), total), f"repeated all_reduce {i}")
        b.fill_(float(RANK + i))
        dist.broadcast(b, src=P - 1)
        same(b, torch.full((4,), float(P - 1 + i)), f"repeated broadcast {i}")
    after = g.fast.calls if g.fast is not None else None
    print("FAST " + json.dumps([before, after]), flush=True)

    # Changed since its view was made: each must be reduced as it is now.
    t.untyped_storage().resize_(0)
    t.untyped_storage().resize_(6 * 4)  # new memory, maybe elsewhere
    t.fill_(RANK + 1.0)
    dist.all_reduce(t)
    same(t, torch.full((6,), total), "after the storage moved")
    t.data = t.view(torch.int32)  # another dtype at the same address, no version bump
    t.fill_(RANK + 1)
    dist.all_reduce(t)
    same(t, torch.full((6,), int(total), dtype=torch.int32), "another dtype in place")
    t.data = t[:3]  # shorter at the same address
    t.fill_(RANK + 1)
    dist.all_reduce(t)
    same(t, torch.full((3,), int(total), dtype=torch.int32), "shorter in place")
    t.resize_(2)
    t.fill_(RANK + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    same(t, torch.full((2,), P, dtype=torch.int32), "resize_ and another op")

    # Not what the API takes, at a known address: refused as the first call would be.
    sq = torch.arange(9.0).reshape(3, 3)
    dist.all_reduce(sq)
    refused(lambda: dist.all_reduce(sq.t()), "contiguous", "transposed at a known address")
    refused(lambda: dist.all_reduce(torch._neg_view(sq)), "negative", "negative bit")
    c = torch.ones(3, dtype=torch.complex64)
    dist.all_reduce(c)
    refused(lambda: dist.all_reduce(c.conj()), "conjugate", "conjugate bit")
    same(c, torch.full((3,), float(P), dtype=torch.complex64), "complex all_reduce")

    # The other collectives with tensors, repeated: right every time.
    red, gin, gout = torch.zeros(4), torch.zeros(2), torch.zeros(2 * P)
    rin, rout = torch.zeros(2 * P), torch.zeros(2)
    for i, op in enumerate((dist.ReduceOp.SUM, dist.ReduceOp.SUM, dist.ReduceOp.MAX)):
        red.fill_(float(RANK + i))
        dist.reduce(red, dst=P - 1, op=op)
        if RANK == P - 1:
            want = P * (P - 1) / 2 + P * i if op == dist.ReduceOp.SUM else float(P - 1 + i)
            same(red, torch.full((4,), want), f"repeated reduce {i}")
        gin.fill_(float(RANK * 10 + i))
        dist.all_gather_into_tensor(gout, gin)
        want_g = torch.tensor([float(q * 10 + i) for q in range(P) for _ in range(2)])
        same(gout, want_g, f"repeated all_gather_into_tensor {i}")
        rin.copy_(torch.arange(2.0 * P) + RANK + i)
        dist.reduce_scatter_tensor(rout, rin, op=op)
        col = torch.arange(2.0 * RANK, 2.0 * RANK + 2)
        want_rs = col * P + P * (P - 1) / 2 + P * i if op == dist.ReduceOp.SUM else col + P - 1 + i
        same(rout, want_rs, f"repeated reduce_scatter_tensor {i}")
    # ... and compiled every time, once their first call taught the path their signatures
    before = g.fast.calls if g.fast is not None else None
    for i in range(REPEATS):
        red.fill_(float(RANK + i))
        dist.reduce(red, dst=P - 1)
        if RANK == P - 1:
            same(red, torch.full((4,), P * (P - 1) / 2 + P * i), f"compiled reduce {i}")
        else:
            same(red, torch.full((4,), float(RANK + i)), f"compiled reduce {i}, a non-root")
        gin.fill_(float(RANK * 10 + i))
        dist.all_gather_into_tensor(gout, gin)
        want_g = torch.tensor([float(q * 10 + i) for q in range(P) for _ in range(2)])
        same(gout, want_g, f"compiled all_gather_into_tensor {i}")
        rin.copy_(torch.arange(2.0 * P) + RANK + i)
        dist.reduce_scatter_tensor(rout, rin)
        col = torch.arange(2.0 * RANK, 2.0 * RANK + 2)
        same(rout, col * P + P * (P - 1) / 2 + P * i, f"compiled reduce_scatter_tensor {i}")
    after = g.fast.calls if g.fast is not None else None
    print("FAST_OTHERS " + json.dumps([before, after]), flush=True)
    # an async call takes no view (it could outlive the caller's hold on the tensor)
    views = len(g.tensor_views)
    w = dist.all_reduce(torch.ones(5), async_op=True)
    w.wait()
    assert len(g.tensor_views) == views, "an async call made a view"
    dist.destroy_process_group()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
