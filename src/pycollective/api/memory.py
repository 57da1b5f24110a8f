"""`pycollective.empty` and `empty_like`: numpy arrays in shared memory (shm/shared.py) that
the peers of an all_reduce or reduce on this host read directly."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import UsageError
from ..core.group import ProcessGroup
from ..shm import shared


def _check_group(group: object) -> None:
    if group is not None and not isinstance(group, ProcessGroup):
        raise UsageError(f"group must be a ProcessGroup or None, got {type(group).__name__}")


def empty(shape: Any, dtype: Any = np.float32, group: object = None) -> np.ndarray:
    """A C-contiguous numpy array in shared memory (contents unspecified; in practice
    zeros). all_reduce and reduce on such arrays, when every rank's buffer is one, read
    the peers' arrays directly instead of copying through the arena. Any group on this
    host can use it (`group` is checked, for symmetry with torch's factories); with TCP it
    is an ordinary array. torch users: `torch.from_numpy(pycollective.empty(...))`."""
    _check_group(group)
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise UsageError(f"empty: {dtype!r} is not a numpy dtype ({exc})") from None
    try:
        shape_t = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)  # type: ignore[arg-type]  # a scalar: int() says if not a number
    except (TypeError, ValueError):
        raise UsageError(
            f"empty: shape must be an int or a sequence of ints, got {shape!r}"
        ) from None
    if any(s < 0 for s in shape_t):
        raise UsageError(f"empty: negative dimensions are not allowed: {shape_t}")
    count = int(np.prod(shape_t, dtype=np.int64))
    raw = shared.allocate(count * dt.itemsize)
    out: np.ndarray = raw.view(dt).reshape(shape_t)
    return out


def empty_like(a: Any, group: object = None) -> np.ndarray:
    """`empty(a.shape, a.dtype)`, for a numpy array or a CPU torch tensor (the result is a
    numpy array either way)."""
    if hasattr(a, "numpy") and hasattr(a, "detach"):  # a torch tensor: its numpy dtype
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    return empty(a.shape, a.dtype, group)
