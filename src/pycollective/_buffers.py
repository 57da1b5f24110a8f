"""Turn what the user passed (numpy array, CPU torch tensor, buffer-protocol object) into a
flat, writable numpy view of the same memory plus its DType. Nothing is copied."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _dtypes
from ._dtypes import DType
from ._errors import UsageError


@dataclass(frozen=True)
class Buffer:
    array: np.ndarray  # 1-D, C-contiguous view of the caller's memory
    dtype: DType
    source: Any  # what the caller passed, for results handed back (futures)

    @property
    def count(self) -> int:
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_view(t: Any, what: str) -> tuple[np.ndarray, DType]:
    import torch

    if t.device.type != "cpu":
        raise UsageError(f"{what} is on device {t.device}; pycollective handles CPU tensors only")
    if t.is_sparse or t.layout != torch.strided:
        raise UsageError(f"{what} must be a dense (strided) tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise UsageError(f"{what} must be contiguous (call .contiguous() first)")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().view(np.uint16)
        dtype = _dtypes.BFLOAT16
        return raw.view(dtype.numpy).reshape(-1), dtype
    try:
        arr = t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise UsageError(f"{what} has dtype {t.dtype}, which pycollective cannot carry") from exc
    dtype = _dtypes.from_numpy(arr.dtype)
    if dtype is None:
        raise UsageError(f"{what} has dtype {t.dtype}, which pycollective cannot carry")
    return arr.reshape(-1), dtype


def as_buffer(obj: object, what: str = "tensor", writable: bool = True) -> Buffer:
    """Validate `obj` and view it as a flat array; raise UsageError saying what is wrong."""
    if _is_torch_tensor(obj):
        arr, dtype = _torch_view(obj, what)
        return Buffer(arr, dtype, obj)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            view = memoryview(obj)  # type: ignore[arg-type]
        except TypeError:
            raise UsageError(
                f"{what} must be a numpy array, a CPU torch tensor or a buffer-protocol object, "
                f"got {type(obj).__name__}"
            ) from None
        try:
            arr = np.asarray(view)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{what}: cannot interpret buffer format {view.format!r}") from exc
    if not arr.flags.c_contiguous:
        raise UsageError(f"{what} must be C-contiguous (use np.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise UsageError(f"{what} is read-only, but this operation writes into it")
    dtype = _dtypes.from_numpy(arr.dtype)
    if dtype is None:
        raise UsageError(f"{what} has dtype {arr.dtype}, which pycollective cannot carry")
    return Buffer(arr.reshape(-1), dtype, obj)
