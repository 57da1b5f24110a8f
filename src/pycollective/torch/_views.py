"""The tensors a torch call passes, as the buffers our collectives take: checks of the
device, and contiguous stand-ins copied back after the call. (The views that let a
repeated synchronous call reach the group's compiled path are the group's:
_buffers.TensorViews.)"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._errors import UsageError


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
