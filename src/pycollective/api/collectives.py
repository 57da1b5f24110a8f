"""The torch.distributed functional API: tensor collectives and point-to-point.

Each function checks every argument on this rank before anything is sent (a UsageError
says what is wrong), views the buffers without copying, and hands the collective to its
group. Lists of tensors are gathered into one contiguous buffer and copied back, because
schedules work on flat buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._buffers import Buffer, as_buffer, is_torch_tensor
from .._dtypes import BYTE, DType
from .._errors import UsageError
from .._reduce_ops import ReduceOp, check_op_dtype, to_reduce_op
from ..core.call import CollectiveCall
from ..core.group import ProcessGroup, average_after
from ..core.work import Work
from . import _default as _state

SUM = ReduceOp.SUM


# ---------------------------------------------------------------------- argument helpers


def _group(group: ProcessGroup | None) -> ProcessGroup:
    return _state.resolve_group(group)


def _fast(group: ProcessGroup | None) -> Any:
    """The compiled path of repeated calls of `group` (the default one if None), or None:
    no group yet, not one of ours, or none made (ProcessGroup.fast)."""
    g = _state.DEFAULT.group if group is None else group
    try:
        return g.fast  # type: ignore[union-attr]
    except AttributeError:
        return None


def _with_view(
    run: Callable[..., bool], group: ProcessGroup | None, tensor: Any, *keys: Any
) -> bool:
    """For a synchronous call the compiled path declined: offer it to `run` again with the
    view of torch tensor `tensor` made by a call before (the group's TensorViews); False if
    there is none (not a tensor, or not one seen at this address, length and dtype)."""
    g = _state.DEFAULT.group if group is None else group
    try:
        views = g.tensor_views  # type: ignore[union-attr]
    except AttributeError:
        return False
    view = views.known(tensor)
    return view is not None and run(view, *keys)


def _with_views(
    run: Callable[..., bool], group: ProcessGroup | None, out: Any, inp: Any, *keys: Any
) -> bool:
    """_with_view for a call of two buffers (either may be a numpy array)."""
    if type(out) is np.ndarray and type(inp) is np.ndarray:
        return False  # declined as they are: no view would change that
    g = _state.DEFAULT.group if group is None else group
    try:
        views = g.tensor_views  # type: ignore[union-attr]
    except AttributeError:
        return False
    if type(out) is not np.ndarray:
        out = views.known(out)
    if type(inp) is not np.ndarray:
        inp = views.known(inp)
    return out is not None and inp is not None and run(out, inp, *keys)


def _buffer(
    g: ProcessGroup, obj: Any, what: str, writable: bool = True, sync: bool = False
) -> tuple[Any, Buffer]:
    """What `obj` is viewed as (the object to offer the compiled path) and its Buffer. A
    torch tensor of a synchronous call is viewed through the group's TensorViews: made
    once, found in one look-up after, and a buffer the compiled path takes. (Only
    synchronous calls: such a view does not keep its tensor alive.)"""
    if sync and type(obj) is not np.ndarray and is_torch_tensor(obj):
        view = g.tensor_views.get(obj, what)  # checked as as_buffer checks a tensor
        buf = as_buffer(view, what, writable)
        return view, Buffer(buf.array, buf.dtype, obj)
    return obj, as_buffer(obj, what, writable)


def _root(g: ProcessGroup, global_rank: int | None, group_rank: int | None, what: str) -> int:
    """The group rank of a root given as a global rank (torch's src/dst) or a group rank."""
    if global_rank is not None and group_rank is not None:
        raise UsageError(f"give either {what} or group_{what}, not both")
    if group_rank is not None:
        if not isinstance(group_rank, int) or not 0 <= group_rank < g.size():
            raise UsageError(
                f"group_{what}={group_rank!r} is out of range for a group of {g.size()}"
            )
        return group_rank
    if global_rank is None:
        global_rank = g.ranks[0] if g.ranks else 0
    if not isinstance(global_rank, (int, np.integer)) or isinstance(global_rank, bool):
        raise UsageError(f"{what} must be an int rank, got {global_rank!r}")
    return g.group_rank(int(global_rank), what)


# (type of op, op as given, dtype) -> its ReduceOp, for pairs already checked. The type is
# part of the key: 0 == ReduceOp.SUM, yet an int op is refused.
_checked_ops: dict[tuple[type, Any, DType], ReduceOp] = {}
_AVG = ReduceOp.AVG


def _op(op: Any, dtype: DType) -> ReduceOp:
    key = (type(op), op, dtype)
    try:
        return _checked_ops[key]  # the common case
    except (KeyError, TypeError):  # TypeError: an unhashable op, checked below as ever
        pass
    rop = to_reduce_op(op)
    check_op_dtype(rop, dtype)
    if len(_checked_ops) < 1024:
        try:
            _checked_ops[key] = rop
        except TypeError:
            pass
    return rop


def _same_dtype(bufs: Sequence[Buffer], what: str, dtype: DType) -> None:
    for i, b in enumerate(bufs):
        if b.dtype is not dtype:
            raise UsageError(f"{what}[{i}] has dtype {b.dtype.name}, expected {dtype.name}")


def _list_of(
    tensors: Sequence[Any] | None, n: int, what: str, count: int, dtype: DType, writable: bool
) -> list[Buffer]:
    if tensors is None or isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise UsageError(f"{what} must be a list of {n} tensors")
    if len(tensors) != n:
        raise UsageError(f"{what} must hold one tensor per rank: {n}, got {len(tensors)}")
    bufs = [as_buffer(t, f"{what}[{i}]", writable=writable) for i, t in enumerate(tensors)]
    _same_dtype(bufs, what, dtype)
    for i, b in enumerate(bufs):
        if b.count != count:
            raise UsageError(f"{what}[{i}] has {b.count} elements, expected {count}")
    return bufs


def _copy_out(flat: np.ndarray, outs: Sequence[Buffer]) -> Callable[[], None]:
    def run() -> None:
        offset = 0
        for b in outs:
            b.array[...] = flat[offset : offset + b.count]
            offset += b.count

    return run


def _stack(bufs: Sequence[Buffer], dtype: DType) -> np.ndarray:
    if not bufs:
        return np.empty(0, dtype=dtype.numpy)
    return np.concatenate([b.array for b in bufs])


# ---------------------------------------------------------------------- collectives


def all_reduce(
    tensor: Any,
    op: Any = SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce `tensor` across the group; every rank ends with the result, in place."""
    repeatable = not async_op and algorithm is None
    if repeatable:
        # A call like one that ran before: the group's compiled path checks the buffer
        # against it and runs it, or declines (then the checks below run as ever). A
        # torch tensor is no buffer: its view from before is.
        fast = _fast(group)
        if fast is not None and (
            fast.all_reduce(tensor, op)
            or (type(tensor) is not np.ndarray and _with_view(fast.all_reduce, group, tensor, op))
        ):
            return None
    g = _group(group)
    if not g.is_member:
        return None
    obj, (arr, dtype, _) = _buffer(g, tensor, "all_reduce tensor", sync=repeatable)
    rop = _op(op, dtype)
    return g.run_collective(
        CollectiveCall(
            collective="all_reduce",
            arrays={"data": arr},
            dtype=dtype,
            count=arr.size,
            algorithm=algorithm,
            op=rop,
            after=average_after(arr, dtype, rop, g.size()) if rop is _AVG else None,
            async_op=async_op,
            result=[tensor] if async_op else None,
            fast_key=(obj, op) if repeatable else None,
        )
    )


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
    algorithm: str | None = None,
) -> Work | None:
    """Copy `tensor` from rank `src` to every rank of the group, in place."""
    repeatable = not async_op and algorithm is None and group_src is None
    if repeatable:
        fast = _fast(group)  # see all_reduce
        if fast is not None and (
            fast.broadcast(tensor, src)
            or (type(tensor) is not np.ndarray and _with_view(fast.broadcast, group, tensor, src))
        ):
            return None
    g = _group(group)
    if not g.is_member:
        return None
    root = _root(g, src, group_src, "src")
    sync = not async_op
    obj, buf = _buffer(g, tensor, "broadcast tensor", g.rank() != root, sync)
    return g.run_collective(
        CollectiveCall(
            collective="broadcast",
            arrays={"data": buf.array},
            dtype=buf.dtype,
            count=buf.count,
            algorithm=algorithm,
            root=root,
            async_op=async_op,
            result=[tensor],
            fast_key=(obj, src) if repeatable else None,
        )
    )


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce `tensor` across the group into rank `dst`'s tensor; others are left unchanged."""
    repeatable = not async_op and algorithm is None and group_dst is None
    if repeatable:
        fast = _fast(group)  # see all_reduce
        if fast is not None and (
            fast.reduce(tensor, dst, op)
            or (type(tensor) is not np.ndarray and _with_view(fast.reduce, group, tensor, dst, op))
        ):
            return None
    g = _group(group)
    if not g.is_member:
        return None
    root = _root(g, dst, group_dst, "dst")
    is_root = g.rank() == root
    obj, buf = _buffer(g, tensor, "reduce tensor", is_root, not async_op)
    rop = _op(op, buf.dtype)
    after = average_after(buf.array, buf.dtype, rop, g.size()) if is_root else None
    return g.run_collective(
        CollectiveCall(
            collective="reduce",
            arrays={"data": buf.array},
            dtype=buf.dtype,
            count=buf.count,
            algorithm=algorithm,
            op=rop,
            root=root,
            after=after,
            async_op=async_op,
            result=[tensor],
            fast_key=(obj, (dst, op)) if repeatable else None,
        )
    )


def all_gather_into_tensor(
    output_tensor: Any,
    input_tensor: Any,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Concatenate every rank's `input_tensor`, in rank order, into `output_tensor`."""
    repeatable = not async_op and algorithm is None
    if repeatable:
        fast = _fast(group)  # see all_reduce
        if fast is not None and (
            fast.all_gather(output_tensor, input_tensor)
            or _with_views(fast.all_gather, group, output_tensor, input_tensor)
        ):
            return None
    g = _group(group)
    if not g.is_member:
        return None
    in_obj, inp = _buffer(g, input_tensor, "all_gather input", False, not async_op)
    out_obj, out = _buffer(g, output_tensor, "all_gather output", True, not async_op)
    _same_dtype([out], "all_gather output", inp.dtype)
    if out.count != g.size() * inp.count:
        raise UsageError(
            f"all_gather output has {out.count} elements; it needs world size x input = "
            f"{g.size()} x {inp.count}"
        )
    return g.run_collective(
        CollectiveCall(
            collective="all_gather",
            arrays={"input": inp.array, "output": out.array},
            dtype=inp.dtype,
            count=inp.count,
            algorithm=algorithm,
            async_op=async_op,
            result=[output_tensor],
            fast_key=((out_obj, in_obj), None) if repeatable else None,
        )
    )


def all_gather(
    tensor_list: list[Any],
    tensor: Any,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Gather every rank's `tensor` into `tensor_list[rank]`, on every rank."""
    g = _group(group)
    if not g.is_member:
        return None
    inp = as_buffer(tensor, "all_gather tensor", writable=False)
    outs = _list_of(tensor_list, g.size(), "all_gather tensor_list", inp.count, inp.dtype, True)
    flat = np.empty(g.size() * inp.count, dtype=inp.dtype.numpy)
    return g.run_collective(
        CollectiveCall(
            collective="all_gather",
            arrays={"input": inp.array, "output": flat},
            dtype=inp.dtype,
            count=inp.count,
            algorithm=algorithm,
            after=_copy_out(flat, outs),
            async_op=async_op,
            result=tensor_list,
        )
    )


def reduce_scatter_tensor(
    output: Any,
    input: Any,
    op: Any = SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce `input` (world size blocks) across ranks; rank i gets block i in `output`."""
    repeatable = not async_op and algorithm is None
    if repeatable:
        fast = _fast(group)  # see all_reduce
        if fast is not None and (
            fast.reduce_scatter(output, input, op)
            or _with_views(fast.reduce_scatter, group, output, input, op)
        ):
            return None
    g = _group(group)
    if not g.is_member:
        return None
    out_obj, out = _buffer(g, output, "reduce_scatter output", True, not async_op)
    in_obj, inp = _buffer(g, input, "reduce_scatter input", False, not async_op)
    _same_dtype([inp], "reduce_scatter input", out.dtype)
    if inp.count != g.size() * out.count:
        raise UsageError(
            f"reduce_scatter input has {inp.count} elements; it needs world size x output = "
            f"{g.size()} x {out.count}"
        )
    rop = _op(op, out.dtype)
    return g.run_collective(
        CollectiveCall(
            collective="reduce_scatter",
            arrays={"input": inp.array, "output": out.array},
            dtype=out.dtype,
            count=out.count,
            algorithm=algorithm,
            op=rop,
            after=average_after(out.array, out.dtype, rop, g.size()),
            async_op=async_op,
            result=[output],
            fast_key=((out_obj, in_obj), op) if repeatable else None,
        )
    )


def reduce_scatter(
    output: Any,
    input_list: list[Any],
    op: Any = SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce `input_list[i]` across ranks into rank i's `output`."""
    g = _group(group)
    if not g.is_member:
        return None
    out = as_buffer(output, "reduce_scatter output")
    ins = _list_of(input_list, g.size(), "reduce_scatter input_list", out.count, out.dtype, False)
    rop = _op(op, out.dtype)
    flat = _stack(ins, out.dtype)
    return g.run_collective(
        CollectiveCall(
            collective="reduce_scatter",
            arrays={"input": flat, "output": out.array},
            dtype=out.dtype,
            count=out.count,
            algorithm=algorithm,
            op=rop,
            after=average_after(out.array, out.dtype, rop, g.size()),
            async_op=async_op,
            result=[output],
        )
    )


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
    algorithm: str | None = None,
) -> Work | None:
    """Collect every rank's `tensor` into `gather_list` on rank `dst`."""
    g = _group(group)
    if not g.is_member:
        return None
    root = _root(g, dst, group_dst, "dst")
    inp = as_buffer(tensor, "gather tensor", writable=False)
    arrays = {"input": inp.array}
    after = None
    if g.rank() == root:
        outs = _list_of(gather_list, g.size(), "gather_list", inp.count, inp.dtype, True)
        flat = np.empty(g.size() * inp.count, dtype=inp.dtype.numpy)
        arrays["output"] = flat
        after = _copy_out(flat, outs)
    elif gather_list:
        raise UsageError("gather_list must be None or empty on ranks other than dst")
    return g.run_collective(
        CollectiveCall(
            collective="gather",
            arrays=arrays,
            dtype=inp.dtype,
            count=inp.count,
            algorithm=algorithm,
            root=root,
            after=after,
            async_op=async_op,
            result=gather_list,
        )
    )


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
    algorithm: str | None = None,
) -> Work | None:
    """Send `scatter_list[i]` from rank `src` to rank i's `tensor`."""
    g = _group(group)
    if not g.is_member:
        return None
    root = _root(g, src, group_src, "src")
    out = as_buffer(tensor, "scatter tensor")
    arrays = {"output": out.array}
    if g.rank() == root:
        ins = _list_of(scatter_list, g.size(), "scatter_list", out.count, out.dtype, False)
        arrays["input"] = _stack(ins, out.dtype)
    elif scatter_list:
        raise UsageError("scatter_list must be None or empty on ranks other than src")
    return g.run_collective(
        CollectiveCall(
            collective="scatter",
            arrays=arrays,
            dtype=out.dtype,
            count=out.count,
            algorithm=algorithm,
            root=root,
            async_op=async_op,
            result=[tensor],
        )
    )


def _all_to_all(
    g: ProcessGroup,
    out_flat: np.ndarray,
    in_flat: np.ndarray,
    dtype: DType,
    send_counts: list[int],
    recv_counts: list[int],
    after: Callable[[], None] | None,
    async_op: bool,
    result: Any,
    algorithm: str | None,
) -> Work | None:
    return g.run_collective(
        CollectiveCall(
            collective="all_to_all",
            arrays={"input": in_flat, "output": out_flat},
            dtype=dtype,
            count=0,
            header_count=0,
            send_counts=tuple(send_counts),
            recv_counts=tuple(recv_counts),
            algorithm=algorithm,
            after=after,
            async_op=async_op,
            result=result,
        )
    )


def all_to_all(
    output_tensor_list: list[Any],
    input_tensor_list: list[Any],
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Send `input_tensor_list[j]` to rank j; receive rank j's into `output_tensor_list[j]`."""
    g = _group(group)
    if not g.is_member:
        return None
    p = g.size()
    for name, lst in (
        ("output_tensor_list", output_tensor_list),
        ("input_tensor_list", input_tensor_list),
    ):
        if not isinstance(lst, Sequence) or len(lst) != p:
            raise UsageError(f"all_to_all {name} must be a list of {p} tensors")
    ins = [
        as_buffer(t, f"input_tensor_list[{i}]", writable=False)
        for i, t in enumerate(input_tensor_list)
    ]
    outs = [as_buffer(t, f"output_tensor_list[{i}]") for i, t in enumerate(output_tensor_list)]
    dtype = ins[0].dtype if ins else outs[0].dtype
    _same_dtype(ins, "input_tensor_list", dtype)
    _same_dtype(outs, "output_tensor_list", dtype)
    out_flat = np.empty(sum(b.count for b in outs), dtype=dtype.numpy)
    return _all_to_all(
        g,
        out_flat,
        _stack(ins, dtype),
        dtype,
        [b.count for b in ins],
        [b.count for b in outs],
        _copy_out(out_flat, outs),
        async_op,
        output_tensor_list,
        algorithm,
    )


def _splits(splits: Sequence[int] | None, buf: Buffer, p: int, what: str) -> list[int]:
    """Element counts per rank from torch-style split sizes along the first dimension."""
    shape = getattr(buf.source, "shape", (buf.count,))
    if splits is None or len(splits) == 0:
        if buf.count % p:
            raise UsageError(
                f"all_to_all_single {what} has {buf.count} elements, not divisible by {p}"
            )
        return [buf.count // p] * p
    if len(splits) != p:
        raise UsageError(
            f"all_to_all_single {what}_split_sizes needs {p} entries, got {len(splits)}"
        )
    rows = shape[0] if len(shape) else 1
    if any(int(s) < 0 for s in splits) or sum(int(s) for s in splits) != rows:
        raise UsageError(f"all_to_all_single {what}_split_sizes {list(splits)} must sum to {rows}")
    per_row = buf.count // rows if rows else 0
    return [int(s) * per_row for s in splits]


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    algorithm: str | None = None,
) -> Work | None:
    """Split `input` by rank, exchange, and concatenate what arrives into `output`."""
    g = _group(group)
    if not g.is_member:
        return None
    inp = as_buffer(input, "all_to_all_single input", writable=False)
    out = as_buffer(output, "all_to_all_single output")
    _same_dtype([out], "all_to_all_single output", inp.dtype)
    send = _splits(input_split_sizes, inp, g.size(), "input")
    recv = _splits(output_split_sizes, out, g.size(), "output")
    return _all_to_all(
        g, out.array, inp.array, inp.dtype, send, recv, None, async_op, [output], algorithm
    )


def barrier(
    group: ProcessGroup | None = None,
    async_op: bool = False,
    device_ids: Any = None,
    algorithm: str | None = None,
) -> Work | None:
    """Block until every rank of the group has entered the barrier. `device_ids`, as in
    torch, is a list of one device id; on CPUs there is nothing to bind, so it is only
    checked (torch takes the first id; a non-list or an empty list is an error here)."""
    if device_ids is not None and (
        not isinstance(device_ids, list)
        or not device_ids
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in device_ids)
    ):
        raise UsageError(f"device_ids must be a list of one device id (int), got {device_ids!r}")
    repeatable = not async_op and algorithm is None
    if repeatable:
        fast = _fast(group)  # see all_reduce
        if fast is not None and fast.barrier():
            return None
    g = _group(group)
    if not g.is_member:
        return None
    return g.run_collective(
        CollectiveCall(
            collective="barrier",
            arrays={},
            dtype=BYTE,
            count=0,
            algorithm=algorithm,
            async_op=async_op,
            result=None,
            fast_key=(None, None) if repeatable else None,
        )
    )
