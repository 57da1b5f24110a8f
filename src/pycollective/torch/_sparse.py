"""Sparse COO all-reduce over our collectives, as gloo does it."""

from __future__ import annotations

from typing import Any

import torch

from .._errors import UsageError
from .._reduce_ops import ReduceOp as OurOp
from ..api import collectives as _api
from ..core.group import ProcessGroup
from ._views import dense_device


def sparse_all_reduce(pg: ProcessGroup, t: torch.Tensor, op: Any) -> None:
    """Sum sparse COO tensor `t` over `pg`, in place: every rank's indices and values are
    gathered, then summed and coalesced (so the result is the same on every rank)."""
    if op is not OurOp.SUM:
        raise UsageError(f"sparse all_reduce supports SUM only, got {op.name}")
    dense_device(t, "sparse allreduce tensor")
    if t.layout != torch.sparse_coo:
        raise UsageError(f"sparse allreduce needs a sparse COO tensor, got {t.layout}")
    mine = t.coalesce()
    idx, val = mine.indices().contiguous(), mine.values().contiguous()
    n = pg.size()
    nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    _api.all_gather(counts, nnz, pg)
    widest = max(int(c.item()) for c in counts)
    # Equal shapes on every rank: pad to the largest nnz, then cut each rank's share.
    idx_pad = idx.new_zeros((idx.shape[0], widest))
    idx_pad[:, : idx.shape[1]] = idx
    val_pad = val.new_zeros((widest, *val.shape[1:]))
    val_pad[: val.shape[0]] = val
    idx_all = [torch.empty_like(idx_pad) for _ in range(n)]
    val_all = [torch.empty_like(val_pad) for _ in range(n)]
    _api.all_gather(idx_all, idx_pad, pg)
    _api.all_gather(val_all, val_pad, pg)
    k = [int(c.item()) for c in counts]
    total = torch.sparse_coo_tensor(
        torch.cat([i[:, : k[r]] for r, i in enumerate(idx_all)], dim=1),
        torch.cat([v[: k[r]] for r, v in enumerate(val_all)]),
        t.shape,
    ).coalesce()
    t.copy_(total)  # in place, as gloo leaves it
