"""A torch.distributed ProcessGroup that runs every operation on pycollective.

torch calls the creator with its c10d store (already prefixed per group), this rank, the
group size and the timeout; we build a pycollective World of our own from that store (the
module-level default group of `import pycollective as dist` is left alone, so a program
may use both) and answer each torch operation with a pycollective one. A call torch makes
asynchronously (DDP's gradient buckets, FSDP's) returns a Work whose future completes on
a completion thread (torch/_work.py), so the buckets travel while backward is still
computing; a call the caller waits for at once runs in the caller's thread.

Ranks in torch's calls (rootRank, dst, src) are group ranks, and our world's ranks are
exactly the group's ranks, so they pass straight through.

This file holds the group and its methods; beside it: torch's call forms (_forms.py), the
tensors' views (_views.py), works (_work.py), the coalesced calls (_coalesced.py),
point-to-point and the monitored barrier (_p2p.py), the sparse all-reduce (_sparse.py),
torch's stores (_store.py).
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Sequence
from sys import _getframe
from typing import Any

import torch.distributed as tdist
from torch._C import _distributed_c10d as _c10d

import torch

from .. import _config, _ray_job
from ..api import collectives as _api
from ..core import rendezvous
from ..core.group import ProcessGroup as _OurGroup
from ..core.group import group_id_for
from ..core.work import Work as _OurWork
from ..core.world import World, count_traffic
from ..transport import counting as _traffic
from . import _coalesced, _p2p, _work
from ._forms import (
    WAITS_ONLY_ON_A_WORK,
    _by_reduce_op,  # torch's ReduceOp hash -> ours, for the short way
    asynchronous,
    is_options,
    known_op,
    one,
    op_of,
    profiling,
    root_of,
    synchronous_call,
    tensors_of,
    timeout_of,
    torch_call,
)
from ._sparse import sparse_all_reduce
from ._store import meeting_place
from ._views import Staged
from ._work import DoneSlot, Issued, TorchWork, torch_error

BACKEND_NAME = "pycollective"
_CPU = torch.device("cpu")
_AllreduceOptions = tdist.AllreduceOptions
_BroadcastOptions = tdist.BroadcastOptions
_ReduceOptions = _c10d.ReduceOptions
_AllgatherOptions = _c10d.AllgatherOptions
_ReduceScatterOptions = _c10d.ReduceScatterOptions

_instances = itertools.count()


class PycollectiveProcessGroup(tdist.ProcessGroup):
    """torch.distributed.ProcessGroup over a pycollective World (CPU tensors)."""

    _profile_name = BACKEND_NAME  # the prefix of its events in torch's profiler

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        seconds = _config.timeout_seconds(seconds if seconds and seconds > 0 else None)
        adapter = rendezvous.TorchStoreAdapter(store, "", "torch's c10d store")
        master_addr, multi_node = meeting_place(store)
        self._world: World = rendezvous.connect_world(
            rank,
            size,
            adapter,
            seconds,
            f"pycollective-backend/{next(_instances)}",
            master_addr=master_addr,
            multi_node=multi_node,
            # A Ray job's workers (Ray Train's) prove the Ray job's secret: the runtime
            # env's PYCOLLECTIVE_SECRET, else the one the job keeps in Ray's KV.
            secret=_ray_job.job_secret() if _ray_job.ray_worker() is not None else None,
        )
        self._world.owns_store = False  # torch owns its store
        ranks = tuple(range(size))
        self._pg = _OurGroup(self._world, ranks, group_id_for(ranks, 0), "torch-backend")
        self._traffic = count_traffic(self._world)
        self._group_name = ""
        # the tensors' views of synchronous calls at 2+ ranks: the group's, which our
        # API shares when called with torch tensors (_buffers.TensorViews)
        self._views = self._pg.tensor_views
        self._done = DoneSlot()  # the works of synchronous calls
        self._solo = size == 1  # no compiled path for the views to reach
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

    # ------------------------------------------------------------------ per-device backend

    # torch's code asks a group for its backend on a device (FSDP2's allocation from the
    # group, _set_pg_timeout, shrink_group, the time estimator) and for the devices it has
    # one for (DCP's broadcast from rank 0 indexes _device_types). gloo's group answers for
    # "cpu" with the ProcessGroupGloo registered there. torch takes the ProcessGroup a
    # creator returns as the group itself, and a c10d Backend cannot be made in Python, so
    # this group is its own CPU backend: it answers for "cpu" with itself, and for any other
    # device as torch does for a device with no backend.

    @property
    def _device_types(self) -> list[torch.device]:
        return [_CPU]

    def _get_backend(self, device: torch.device | str) -> PycollectiveProcessGroup:
        kind = torch.device(device).type
        if kind != "cpu":
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    # What torch's callers ask of a Backend: none of these is offered.
    supports_splitting = False
    supports_coalescing = False
    supports_shrinking = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: torch.device | str) -> bool:
        """No memory of the group's own: callers fall back to torch.empty."""
        return False

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
        """Close the world, then wait (bounded) for the torch callbacks of works already
        completed: destroy_process_group returns with none of them still running."""
        if not self._world.closed:
            rendezvous.close_world(self._world)
        self._done.release()
        _work.drain()

    def abort(self) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ helpers

    def _work(
        self,
        works: Sequence[_OurWork | None],
        finish: Callable[[], None] | None,
        result: Any,
        timeout: float | None = None,
    ) -> tdist.Work:
        pending = [w for w in works if w is not None]
        if not pending:  # a synchronous call (our API returns None), or nothing issued
            if finish is not None:
                finish()
            return self._done.take(result)
        return TorchWork(pending, result, finish, timeout)

    def _sync_view(self, t: torch.Tensor, what: str) -> Any:
        """What a call passes our API for contiguous CPU tensor `t`: in a synchronous call
        at 2+ ranks its view (TensorViews), so that the next call like it takes the method's
        short way; else `t`."""
        if self._solo or asynchronous():
            return t
        return self._views.get(t, what)

    # ------------------------------------------------------------------ sequence numbers

    def _set_sequence_number_for_group(self) -> None:
        """torch calls this on a new gloo/nccl group: ours number their calls from 0 on
        every rank already."""

    def _get_sequence_number_for_group(self) -> int:
        return self._pg._seq

    # ------------------------------------------------------------------ collectives

    # torch's `dist.all_reduce`, `broadcast`, `reduce`, `all_gather_into_tensor` and
    # `reduce_scatter_tensor` without async_op, repeated on the same tensors (a loss, a flag,
    # a step's metrics), take a short way: the views and the op found from before, the
    # group's compiled path (our API only when it declines), and no Work for torch's own
    # functions (_forms.WAITS_ONLY_ON_A_WORK; other callers get the group's reusable
    # DoneWork). Any other form, or what the short way has not seen, goes through the
    # method in full.

    def allreduce(
        self, tensors: Any, opts: Any = None, timeout: Any = None, *, op: Any = None
    ) -> tdist.Work | None:
        """allreduce([t...], AllreduceOptions) | allreduce([t...] or t, op, timeout)."""
        # The short way, inlined (each helper call here costs a tenth of the whole): the
        # synchronous_call test, the view, the op from before, the compiled path.
        if (
            type(opts) is _AllreduceOptions
            and type(tensors) is list
            and len(tensors) == 1
            and timeout is None
            and op is None
            and opts.asyncOp is False
            and not profiling()
        ):
            view = self._views.known(tensors[0])
            if view is not None:
                rop = _by_reduce_op.get(hash(opts.reduceOp))
                if rop is not None:
                    try:
                        fast = self._pg.fast
                        if fast is None or not fast.all_reduce(view, rop):
                            _api.all_reduce(view, rop, self._pg)  # declined: the API's way
                    except BaseException as exc:
                        raise torch_error(exc) from None
                    if _getframe(1).f_code in WAITS_ONLY_ON_A_WORK:
                        return None  # torch's dist.all_reduce: done, nothing to wait on
                    return self._done.take(tensors)
        return self._allreduce(tensors, opts, timeout, op=op)

    @torch_call("all_reduce")
    def _allreduce(
        self, tensors: Any, opts: Any = None, timeout: Any = None, *, op: Any = None
    ) -> tdist.Work:
        tensors = tensors_of(tensors, "allreduce tensors")
        rop = op_of(op if op is not None else opts)
        seconds = timeout_of(opts, timeout)
        for t in tensors:
            if t.is_sparse:
                return self._sparse_allreduce(tensors, rop, seconds)
        staged = Staged()
        run_async = asynchronous()
        if run_async or self._solo:
            works = [
                _api.all_reduce(
                    staged.out(t, "allreduce tensor"), rop, self._pg, async_op=run_async
                )
                for t in tensors
            ]
            return self._work(works, staged.finish(), tensors, seconds)
        for t in tensors:
            t = staged.out(t, "allreduce tensor")
            _api.all_reduce(self._views.get(t, "allreduce tensor"), rop, self._pg)
        return self._work([], staged.finish(), tensors, seconds)

    def _sparse_allreduce(
        self, tensors: list[torch.Tensor], op: Any, seconds: float | None
    ) -> tdist.Work:
        t = one(tensors, "sparse allreduce")
        sparse_all_reduce(self._pg, t, op)
        return self._work([], None, [t], seconds)

    @torch_call("all_reduce")
    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> tdist.Work:
        """One all-reduce over the tensors laid end to end, then copied back."""
        return _coalesced.allreduce_coalesced(self, tensors, opts)

    def broadcast(
        self, tensors: Any, opts: Any = None, timeout: Any = None, *, root: Any = None
    ) -> tdist.Work | None:
        """broadcast([t...], BroadcastOptions) | broadcast(t, root, timeout)."""
        if (
            type(opts) is _BroadcastOptions
            and type(tensors) is list
            and len(tensors) == 1
            and timeout is None
            and root is None
            and opts.asyncOp is False
            and not profiling()
        ):
            view = self._views.known(tensors[0])
            if view is not None:
                src = opts.rootRank
                try:
                    fast = self._pg.fast
                    if fast is None or not fast.broadcast(view, src):
                        _api.broadcast(view, src, self._pg)  # declined: the API's way
                except BaseException as exc:
                    raise torch_error(exc) from None
                if _getframe(1).f_code in WAITS_ONLY_ON_A_WORK:
                    return None  # torch's dist.broadcast: done, nothing to wait on
                return self._done.take(tensors)
        return self._broadcast(tensors, opts, timeout, root=root)

    @torch_call("broadcast")
    def _broadcast(
        self, tensors: Any, opts: Any = None, timeout: Any = None, *, root: Any = None
    ) -> tdist.Work:
        tensors = tensors_of(tensors, "broadcast tensors")
        src = root_of(root if root is not None else opts)
        staged = Staged()
        run_async = asynchronous()
        if run_async or self._solo:
            works = [
                _api.broadcast(
                    staged.out(t, "broadcast tensor"),
                    group=self._pg,
                    async_op=run_async,
                    group_src=src,
                )
                for t in tensors
            ]
            return self._work(works, staged.finish(), tensors, timeout_of(opts, timeout))
        for t in tensors:
            t = staged.out(t, "broadcast tensor")
            _api.broadcast(self._views.get(t, "broadcast tensor"), src, self._pg)
        return self._work([], staged.finish(), tensors, timeout_of(opts, timeout))

    def reduce(
        self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None,
        *, root: Any = None,
    ) -> tdist.Work | None:  # fmt: skip
        """reduce([t], ReduceOptions) | reduce(t, root, op, timeout)."""
        if (
            synchronous_call(opts, _ReduceOptions)
            and type(tensors) is list
            and len(tensors) == 1
            and op is None
            and timeout is None
            and root is None
        ):
            view = self._views.known(tensors[0])
            rop = known_op(opts)
            if view is not None and rop is not None:
                dst = opts.rootRank  # a group rank, and our world's ranks are the group's
                try:
                    fast = self._pg.fast
                    if fast is None or not fast.reduce(view, dst, rop):
                        _api.reduce(view, dst, rop, self._pg)  # declined: the API's way
                except BaseException as exc:
                    raise torch_error(exc) from None
                if _getframe(1).f_code in WAITS_ONLY_ON_A_WORK:
                    return None  # torch's function: done, nothing to wait on
                return self._done.take(tensors)
        return self._reduce(tensors, opts, op, timeout, root=root)

    @torch_call("reduce")
    def _reduce(
        self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None,
        *, root: Any = None,
    ) -> tdist.Work:  # fmt: skip
        tensors = tensors_of(tensors, "reduce tensors")
        if is_options(opts):
            dst, rop = root_of(opts), op_of(opts)
        else:
            dst, rop = root_of(root if root is not None else opts), op_of(op)
        staged = Staged()
        t = self._sync_view(staged.out(one(tensors, "reduce"), "reduce tensor"), "reduce tensor")
        # dst as a global rank (the same number here): what the compiled path learns
        work = _api.reduce(t, dst, rop, self._pg, async_op=asynchronous())
        return self._work([work], staged.finish(), tensors, timeout_of(opts, timeout))

    @torch_call("all_gather", 1)
    def allgather(
        self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None
    ) -> tdist.Work:
        """allgather([[out...]], [t], AllgatherOptions) | allgather([out...], t, timeout)."""
        if isinstance(input_tensors, torch.Tensor):  # the single-tensor form
            outs, inp = list(output_tensors), input_tensors
        else:
            outs = list(one(output_tensors, "allgather"))
            inp = one(input_tensors, "allgather")
        issued = self._allgather_list(outs, inp)
        return self._work(*issued, output_tensors, timeout_of(opts, timeout))

    def _allgather_list(self, outs: list[torch.Tensor], inp: torch.Tensor) -> Issued:
        staged = Staged()
        inp = staged.inp(inp, "allgather input")
        targets = [staged.out(o, "allgather output") for o in outs]
        return [_api.all_gather(targets, inp, self._pg, async_op=asynchronous())], staged.finish()

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> tdist.Work | None:
        """all_gather_into_tensor(output, input, AllgatherOptions)."""
        if synchronous_call(opts, _AllgatherOptions):
            out, inp = self._views.known(output), self._views.known(input)
            if out is not None and inp is not None:
                try:
                    fast = self._pg.fast
                    if fast is None or not fast.all_gather(out, inp):
                        _api.all_gather_into_tensor(out, inp, self._pg)  # the API's way
                except BaseException as exc:
                    raise torch_error(exc) from None
                if _getframe(1).f_code in WAITS_ONLY_ON_A_WORK:
                    return None  # torch's function: done, nothing to wait on
                return self._done.take(output)
        return self._allgather_into_tensor(output, input, opts)

    @torch_call("all_gather_into_tensor", 1)
    def _allgather_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> tdist.Work:
        return self._work(*self._allgather_flat(output, input), output, timeout_of(opts))

    all_gather_single = _allgather_base

    def _allgather_flat(self, output: torch.Tensor, input: torch.Tensor) -> Issued:
        staged = Staged()
        out = self._sync_view(staged.out(output, "all_gather_into_tensor output"), "output")
        inp = self._sync_view(staged.inp(input, "all_gather_into_tensor input"), "input")
        return [
            _api.all_gather_into_tensor(out, inp, self._pg, async_op=asynchronous())
        ], staged.finish()

    @torch_call("all_gather", 1)
    def allgather_coalesced(
        self, output_lists: Any, input_list: Any, opts: Any = None
    ) -> tdist.Work:
        """output_lists[r][j] receives rank r's input_list[j] (torch's layout)."""
        return _coalesced.allgather_coalesced(self, output_lists, input_list, opts)

    @torch_call("all_gather_into_tensor_coalesced", 1)
    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> tdist.Work:
        return _coalesced.allgather_into_tensor_coalesced(self, outputs, inputs, opts)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @torch_call("reduce_scatter")
    def reduce_scatter(
        self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None,
        *, op: Any = None,
    ) -> tdist.Work:  # fmt: skip
        """reduce_scatter([out], [[in...]], ReduceScatterOptions) |
        reduce_scatter(out, [in...], op, timeout)."""
        if isinstance(output_tensors, torch.Tensor):  # the single-tensor form
            out_t, ins_t = output_tensors, list(input_tensors)
        else:
            out_t = one(output_tensors, "reduce_scatter")
            ins_t = list(one(input_tensors, "reduce_scatter"))
        rop = op_of(op if op is not None else opts)
        staged = Staged()
        out = staged.out(out_t, "reduce_scatter output")
        ins = [staged.inp(t, "reduce_scatter input") for t in ins_t]
        work = _api.reduce_scatter(out, ins, rop, self._pg, async_op=asynchronous())
        return self._work([work], staged.finish(), output_tensors, timeout_of(opts, timeout))

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> tdist.Work | None:
        """reduce_scatter_tensor(output, input, ReduceScatterOptions)."""
        if synchronous_call(opts, _ReduceScatterOptions):
            out, inp = self._views.known(output), self._views.known(input)
            rop = known_op(opts)
            if out is not None and inp is not None and rop is not None:
                try:
                    fast = self._pg.fast
                    if fast is None or not fast.reduce_scatter(out, inp, rop):
                        _api.reduce_scatter_tensor(out, inp, rop, self._pg)  # the API's way
                except BaseException as exc:
                    raise torch_error(exc) from None
                if _getframe(1).f_code in WAITS_ONLY_ON_A_WORK:
                    return None  # torch's function: done, nothing to wait on
                return self._done.take(output)
        return self._reduce_scatter_into_tensor(output, input, opts)

    @torch_call("reduce_scatter_tensor")
    def _reduce_scatter_into_tensor(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> tdist.Work:
        issued = self._reduce_scatter_flat(output, input, opts)
        return self._work(*issued, output, timeout_of(opts))

    reduce_scatter_single = _reduce_scatter_base

    def _reduce_scatter_flat(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Issued:
        op = op_of(opts)
        staged = Staged()
        out = self._sync_view(staged.out(output, "reduce_scatter_tensor output"), "output")
        inp = self._sync_view(staged.inp(input, "reduce_scatter_tensor input"), "input")
        work = _api.reduce_scatter_tensor(out, inp, op, self._pg, async_op=asynchronous())
        return [work], staged.finish()

    @torch_call("reduce_scatter_tensor_coalesced")
    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> tdist.Work:
        return _coalesced.reduce_scatter_tensor_coalesced(self, outputs, inputs, opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @torch_call("gather", 1)
    def gather(
        self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None
    ) -> tdist.Work:
        """gather([[out...]] on the root, [t], GatherOptions) |
        gather([out...], t, root, timeout)."""
        if isinstance(input_tensors, torch.Tensor):  # the single-tensor form
            inp_t, dst = input_tensors, root_of(opts)
            outs_t = list(output_tensors) if self.rank() == dst else None
            seconds = timeout_of(timeout)
        else:
            inp_t, dst = one(input_tensors, "gather"), root_of(opts)
            outs_t = list(one(output_tensors, "gather")) if self.rank() == dst else None
            seconds = timeout_of(opts)
        staged = Staged()
        inp = staged.inp(inp_t, "gather input")
        outs = None if outs_t is None else [staged.out(o, "gather output") for o in outs_t]
        work = _api.gather(inp, outs, group=self._pg, async_op=asynchronous(), group_dst=dst)
        return self._work([work], staged.finish(), output_tensors, seconds)

    @torch_call("scatter", 1)
    def scatter(
        self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None
    ) -> tdist.Work:
        """scatter([out], [[in...]] on the root, ScatterOptions) |
        scatter(out, [in...], root, timeout)."""
        src = root_of(opts)
        if isinstance(output_tensors, torch.Tensor):  # the single-tensor form
            out_t = output_tensors
            ins_t = list(input_tensors) if self.rank() == src else None
            seconds = timeout_of(timeout)
        else:
            out_t = one(output_tensors, "scatter")
            ins_t = list(one(input_tensors, "scatter")) if self.rank() == src else None
            seconds = timeout_of(opts)
        staged = Staged()
        out = staged.out(out_t, "scatter output")
        ins = None if ins_t is None else [staged.inp(t, "scatter input") for t in ins_t]
        work = _api.scatter(out, ins, group=self._pg, async_op=asynchronous(), group_src=src)
        return self._work([work], staged.finish(), output_tensors, seconds)

    @torch_call("all_to_all", 1)
    def alltoall(
        self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> tdist.Work:  # fmt: skip
        staged = Staged()
        outs = [staged.out(t, "alltoall output") for t in output_tensors]
        ins = [staged.inp(t, "alltoall input") for t in input_tensors]
        work = _api.all_to_all(outs, ins, self._pg, async_op=asynchronous())
        return self._work([work], staged.finish(), output_tensors, timeout_of(opts))

    @torch_call("all_to_all", 1)
    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> tdist.Work:
        """(out, in, out_splits, in_splits, AllToAllOptions or a timeout)."""
        staged = Staged()
        out = staged.out(output, "all_to_all_single output")
        inp = staged.inp(input, "all_to_all_single input")
        work = _api.all_to_all_single(
            out, inp, list(output_split_sizes) or None, list(input_split_sizes) or None,
            self._pg, async_op=asynchronous(),
        )  # fmt: skip
        return self._work([work], staged.finish(), output, timeout_of(opts))

    all_to_all_single = alltoall_base

    @torch_call("barrier")
    def barrier(self, opts: Any = None, timeout: Any = None) -> tdist.Work:
        """barrier(BarrierOptions) | barrier(timeout)."""
        seconds = timeout_of(timeout, opts)
        return self._work([_api.barrier(self._pg, async_op=asynchronous())], None, None, seconds)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive, with gloo's messages.

        torch's `dist.monitored_barrier` refuses every backend not named "gloo" before it
        reaches one; call this on the group object instead (or pycollective's own
        `monitored_barrier`)."""
        _p2p.monitored_barrier(self, timeout, wait_all_ranks)

    # ------------------------------------------------------------------ point-to-point

    @torch_call("send")
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> tdist.Work:  # noqa: N803
        return _p2p.send(self, tensors, dstRank, tag)

    @torch_call("recv")
    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> tdist.Work:  # noqa: N803
        return _p2p.recv(self, tensors, srcRank, tag)

    @torch_call("recvAnySource")
    def recv_anysource(self, tensors: Any, tag: int = 0) -> tdist.Work:
        return _p2p.recv_anysource(self, tensors, tag)


def create_backend(
    store: Any, rank: int, size: int, timeout: datetime.timedelta
) -> PycollectiveProcessGroup:
    """The creator torch calls for init_process_group("pycollective") and new_group."""
    return PycollectiveProcessGroup(store, rank, size, timeout)
