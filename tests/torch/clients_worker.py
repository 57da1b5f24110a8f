"""torch's CPU clients on the pycollective backend, each beside gloo in the same process.

    clients_worker.py OUTDIR SCENARIO[,SCENARIO...]

The default group is pycollective; a gloo group over the same ranks runs every client a
second time, and the two results are compared: bitwise where the math allows (at two ranks
every sum is one addition, the same in any order), else within float rounding. Many
clients share one process (each torch import costs seconds here). Each scenario prints
`RESULT {"step": name, "ok": true, "checks": n}`, or its error.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._C import _distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
checks = 0


def equal(a: Any, b: Any, what: str, tol: float = 0.0) -> None:
    """a == b (tensors, or dicts/lists of them), bitwise when tol is 0."""
    global checks
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{what}: keys differ"
        for k in a:
            equal(a[k], b[k], f"{what}[{k}]", tol)
        return
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            equal(x, y, f"{what}[{i}]", tol)
        return
    if isinstance(a, torch.Tensor):
        if hasattr(a, "full_tensor"):
            a, b = a.full_tensor(), b.full_tensor()
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        assert a.shape == b.shape and a.dtype == b.dtype, (
            f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        )
        if tol == 0.0:
            assert torch.equal(a, b), f"{what}: differ by {(a.double() - b.double()).abs().max()}"
        else:
            diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
            assert diff <= tol, f"{what}: differ by {diff} > {tol}"
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"
    checks += 1


def resizable(*tensors: torch.Tensor) -> None:
    global checks
    for t in tensors:
        assert t.untyped_storage().resizable(), "a collective made a storage non-resizable"
        checks += 1


def params(m: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in m.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = v.detach().clone()
    return out


def mlp(seed: int = 0, width: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 4)
    )


def batches(n: int, seed: int = 1, rows: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed + RANK)
    return [
        (torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)) for _ in range(n)
    ]


# ---------------------------------------------------------------------- scenarios
# Each takes the group to run on and returns what must match between the backends.


def forms(pg: dist.ProcessGroup) -> dict[str, Any]:
    """Every call form of torch's C++ ProcessGroup API, called on the group object."""
    r, n = pg.rank(), pg.size()
    out: dict[str, Any] = {}
    t = torch.arange(2000, dtype=torch.float32) * (r + 1)
    seq0 = pg._get_sequence_number_for_group() if hasattr(pg, "_pg") else None
    pg.allreduce(t).wait()  # a bare tensor: one all-reduce of 2,000 elements, not 2,000
    if seq0 is not None:
        assert pg._get_sequence_number_for_group() == seq0 + 1, "a tensor became many calls"
    out["allreduce(t)"] = t
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        x = torch.tensor([r + 1.0, 2.0 - r])
        pg.allreduce([x], op).wait()  # a bare RedOpType
        out[f"allreduce([t], {op})"] = x
    x = torch.tensor([r + 1.0])
    pg.allreduce([x], dist.ReduceOp(dist.ReduceOp.MAX)).wait()  # a ReduceOp object
    out["allreduce(ReduceOp)"] = x
    o = c10d.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.MIN
    x = torch.tensor([r + 3.0])
    pg.allreduce([x], o).wait()
    out["allreduce(opts)"] = x
    x = torch.tensor([r + 1.0])
    pg.allreduce(x, op=dist.ReduceOp.SUM, timeout=datetime.timedelta(seconds=30)).wait()
    out["allreduce(t, op=, timeout=)"] = x
    x = torch.full((3,), float(r))
    pg.broadcast(x, 1).wait()  # an int root
    out["broadcast(t, root)"] = x
    bo = c10d.BroadcastOptions()
    bo.rootRank = 0
    x = torch.full((3,), float(r + 5))
    pg.broadcast([x], bo).wait()
    out["broadcast(opts)"] = x
    x = torch.full((2,), r + 1.0)
    pg.reduce(x, 1, dist.ReduceOp.SUM).wait()
    out["reduce(t, root, op)"] = x if r == 1 else None
    ro = c10d.ReduceOptions()
    ro.rootRank, ro.reduceOp = 0, dist.ReduceOp.MAX
    x = torch.full((2,), r + 1.0)
    pg.reduce([x], ro).wait()
    out["reduce(opts)"] = x if r == 0 else None
    outs = [torch.zeros(2) for _ in range(n)]
    pg.allgather(outs, torch.full((2,), float(r))).wait()  # outputs list, one input tensor
    out["allgather(list, t)"] = outs
    outs2 = [[torch.zeros(2) for _ in range(n)]]
    pg.allgather(outs2, [torch.full((2,), r + 0.5)], c10d.AllgatherOptions()).wait()
    out["allgather(opts)"] = outs2
    y = torch.zeros(2)
    pg.reduce_scatter(
        y, [torch.full((2,), float(i + r)) for i in range(n)], dist.ReduceOp.MAX
    ).wait()
    out["reduce_scatter(t, list, op)"] = y
    y = torch.zeros(2)
    rso = c10d.ReduceScatterOptions()
    rso.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter([y], [[torch.full((2,), float(i * r)) for i in range(n)]], rso).wait()
    out["reduce_scatter(opts)"] = y
    g = [torch.zeros(1) for _ in range(n)]
    pg.gather(g if r == 0 else [], torch.tensor([r * 2.0]), 0).wait()
    out["gather(list, t, root)"] = g if r == 0 else None
    s = torch.zeros(1)
    pg.scatter(s, [torch.tensor([i * 3.0]) for i in range(n)] if r == 1 else [], 1).wait()
    out["scatter(t, list, root)"] = s
    a2a = [torch.zeros(1) for _ in range(n)]
    pg.alltoall(
        a2a, [torch.tensor([r * 10.0 + j]) for j in range(n)], c10d.AllToAllOptions()
    ).wait()
    out["alltoall(opts)"] = a2a
    single = torch.zeros(n)
    pg.alltoall_base(
        single, torch.arange(float(n)) + r * n, [], [], datetime.timedelta(seconds=30)
    ).wait()
    out["alltoall_base(timeout)"] = single
    pg.barrier(c10d.BarrierOptions()).wait()
    pg.barrier(datetime.timedelta(seconds=30)).wait()
    # all_gather_coalesced: output_lists[r][j] is rank r's input j
    ins = [torch.full((2,), r + 1.0), torch.full((3,), -float(r))]
    lists = [[torch.zeros(2), torch.zeros(3)] for _ in range(n)]
    dist.all_gather_coalesced(lists, ins, group=pg)
    out["all_gather_coalesced"] = lists
    # torch's _coalescing_manager: the coalesced all-gather and reduce-scatter (one call
    # each on our backend), as FSDP and DTensor issue them
    ag = [torch.zeros(n * 3), torch.zeros(n * 2)]
    with dist._coalescing_manager(group=pg, async_ops=True) as cm:
        dist.all_gather_into_tensor(ag[0], torch.full((3,), r + 1.0), group=pg)
        dist.all_gather_into_tensor(ag[1], torch.full((2,), -r - 1.0), group=pg)
    cm.wait()
    out["coalesced all_gather_into_tensor"] = ag
    rs = [torch.zeros(3), torch.zeros(2)]
    with dist._coalescing_manager(group=pg, async_ops=True) as cm:
        dist.reduce_scatter_tensor(rs[0], torch.arange(n * 3.0) * (r + 1), group=pg)
        dist.reduce_scatter_tensor(rs[1], torch.arange(n * 2.0) - r, group=pg)
    cm.wait()
    out["coalesced reduce_scatter_tensor"] = rs
    resizable(t, *outs, y, single, *ag, *rs)
    return out


def p2p(pg: dist.ProcessGroup) -> dict[str, Any]:
    """batch_isend_irecv with every irecv listed before its isend, with and without tags."""
    r, n = pg.rank(), pg.size()
    out = {}
    for tagged in (False, True):
        ops, got = [], {}
        for peer in range(n):
            if peer == r:
                continue
            got[peer] = torch.full((peer + 1,) * 2, -1.0)
            ops.append(dist.P2POp(dist.irecv, got[peer], peer, pg, tag=peer if tagged else 0))
            ops.append(
                dist.P2POp(
                    dist.isend, torch.full((r + 1,) * 2, r + 1.0), peer, pg, tag=r if tagged else 0
                )
            )
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out[f"tagged={tagged}"] = [got[p] for p in sorted(got)]
    return out


def _ddp_train(
    pg, net, steps, data, join=False, divide=True, hook=None, state=None, bucket_mb=0.001
):
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(
        net,
        process_group=pg,
        **({"find_unused_parameters": True} if join == "unused" else {}),
        bucket_cap_mb=bucket_mb,
    )
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    mine = data[: steps - RANK] if join else data[:steps]  # uneven inputs: rank r has r fewer
    ctx = Join([ddp], divide_by_initial_world_size=divide) if join else _nullctx()
    with ctx:
        for i, (x, y) in enumerate(mine):
            opt.zero_grad()
            pred = ddp(x)
            if join == "unused" and i % 2 == 1:
                pred = pred.detach() * 0 + ddp.module[0].weight.sum()  # later layers unused
            F.mse_loss(pred, y).backward()
            opt.step()
    return params(ddp.module)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def lifetime(pg):
    """Works dropped at once do not pile up (the keep-alive registry lets them go), and
    pg.monitored_barrier, the form torch allows for a backend not named gloo, passes."""
    from pycollective.torch import _work as tw

    if hasattr(pg, "_pg"):
        before = tw.alive_count()
        for _ in range(1500):
            dist.all_reduce(torch.ones(2), group=pg, async_op=True)
        dist.barrier(group=pg)
        # done, but their deliveries may still be queued on the completion thread (which
        # holds them until then), on a loaded machine far behind
        assert tw.drain(), "deliveries still running"
        after = tw.alive_count()
        assert after < before + 100, f"{after - before} dropped works still held"
    pg.monitored_barrier(datetime.timedelta(seconds=20), wait_all_ranks=True)
    return {}


def join_both_ways(pg):
    data = batches(5)
    return {
        "divide=True": _ddp_train(pg, mlp(), 5, data, join=True, divide=True),
        "divide=False": _ddp_train(pg, mlp(), 5, data, join=True, divide=False),
    }


def ddp_unused_join(pg):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)
            self.unused = nn.Linear(8, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(Net(), process_group=pg, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with Join([ddp]):
        for x, y in batches(4)[: 4 - RANK]:
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
    return params(ddp.module)


def powersgd(pg):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    # torch 2.13's batched hook hands _orthogonalize a 2-D matrix where it now asserts a
    # batch of them (an AssertionError on every backend, once the bucket buffer's resize_
    # has passed: the step our resizable-storage fix is about); give it a batch of one.
    if not getattr(ps, "_pycollective_patched", False):
        batch_of_one = ps._orthogonalize
        ps._orthogonalize = lambda m, epsilon=0: batch_of_one(
            m.unsqueeze(0) if m.dim() == 2 else m, epsilon
        )
        ps._pycollective_patched = True
    out = {}
    for name, hook in (("plain", ps.powerSGD_hook), ("batched", ps.batched_powerSGD_hook)):
        state = ps.PowerSGDState(
            process_group=pg,
            matrix_approximation_rank=1,
            start_powerSGD_iter=2,
            min_compression_rate=0.5,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )
        # One bucket: a hook's callbacks then issue their collectives while the main thread
        # waits for the bucket, in the same order on every rank. (With several buckets, the
        # callbacks of one race the hook of the next to issue first: on gloo as on us.)
        out[name] = _ddp_train(
            pg, mlp(width=32), 5, batches(5), hook=hook, state=state, bucket_mb=25
        )
    return out


def sparse_ddp(pg):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Flatten(), nn.Linear(12, 2))
    ddp = DDP(net, process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(7 + RANK)
    for _ in range(4):
        idx = torch.randint(0, 20, (5, 3), generator=g)
        opt.zero_grad()
        ddp(idx).square().mean().backward()
        opt.step()
    # the sparse all-reduce itself, as torch's own test calls it
    i = torch.tensor([[RANK, 3]])
    v = torch.tensor([[1.0 + RANK, 2.0], [5.0, 6.0]])
    s = torch.sparse_coo_tensor(i, v, (4, 2))
    dist.all_reduce(s, group=pg)
    return {"params": params(ddp.module), "all_reduce": s.to_dense()}


def zero(pg):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = mlp(width=24)
    ddp = DDP(net, process_group=pg)
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, process_group=pg
    )
    for x, y in batches(4):
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    return params(net)


def functional(pg):
    import torch.distributed._functional_collectives as fc

    r = pg.rank()
    x = torch.arange(6.0) + r
    out = {
        "all_reduce": fc.all_reduce(x, "sum", pg),
        "all_reduce_max": fc.all_reduce(x, "max", pg),
        "all_gather": fc.all_gather_tensor(x, 0, pg),
        "reduce_scatter": fc.reduce_scatter_tensor(
            torch.arange(4.0 * pg.size()) * (r + 1), "sum", 0, pg
        ),
        "all_to_all": fc.all_to_all_single(torch.arange(2.0 * pg.size()) + 10 * r, None, None, pg),
        "broadcast": fc.broadcast(x, 1, pg),
        "coalesced": fc.all_reduce_coalesced([x, x * 2], "sum", pg),
    }
    return {
        k: (fc.wait_tensor(v) if isinstance(v, torch.Tensor) else [fc.wait_tensor(t) for t in v])
        for k, v in out.items()
    }


def fsdp2(pg):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(pg, "cpu")
    out = {}
    for name, kw in (
        ("reshard", {"reshard_after_forward": True}),
        ("no-reshard", {"reshard_after_forward": False}),
        (
            "bf16",
            {
                "mp_policy": MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16
                )
            },
        ),
    ):
        net = mlp(width=16)
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, **kw)
        fully_shard(net, mesh=mesh, **kw)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in batches(3):
            opt.zero_grad()
            F.mse_loss(net(x).float(), y).backward()
            opt.step()
        out[name] = params(net)
    return out


def cpu_backend(pg):
    """torch's own callers of pg._get_backend(cpu) and pg._device_types: DCP's broadcast of
    a state dict from rank 0 (set_model_state_dict's broadcast_from_rank0 path, which picks
    its device from _device_types), FSDP2 taking its communication buffers from the group
    (set_allocate_memory_from_process_group_for_comm: _get_backend(cpu).supports_tensor_alloc),
    and the collective time estimator (refuses both backends alike)."""
    from torch.distributed._state_dict_utils import _broadcast_state_dict
    from torch.distributed.distributed_c10d import _time_estimator
    from torch.distributed.fsdp import fully_shard

    global checks
    cpu = torch.device("cpu")
    backend = pg._get_backend(cpu)
    assert cpu in pg._device_types, pg._device_types
    assert backend.supports_tensor_alloc(cpu) is False
    checks += 1
    torch.manual_seed(4)
    full = {"w": torch.randn(5, 3), "b": torch.randn(4), "step": 7} if RANK == 0 else {}
    local = {"w": torch.zeros(5, 3), "b": torch.zeros(4), "step": 0}
    _broadcast_state_dict(full, local, device=cpu, pg=pg)
    mesh = DeviceMesh.from_group(pg, "cpu")
    net = mlp(width=16)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    net.set_allocate_memory_from_process_group_for_comm(True)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(3):
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
    try:
        with _time_estimator(group=pg):
            pass
        estimator = "ran"
    except NotImplementedError:
        estimator = "not supported"
    return {"broadcast": local, "fsdp2_group_memory": params(net), "estimator": estimator}


def fsdp1(pg):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy, StateDictType

    out = {}
    for name, kw in (
        ("full", {"sharding_strategy": ShardingStrategy.FULL_SHARD}),
        ("grad-op", {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP}),
        ("orig-params", {"use_orig_params": True}),
        (
            "mixed",
            {
                "mixed_precision": MixedPrecision(
                    param_dtype=torch.float16, reduce_dtype=torch.float32
                )
            },
        ),
    ):
        net = FSDP(mlp(width=16), process_group=pg, device_id=torch.device("cpu"), **kw)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in batches(3):
            opt.zero_grad()
            F.mse_loss(net(x).float(), y).backward()
            opt.step()
        with FSDP.state_dict_type(net, StateDictType.FULL_STATE_DICT):
            out[name] = {k: v.clone() for k, v in net.state_dict().items()}
    return out


def tensor_parallel(pg):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = DeviceMesh.from_group(pg, "cpu")
    torch.manual_seed(3)
    full = torch.randn(6, 4)
    d = distribute_tensor(full, mesh, [Shard(0)])
    out = {
        "redistribute": d.redistribute(mesh, [Replicate()]).to_local(),
        "sum": (d * 2).sum().full_tensor(),
    }
    net = mlp(width=16)
    parallelize_module(net, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(3, seed=5 - RANK):  # the same data on every rank, as TP wants
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
    out["tp"] = params(net)
    return out


def pipelining(pg):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    out = {}
    for name, schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        full = mlp(width=16)
        stage_mod = (
            nn.Sequential(*list(full.children())[:2])
            if RANK == 0
            else nn.Sequential(*list(full.children())[2:])
        )
        stage = PipelineStage(stage_mod, RANK, 2, torch.device("cpu"), group=pg)
        sched = schedule(stage, n_microbatches=4, loss_fn=lambda o, t: F.mse_loss(o, t))
        opt = torch.optim.SGD(stage_mod.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(11)
        for _ in range(2):
            x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
            opt.zero_grad()
            if RANK == 0:
                sched.step(x)
            else:
                losses: list = []
                sched.step(target=y, losses=losses)
            opt.step()
        out[name] = params(stage_mod)
    return out


def dcp_cross(pgs):
    """Save through one backend, load through the other, both ways; sharded DTensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor

    ours, gloo = pgs
    root = os.path.join(OUT, "dcp")
    torch.manual_seed(9)
    full = {"w": torch.randn(8, 3), "b": torch.randn(5)}
    result = {}
    for src_name, src, dst in (("ours->gloo", ours, gloo), ("gloo->ours", gloo, ours)):
        path = os.path.join(root, src_name.replace(">", ""))
        m_src, m_dst = DeviceMesh.from_group(src, "cpu"), DeviceMesh.from_group(dst, "cpu")
        sd = {"w": distribute_tensor(full["w"], m_src, [Shard(0)]), "b": full["b"].clone()}
        dcp.save(sd, checkpoint_id=path, process_group=src)
        into = {"w": distribute_tensor(torch.zeros(8, 3), m_dst, [Shard(0)]), "b": torch.zeros(5)}
        dcp.load(into, checkpoint_id=path, process_group=dst)
        equal(into["w"].full_tensor(), full["w"], f"dcp {src_name} w")
        equal(into["b"], full["b"], f"dcp {src_name} b")
        result[src_name] = into["w"].to_local()
    return result


def subgroups(pg_pair):
    """new_subgroups at 4 ranks, then a collective in each."""
    out = {}
    for backend in ("pycollective", "gloo"):
        cur, _all = dist.new_subgroups(group_size=2, backend=backend)
        t = torch.tensor([float(RANK)])
        dist.all_reduce(t, group=cur)
        out[backend] = t
    equal(out["pycollective"], out["gloo"], "new_subgroups all_reduce")
    return out["pycollective"]


def mesh2d(pg_pair):
    """A 2x2 mesh at 4 ranks: DTensor over both dimensions, and FSDP2 x TP."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    results = {}
    for backend in ("pycollective", "gloo"):
        groups = {}
        for dim, sets in (("dp", ([0, 2], [1, 3])), ("tp", ([0, 1], [2, 3]))):
            for ranks in sets:
                g = dist.new_group(ranks, backend=backend)
                if RANK in ranks:
                    groups[dim] = g
        mesh = DeviceMesh.from_group(
            [groups["dp"], groups["tp"]],
            "cpu",
            mesh=torch.arange(4).view(2, 2),
            mesh_dim_names=("dp", "tp"),
        )
        torch.manual_seed(4)
        full = torch.randn(4, 6)
        d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
        out = {"dtensor": (d + 1).full_tensor()}
        net = mlp(width=16)
        parallelize_module(net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(net, mesh=mesh["dp"])
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(20 + RANK // 2)  # the same data within a TP pair
        for _ in range(3):
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            opt.step()
        out["fsdp2xtp"] = params(net)
        results[backend] = out
    # 2 ranks per dimension: each sum is one addition, so bitwise
    equal(results["pycollective"], results["gloo"], "2-D mesh")
    return results["pycollective"]


# name -> (function, how it runs: "each" = once per backend group, compared here;
#          "both" = it gets both groups and compares itself), tolerance
SCENARIOS: dict[str, tuple[Callable[..., Any], str, float]] = {
    "forms": (forms, "each", 0.0),
    "p2p": (p2p, "each", 0.0),
    "lifetime": (lifetime, "each", 0.0),
    "join_both_ways": (join_both_ways, "each", 0.0),
    "ddp_unused_join": (ddp_unused_join, "each", 0.0),
    "powersgd": (powersgd, "each", 0.0),
    "sparse_ddp": (sparse_ddp, "each", 0.0),
    "zero": (zero, "each", 0.0),
    "functional": (functional, "each", 0.0),
    "fsdp2": (fsdp2, "each", 0.0),
    "fsdp1": (fsdp1, "each", 0.0),
    "cpu_backend": (cpu_backend, "each", 0.0),
    "tensor_parallel": (tensor_parallel, "each", 0.0),
    "pipelining": (pipelining, "each", 0.0),
    "dcp_cross": (dcp_cross, "both", 0.0),
    "subgroups": (subgroups, "both", 0.0),
    "mesh2d": (mesh2d, "both", 0.0),
}


def main() -> None:
    names = sys.argv[2].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("pycollective", timeout=datetime.timedelta(seconds=60))
    ours = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    for name in names:
        fn, how, tol = SCENARIOS[name]
        global checks
        checks = 0
        try:
            if how == "each":
                a, b = fn(ours), fn(gloo)
                equal(a, b, name, tol)
            else:
                fn((ours, gloo))
            print("RESULT " + json.dumps({"step": name, "ok": True, "checks": checks}), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported per scenario
            print(
                "RESULT "
                + json.dumps(
                    {
                        "step": name,
                        "ok": False,
                        "error": repr(exc),
                        "trace": traceback.format_exc()[-3000:],
                    }
                ),
                flush=True,
            )
            raise
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
