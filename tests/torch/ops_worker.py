"""Every torch.distributed operation on the "pycollective" backend, checked against the
values it must produce; pycollective's own default group runs beside it in the same
process. Prints "ok <n checks>" on success; any failure raises."""

from __future__ import annotations

import numpy as np
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import pycollective
import torch
from pycollective.core import group as _group
from pycollective.torch import PycollectiveProcessGroup, traffic

# A repeated call takes the compiled path only within a millisecond of the last read of
# the transport; stretched, so that the count of compiled calls below does not depend on
# the machine's load (as tests/native/_fast_worker.py does).
_group._RECHECK_SECONDS = 3600.0

checks = 0


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    global checks
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.tolist()}, want {want.tolist()}")
    # gloo leaves a storage resizable; a view through Tensor.numpy() would not (FSDP's
    # reshard resize_(0) and PowerSGD's bucket resize_ then fail)
    if not got.untyped_storage().resizable():
        raise AssertionError(f"{what}: the collective made the tensor's storage non-resizable")
    checks += 1


def _tensors_in(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors_in(item)]
    return []


def _resizable_around(fn):
    """Every tensor a collective is given keeps a resizable storage, before and after."""

    def run(*args, **kwargs):
        tensors = _tensors_in(list(args) + list(kwargs.values()))
        assert all(t.untyped_storage().resizable() for t in tensors), f"{fn.__name__}: before"
        out = fn(*args, **kwargs)
        if hasattr(out, "wait"):
            out.wait()
        for t in tensors:
            if not t.untyped_storage().resizable():
                raise AssertionError(f"{fn.__name__} made a storage non-resizable")
        return out

    return run


for _name in (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
    "all_to_all_single", "send", "recv",
):  # fmt: skip
    setattr(dist, _name, _resizable_around(getattr(dist, _name)))


def main() -> None:
    global checks
    dist.init_process_group("pycollective")
    r, n = dist.get_rank(), dist.get_world_size()
    assert isinstance(dist.distributed_c10d._get_default_group(), PycollectiveProcessGroup)
    assert dist.get_backend() == "pycollective"

    # pycollective's own default group in the same process, independent of torch's; it
    # rendezvous through torch's store, since torch's rank 0 holds MASTER_PORT.
    pycollective.init_process_group(store=dist.distributed_c10d._get_default_store())
    a = np.full(3, r + 1.0)
    pycollective.all_reduce(a)
    assert a.tolist() == [n * (n + 1) / 2] * 3

    ranks = torch.arange(n, dtype=torch.float32)
    for op, want in [
        (dist.ReduceOp.SUM, ranks.sum() + n), (dist.ReduceOp.MAX, torch.tensor(float(n))),
        (dist.ReduceOp.MIN, torch.tensor(1.0)), (dist.ReduceOp.PRODUCT, (ranks + 1).prod()),
        (dist.ReduceOp.AVG, (ranks.sum() + n) / n),
    ]:  # fmt: skip
        t = torch.full((5,), r + 1.0)
        dist.all_reduce(t, op=op)
        same(t, torch.full((5,), float(want)), f"all_reduce {op}")
    t = torch.tensor([r], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.BOR)
    same(t, torch.tensor([int(np.bitwise_or.reduce(np.arange(n)))]), "all_reduce BOR int64")
    b = torch.full((2, 3), r + 0.5, dtype=torch.bfloat16)
    dist.all_reduce(b)
    same(b, torch.full((2, 3), sum(i + 0.5 for i in range(n)), dtype=torch.bfloat16), "bf16")

    # repeated synchronous calls take the group's compiled path (through a view of the
    # tensor's memory, made once per address); a storage resized meanwhile (FSDP's
    # reshard) or freed and another tensor at its address are still reduced right
    pg = dist.group.WORLD.pycollective_group
    t = torch.full((6,), r + 1.0)
    for i in range(5):
        t.fill_(r + 1.0 + i)
        dist.all_reduce(t)
        same(t, torch.full((6,), n * (n + 1) / 2 + n * i), f"repeated all_reduce {i}")
    compiled = pg.fast.calls if pg.fast is not None else None
    t.untyped_storage().resize_(0)
    t.untyped_storage().resize_(6 * 4)  # new memory, maybe elsewhere
    t.fill_(r + 1.0)
    dist.all_reduce(t)
    same(t, torch.full((6,), n * (n + 1) / 2), "all_reduce after resize_")
    for i in range(3):
        u = torch.full((6,), float(r * i))  # may reuse a freed address
        dist.all_reduce(u, op=dist.ReduceOp.MAX)
        same(u, torch.full((6,), float((n - 1) * i)), f"all_reduce of new tensor {i}")
    for src in (0, n - 1, 0):
        t = torch.full((4,), float(r))
        dist.broadcast(t, src)
        same(t, torch.full((4,), float(src)), f"repeated broadcast from {src}")
    if compiled is not None:  # the arena's compiled path serves this job
        assert compiled >= 3, f"{compiled} repeated torch calls took the compiled path"
        checks += 1

    # the short way of repeated synchronous calls (torch/_backend.py): a transposed tensor
    # at a known address is not taken for the contiguous one, a new op is not taken for the
    # last, and a work someone holds keeps its result (the group's reusable DoneWork)
    base = torch.arange(9.0).reshape(3, 3)
    sq = base * (r + 1)
    for _ in range(2):
        dist.all_reduce(sq)  # its view is known at its address from now on
    if r == 0:  # same address, length and dtype, not contiguous
        tv = sq.copy_(base).t()
    else:  # the same values, laid out contiguously
        tv = (base * (r + 1)).t().contiguous()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    held = dist.group.WORLD.allreduce([tv], opts)
    same(tv, base.t() * (n * (n + 1) / 2), "transposed at a known address")
    u = torch.zeros(3)
    for i, op in enumerate((dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.SUM)):
        opts.reduceOp = op
        u.fill_(float(r + i))
        again = dist.group.WORLD.allreduce([u], opts)
        want = n * (n - 1) / 2 + n * i if i != 1 else float(n - 1 + i)
        same(u, torch.full((3,), want), f"short way, op {op}")
        same(again.get_future().value()[0], u, "a work's result")
    assert held is not again and held.result()[0] is tv, "a held work was reused"
    # reduce, all_gather_into_tensor and reduce_scatter_tensor repeated: their short way
    red, gin, gout = torch.zeros(4), torch.zeros(2), torch.zeros(2 * n)
    rin, rout = torch.zeros(2 * n), torch.zeros(2)
    for i, op in enumerate((dist.ReduceOp.SUM, dist.ReduceOp.SUM, dist.ReduceOp.MAX)):
        red.fill_(float(r + i))
        dist.reduce(red, dst=n - 1, op=op)
        if r == n - 1:
            want = n * (n - 1) / 2 + n * i if op == dist.ReduceOp.SUM else float(n - 1 + i)
            same(red, torch.full((4,), want), f"repeated reduce {i}")
        gin.fill_(float(r * 10 + i))
        dist.all_gather_into_tensor(gout, gin)
        same(gout, torch.tensor([float(q * 10 + i) for q in range(n) for _ in range(2)]),
             f"repeated all_gather_into_tensor {i}")  # fmt: skip
        rin.copy_(torch.arange(2.0 * n) + r + i)
        dist.reduce_scatter_tensor(rout, rin, op=op)
        col = torch.arange(2.0 * r, 2.0 * r + 2)
        want_rs = col * n + n * (n - 1) / 2 + n * i if op == dist.ReduceOp.SUM else col + n - 1 + i
        same(rout, want_rs, f"repeated reduce_scatter_tensor {i}")
    # ... which takes the group's compiled path once a call taught it the signature
    compiled = pg.fast.calls if pg.fast is not None else None
    for i in range(3):
        red.fill_(float(r + i))
        dist.reduce(red, dst=n - 1)
        same(red, torch.full((4,), n * (n - 1) / 2 + n * i if r == n - 1 else float(r + i)),
             f"compiled reduce {i}")  # fmt: skip
        gin.fill_(float(r - i))
        dist.all_gather_into_tensor(gout, gin)
        same(gout, torch.tensor([float(q - i) for q in range(n) for _ in range(2)]),
             f"compiled all_gather_into_tensor {i}")  # fmt: skip
        rin.copy_(torch.arange(2.0 * n) * (r + 1) - i)
        dist.reduce_scatter_tensor(rout, rin)
        col = torch.arange(2.0 * r, 2.0 * r + 2)
        same(rout, col * n * (n + 1) / 2 - n * i, f"compiled reduce_scatter_tensor {i}")
    if compiled is not None:
        assert pg.fast.calls - compiled == 9, f"{pg.fast.calls - compiled} of 9 ran compiled"
        checks += 1

    # non-contiguous: a transposed view is reduced in place
    m = torch.arange(6.0).reshape(2, 3).t() * (r + 1)
    dist.all_reduce(m)
    same(m, torch.arange(6.0).reshape(2, 3).t() * (n * (n + 1) / 2), "non-contiguous")

    # async: Work.wait, Work.get_future().then
    t = torch.ones(4)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    assert work.wait()
    same(fut.wait(), torch.full((4,), 2.0 * n), "future then")

    for src in range(n):
        t = torch.full((3,), float(r))
        dist.broadcast(t, src)
        same(t, torch.full((3,), float(src)), f"broadcast from {src}")
    t = torch.full((2,), r + 1.0)
    dist.reduce(t, dst=n - 1)
    if r == n - 1:
        same(t, torch.full((2,), n * (n + 1) / 2), "reduce")

    outs = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    same(torch.stack(outs), ranks[:, None].expand(n, 2), "all_gather")
    flat = torch.zeros(n * 2)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
    same(flat, ranks.repeat_interleave(2), "all_gather_into_tensor")
    objs: list = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    assert objs == [{"rank": i} for i in range(n)]

    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(i + r)) for i in range(n)])
    same(out, torch.full((2,), float(n * r + ranks.sum())), "reduce_scatter")
    out = torch.zeros(1)
    dist.reduce_scatter_tensor(out, torch.arange(float(n)))
    same(out, torch.tensor([float(n * r)]), "reduce_scatter_tensor")

    gl = [torch.zeros(1) for _ in range(n)] if r == 0 else None
    dist.gather(torch.tensor([r * 10.0]), gl, dst=0)
    if r == 0:
        same(torch.cat(gl), ranks * 10, "gather")
    t = torch.zeros(1)
    dist.scatter(t, [torch.tensor([i * 3.0]) for i in range(n)] if r == 1 else None, src=1)
    same(t, torch.tensor([r * 3.0]), "scatter")

    outs = [torch.zeros(1) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([r * 100.0 + j]) for j in range(n)])
    same(torch.cat(outs), ranks * 100 + r, "all_to_all")
    # uneven: rank r sends j+1 rows to rank j
    send = torch.cat([torch.full((j + 1,), r * 10.0 + j) for j in range(n)])
    recv = torch.zeros(n * (r + 1))
    dist.all_to_all_single(recv, send, [r + 1] * n, [j + 1 for j in range(n)])
    same(recv, torch.cat([torch.full((r + 1,), i * 10.0 + r) for i in range(n)]), "a2a uneven")

    # point-to-point: a ring with batch_isend_irecv, then blocking and any-source receives
    got = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(r)), (r + 1) % n),
        dist.P2POp(dist.irecv, got, (r - 1) % n),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(got, torch.full((2,), float((r - 1) % n)), "batch_isend_irecv ring")
    if r != 0:
        dist.send(torch.tensor([r * 1.5]), dst=0, tag=7)
    else:
        seen = set()
        for _ in range(n - 1):
            t = torch.zeros(1)
            src = dist.recv(t, tag=7)  # any source
            same(t, torch.tensor([src * 1.5]), "recv any source")
            seen.add(src)
        assert seen == set(range(1, n))

    # a subgroup (a second backend instance of its own), and functional collectives
    sub = dist.new_group([0, n - 1])
    if r in (0, n - 1):
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=sub)
        same(t, torch.tensor([float(n - 1)]), "subgroup all_reduce")
    y = fc.all_reduce(torch.ones(3), "sum", dist.group.WORLD)
    same(torch.as_tensor(y.wait() if hasattr(y, "wait") else y), torch.full((3,), float(n)),
         "functional all_reduce")  # fmt: skip

    dist.barrier()
    tr = traffic()
    assert tr.bytes_sent > 0 and tr.bytes_received > 0 and tr.messages_sent > 0
    pycollective.destroy_process_group()
    dist.destroy_process_group()
    print(f"ok {checks}")


if __name__ == "__main__":
    main()
