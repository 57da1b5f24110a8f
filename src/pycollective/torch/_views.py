"""The tensors a torch call passes, as the buffers our collectives take: checks of the
device, contiguous stand-ins copied back after the call, and the views that let a
repeated synchronous call reach the group's compiled path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _buffers
from .._errors import UsageError

VIEWS_KEPT = 16  # a group's tensor views for synchronous calls (SyncViews)
_STRIDED = torch.strided


def dense(t: torch.Tensor, what: str) -> torch.Tensor:
    """`t`, if it is a CPU tensor."""
    if not t.is_cpu:
        raise UsageError(f"{what} is on {t.device}; the pycollective backend is CPU only")
    return t


def dense_device(t: torch.Tensor, what: str) -> torch.Tensor:
    """`t`, if it is on the CPU (any layout: the sparse all-reduce's check)."""
    if t.device.type != "cpu":
        raise UsageError(f"{what} is on {t.device}; the pycollective backend is CPU only")
    return t


class Staged:
    """Contiguous stand-ins for non-contiguous tensors, copied back when the op is done."""

    def __init__(self) -> None:
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def inp(self, t: torch.Tensor, what: str) -> torch.Tensor:
        dense(t, what)
        return t if t.is_contiguous() else t.contiguous()

    def out(self, t: torch.Tensor, what: str) -> torch.Tensor:
        dense(t, what)
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


class SyncViews:
    """For synchronous calls: numpy views of contiguous CPU tensors' memory, made once per
    address, length and dtype, so that repeated calls take the group's compiled path
    (ProcessGroup.fast, which takes buffers, not tensors).

    A view does not keep its tensor alive (nor its storage from being resized): it is used
    only for a tensor found at its address, during a call that holds the tensor."""

    def __init__(self) -> None:
        self._views: dict[tuple, Any] = {}

    def __len__(self) -> int:
        return len(self._views)

    def get(self, t: torch.Tensor, what: str) -> Any:
        """The view of contiguous CPU tensor `t` (made if new), or `t` itself where no
        view reads back as the tensor (bfloat16)."""
        key = (t.data_ptr(), t.numel(), t.dtype, t.is_conj(), t.is_neg())
        try:
            view = self._views[key]
        except KeyError:
            if len(self._views) >= VIEWS_KEPT:
                self._views.clear()
            view = self._views[key] = _buffers.unheld_tensor_view(t, what)
        return t if view is None else view

    def known(self, t: torch.Tensor) -> Any:
        """The view of `t` if one was made before and `t` is a contiguous dense tensor,
        else None (the short way of a repeated call: no checks it passed before)."""
        if t.layout is not _STRIDED or not t.is_contiguous():
            return None
        return self._views.get((t.data_ptr(), t.numel(), t.dtype, t.is_conj(), t.is_neg()))
