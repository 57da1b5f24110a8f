"""The coalesced calls of the torch backend: several tensors in one call (torch's
`_coalescing_manager`, `all_gather_coalesced`, FSDP's and DTensor's batched calls).

When the tensors share a dtype they travel as one collective over the tensors laid end to
end, then are copied back or cut out: one call instead of a stream of small ones. Else each
tensor is its own collective, all of them behind one Work. The group's methods
(torch/_backend.py) call these inside `torch_call`, so the call's synchronous or
asynchronous nature is already set.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as tdist

import torch

from .._errors import UsageError
from ..api import collectives as _api
from ._forms import asynchronous, contiguous, one_dtype, op_of, paired, tensors_of, timeout_of
from ._group import BackendGroup
from ._views import dense
from ._work import completed, join


def allreduce_coalesced(pg: BackendGroup, tensors: Any, opts: Any = None) -> tdist.Work:
    """One all-reduce over the tensors laid end to end, then copied back."""
    tensors = tensors_of(tensors, "allreduce_coalesced tensors")
    if not tensors:
        return completed(tensors)
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise UsageError(f"allreduce_coalesced needs one dtype, got {sorted(map(str, dtypes))}")
    op = op_of(opts)
    flat = torch.cat([dense(t, "allreduce tensor").reshape(-1) for t in tensors])
    work = _api.all_reduce(flat, op, pg._pg, async_op=asynchronous())

    def copy_back() -> None:
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    return pg._work([work], copy_back, tensors, timeout_of(opts))


def allgather_coalesced(
    pg: BackendGroup, output_lists: Any, input_list: Any, opts: Any = None
) -> tdist.Work:
    """output_lists[r][j] receives rank r's input_list[j] (torch's all_gather_coalesced
    layout: one list per rank, each as long as the inputs)."""
    inputs = tensors_of(input_list, "allgather_coalesced inputs")
    lists = [list(o) for o in output_lists]
    if len(lists) != pg.size():
        raise UsageError(
            f"allgather_coalesced needs one output list per rank ({pg.size()}), got {len(lists)}"
        )
    for r, o in enumerate(lists):
        if len(o) != len(inputs):
            raise UsageError(
                f"allgather_coalesced: output list {r} has {len(o)} tensors for "
                f"{len(inputs)} inputs"
            )
        for j, (out, inp) in enumerate(zip(o, inputs, strict=True)):
            if out.numel() != inp.numel() or out.dtype != inp.dtype:
                raise UsageError(
                    f"allgather_coalesced: output [{r}][{j}] ({out.numel()} x {out.dtype}) "
                    f"does not fit input {j} ({inp.numel()} x {inp.dtype})"
                )
    n = pg.size()
    if len(inputs) > 1 and one_dtype(inputs):
        # one all-gather of the inputs laid end to end, then each rank's share cut up
        flat_in = torch.cat([dense(t, "allgather input").reshape(-1) for t in inputs])
        flat_out = flat_in.new_empty(n * flat_in.numel())
        (work,), _ = pg._allgather_flat(flat_out, flat_in)

        def copy_out() -> None:
            by_rank = flat_out.view(n, -1)
            for r in range(n):
                offset = 0
                for j, inp in enumerate(inputs):
                    k = inp.numel()
                    lists[r][j].copy_(by_rank[r, offset : offset + k].view_as(lists[r][j]))
                    offset += k

        return pg._work([work], copy_out, output_lists, timeout_of(opts))
    parts = [
        pg._allgather_list([lists[r][j] for r in range(n)], inp) for j, inp in enumerate(inputs)
    ]
    return pg._work(*join(parts), output_lists, timeout_of(opts))


def allgather_into_tensor_coalesced(
    pg: BackendGroup,
    outputs: list[torch.Tensor],
    inputs: list[torch.Tensor],
    opts: Any = None,
) -> tdist.Work:
    """One all-gather of the inputs laid end to end (when they share a dtype), then
    each rank's share copied out: one call instead of a stream of small ones."""
    matched = paired(outputs, inputs)
    if len(matched) > 1 and one_dtype(inputs) and contiguous(outputs):
        n = pg.size()
        flat_in = torch.cat([dense(t, "all_gather input").reshape(-1) for t in inputs])
        flat_out = flat_in.new_empty(n * flat_in.numel())
        (work,), _ = pg._allgather_flat(flat_out, flat_in)

        def copy_out() -> None:
            by_rank, offset = flat_out.view(n, -1), 0
            for o, i in matched:
                k = i.numel()
                o.view(n, k).copy_(by_rank[:, offset : offset + k])
                offset += k

        return pg._work([work], copy_out, outputs, timeout_of(opts))
    parts = [pg._allgather_flat(o, i) for o, i in matched]
    return pg._work(*join(parts), outputs, timeout_of(opts))


def reduce_scatter_tensor_coalesced(
    pg: BackendGroup,
    outputs: list[torch.Tensor],
    inputs: list[torch.Tensor],
    opts: Any = None,
) -> tdist.Work:
    """One reduce-scatter of every input's rank-r share laid end to end (when they share
    a dtype), then each output cut out of the result."""
    matched = paired(outputs, inputs)
    if len(matched) > 1 and one_dtype(inputs) and contiguous(outputs):
        n = pg.size()
        sizes = [o.numel() for o, _ in matched]
        for (_, i), k in zip(matched, sizes, strict=True):
            if i.numel() != n * k:
                raise UsageError(
                    f"reduce_scatter_tensor_coalesced: an input of {i.numel()} elements "
                    f"for an output of {k} at world size {n}"
                )
        flat_in = torch.cat(
            [dense(i, "reduce_scatter input").reshape(n, -1) for _, i in matched], dim=1
        ).reshape(-1)
        flat_out = flat_in.new_empty(sum(sizes))
        (work,), _ = pg._reduce_scatter_flat(flat_out, flat_in, opts)

        def copy_out() -> None:
            offset = 0
            for (o, _), k in zip(matched, sizes, strict=True):
                o.copy_(flat_out[offset : offset + k].view_as(o))
                offset += k

        return pg._work([work], copy_out, outputs, timeout_of(opts))
    parts = [pg._reduce_scatter_flat(o, i, opts) for o, i in matched]
    return pg._work(*join(parts), outputs, timeout_of(opts))
