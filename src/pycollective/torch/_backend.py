"""A torch.distributed ProcessGroup that runs every operation on pycollective.

torch calls the creator with its c10d store (already prefixed per group), this rank, the
group size and the timeout; we build a pycollective World of our own from that store (the
module-level default group of `import pycollective as dist` is left alone, so a program
may use both) and answer each torch operation with an asynchronous pycollective one,
returning a Work whose future completes on our engine thread. That asynchrony is what
lets DDP's gradient buckets travel while backward is still computing.

Ranks in torch's calls (rootRank, dst, src) are group ranks, and our world's ranks are
exactly the group's ranks, so they pass straight through.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as tdist

import torch

from .. import _config, _launch_env
from .._errors import UsageError
from ..api import collectives as _api
from ..api import p2p as _p2p
from ..core import rendezvous
from ..core.group import ProcessGroup as _OurGroup
from ..core.group import group_id_for
from ..core.work import Work as _OurWork
from ..core.world import World, count_traffic
from ..transport import counting as _traffic
from ._work import TorchWork, completed

BACKEND_NAME = "pycollective"

_instances = itertools.count()

# What issuing one operation leaves to do: our Works, then an optional copy-back.
_Issued = tuple[list["_OurWork | None"], "Callable[[], None] | None"]


def _reduce_op(opts: Any) -> Any:
    """torch's options carry a ReduceOp object; its RedOpType is what we translate."""
    if opts is None:
        return "sum"
    op = getattr(opts.reduceOp, "op", opts.reduceOp)
    if getattr(op, "name", "") == "PREMUL_SUM":
        raise UsageError("PREMUL_SUM is NCCL-only; the pycollective backend does not support it")
    return op


def _pairs(outputs: Sequence[Any], inputs: Sequence[Any]) -> list[tuple[Any, Any]]:
    if len(outputs) != len(inputs):
        raise UsageError(f"coalesced op: {len(outputs)} outputs but {len(inputs)} inputs")
    return list(zip(outputs, inputs, strict=True))


def _join(parts: list[_Issued]) -> _Issued:
    works = [w for ws, _ in parts for w in ws]
    finishes = [f for _, f in parts if f is not None]
    if not finishes:
        return works, None

    def run() -> None:
        for f in finishes:
            f()

    return works, run


def _dense(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise UsageError(f"{what} is on {t.device}; the pycollective backend is CPU only")
    return t


class _Staged:
    """Contiguous stand-ins for non-contiguous tensors, copied back when the op is done."""

    def __init__(self) -> None:
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def inp(self, t: torch.Tensor, what: str) -> torch.Tensor:
        _dense(t, what)
        return t if t.is_contiguous() else t.contiguous()

    def out(self, t: torch.Tensor, what: str) -> torch.Tensor:
        _dense(t, what)
        if t.is_contiguous():
            return t
        c = t.contiguous()
        self._back.append((t, c))
        return c

    def finish(self, then: Callable[[], None] | None = None) -> Callable[[], None] | None:
        if not self._back and then is None:
            return None
        back = self._back

        def run() -> None:
            if then is not None:
                then()
            for orig, c in back:
                orig.copy_(c)

        return run


class PycollectiveProcessGroup(tdist.ProcessGroup):
    """torch.distributed.ProcessGroup over a pycollective World (CPU tensors)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        seconds = _config.timeout_seconds(seconds if seconds and seconds > 0 else None)
        adapter = rendezvous.TorchStoreAdapter(store, "", "torch's c10d store")
        master_addr, multi_node = _where()
        self._world: World = rendezvous.connect_world(
            rank,
            size,
            adapter,
            seconds,
            f"pycollective-backend/{next(_instances)}",
            master_addr=master_addr,
            multi_node=multi_node,
        )
        self._world.owns_store = False  # torch owns its store
        ranks = tuple(range(size))
        self._pg = _OurGroup(self._world, ranks, group_id_for(ranks, 0), "torch-backend")
        self._traffic = count_traffic(self._world)
        self._group_name = ""
        if size > 1:
            # Every rank has read every address from the store once this returns.
            _api.barrier(group=self._pg)

    # ------------------------------------------------------------------ identity

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        # torch sets it through _set_group_name after construction; functional
        # collectives resolve groups by this name.
        return self._group_name or super().group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
        super()._set_group_name(name)

    def __repr__(self) -> str:
        return f"<PycollectiveProcessGroup rank={self.rank()} size={self.size()}>"

    @property
    def pycollective_group(self) -> _OurGroup:
        """The pycollective group underneath, usable with pycollective's own functions."""
        return self._pg

    def traffic(self) -> _traffic.TrafficSnapshot:
        """Bytes and messages this rank has sent and received through this group."""
        if self._traffic is None:
            return _traffic.TrafficSnapshot()
        return self._traffic.snapshot()

    def shutdown(self) -> None:
        if not self._world.closed:
            rendezvous.close_world(self._world)

    def abort(self) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ helpers

    def _work(
        self,
        works: Sequence[_OurWork | None],
        finish: Callable[[], None] | None,
        result: Any,
    ) -> TorchWork:
        return TorchWork([w for w in works if w is not None], result, finish)

    def _one(self, tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise UsageError(f"{op} takes exactly one tensor per process, got {len(tensors)}")
        return tensors[0]

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        op = _reduce_op(opts)
        staged = _Staged()
        works = [
            _api.all_reduce(staged.out(t, "allreduce tensor"), op, self._pg, async_op=True)
            for t in tensors
        ]
        return self._work(works, staged.finish(), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        """One all-reduce over the tensors laid end to end, then copied back."""
        if not tensors:
            return completed(tensors)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise UsageError(f"allreduce_coalesced needs one dtype, got {sorted(map(str, dtypes))}")
        op = _reduce_op(opts)
        flat = torch.cat([_dense(t, "allreduce tensor").reshape(-1) for t in tensors])
        work = _api.all_reduce(flat, op, self._pg, async_op=True)

        def copy_back() -> None:
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

        return self._work([work], copy_back, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        root = opts.rootRank if opts is not None else 0
        staged = _Staged()
        works = [
            _api.broadcast(
                staged.out(t, "broadcast tensor"), group=self._pg, async_op=True, group_src=root
            )
            for t in tensors
        ]
        return self._work(works, staged.finish(), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        root = opts.rootRank if opts is not None else 0
        op = _reduce_op(opts)
        staged = _Staged()
        t = staged.out(self._one(tensors, "reduce"), "reduce tensor")
        work = _api.reduce(t, op=op, group=self._pg, async_op=True, group_dst=root)
        return self._work([work], staged.finish(), tensors)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        outs = self._one(output_tensors, "allgather")
        inp = self._one(input_tensors, "allgather")
        return self._work(*self._allgather_list(outs, inp), output_tensors)

    def _allgather_list(self, outs: list[torch.Tensor], inp: torch.Tensor) -> _Issued:
        staged = _Staged()
        inp = staged.inp(inp, "allgather input")
        targets = [staged.out(o, "allgather output") for o in outs]
        return [_api.all_gather(targets, inp, self._pg, async_op=True)], staged.finish()

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> TorchWork:
        return self._work(*self._allgather_flat(output, input), output)

    all_gather_single = _allgather_base

    def _allgather_flat(self, output: torch.Tensor, input: torch.Tensor) -> _Issued:
        staged = _Staged()
        out = staged.out(output, "all_gather_into_tensor output")
        inp = staged.inp(input, "all_gather_into_tensor input")
        return [_api.all_gather_into_tensor(out, inp, self._pg, async_op=True)], staged.finish()

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        input_list: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        parts = [self._allgather_list(o, i) for o, i in _pairs(output_lists, input_list)]
        return self._work(*_join(parts), output_lists)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        parts = [self._allgather_flat(o, i) for o, i in _pairs(outputs, inputs)]
        return self._work(*_join(parts), outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        op = _reduce_op(opts)
        staged = _Staged()
        out = staged.out(self._one(output_tensors, "reduce_scatter"), "reduce_scatter output")
        ins = [staged.inp(t, "reduce_scatter input") for t in self._one(input_tensors, "rs")]
        work = _api.reduce_scatter(out, ins, op, self._pg, async_op=True)
        return self._work([work], staged.finish(), output_tensors)

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> TorchWork:
        return self._work(*self._reduce_scatter_flat(output, input, opts), output)

    reduce_scatter_single = _reduce_scatter_base

    def _reduce_scatter_flat(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Issued:
        op = _reduce_op(opts)
        staged = _Staged()
        out = staged.out(output, "reduce_scatter_tensor output")
        inp = staged.inp(input, "reduce_scatter_tensor input")
        work = _api.reduce_scatter_tensor(out, inp, op, self._pg, async_op=True)
        return [work], staged.finish()

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        parts = [self._reduce_scatter_flat(o, i, opts) for o, i in _pairs(outputs, inputs)]
        return self._work(*_join(parts), outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        root = opts.rootRank if opts is not None else 0
        staged = _Staged()
        inp = staged.inp(self._one(input_tensors, "gather"), "gather input")
        outs = None
        if self.rank() == root:
            outs = [staged.out(o, "gather output") for o in self._one(output_tensors, "gather")]
        work = _api.gather(inp, outs, group=self._pg, async_op=True, group_dst=root)
        return self._work([work], staged.finish(), output_tensors)

    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        root = opts.rootRank if opts is not None else 0
        staged = _Staged()
        out = staged.out(self._one(output_tensors, "scatter"), "scatter output")
        ins = None
        if self.rank() == root:
            ins = [staged.inp(t, "scatter input") for t in self._one(input_tensors, "scatter")]
        work = _api.scatter(out, ins, group=self._pg, async_op=True, group_src=root)
        return self._work([work], staged.finish(), output_tensors)

    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        staged = _Staged()
        outs = [staged.out(t, "alltoall output") for t in output_tensors]
        ins = [staged.inp(t, "alltoall input") for t in input_tensors]
        work = _api.all_to_all(outs, ins, self._pg, async_op=True)
        return self._work([work], staged.finish(), output_tensors)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> TorchWork:
        staged = _Staged()
        out = staged.out(output, "all_to_all_single output")
        inp = staged.inp(input, "all_to_all_single input")
        work = _api.all_to_all_single(
            out, inp, list(output_split_sizes) or None, list(input_split_sizes) or None,
            self._pg, async_op=True,
        )  # fmt: skip
        return self._work([work], staged.finish(), output)

    all_to_all_single = alltoall_base

    def barrier(self, opts: Any = None) -> TorchWork:
        return self._work([_api.barrier(self._pg, async_op=True)], None, None)

    # ------------------------------------------------------------------ point-to-point

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> TorchWork:
        t = _Staged().inp(self._one(tensors, "send"), "send tensor")
        work = _p2p.isend(t, group=self._pg, tag=tag, group_dst=dst)
        return self._work([work], None, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> TorchWork:
        staged = _Staged()
        t = staged.out(self._one(tensors, "recv"), "recv tensor")
        work = _p2p.irecv(t, group=self._pg, tag=tag, group_src=src)
        return self._work([work], staged.finish(), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> TorchWork:
        staged = _Staged()
        t = staged.out(self._one(tensors, "recv"), "recv tensor")
        work = _p2p.irecv(t, None, group=self._pg, tag=tag)
        return self._work([work], staged.finish(), tensors)


def _where() -> tuple[str | None, bool]:
    """Where rank 0 is and whether the job spans hosts (from the launcher's environment):
    a single-host job listens on loopback only, a multi-host one on the interface that
    routes to MASTER_ADDR."""
    try:
        env = _launch_env.detect()
    except UsageError:
        return None, False
    return env.master_addr, env.multi_node


def create_backend(
    store: Any, rank: int, size: int, timeout: datetime.timedelta
) -> PycollectiveProcessGroup:
    """The creator torch calls for init_process_group("pycollective") and new_group."""
    return PycollectiveProcessGroup(store, rank, size, timeout)
