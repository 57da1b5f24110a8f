"""Turn what the user passed (numpy array, CPU torch tensor, buffer-protocol object) into a
flat, writable numpy view of the same memory plus its DType. Nothing is copied."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from . import _dtypes
from ._dtypes import DType
from ._errors import UsageError


class Buffer(NamedTuple):
    """A tuple: one is made per call, and a NamedTuple costs a fraction of a frozen
    dataclass to build."""

    array: np.ndarray  # 1-D, C-contiguous view of the caller's memory
    dtype: DType
    source: Any  # what the caller passed, for results handed back (futures)

    @property
    def count(self) -> int:  # type: ignore[override]  # shadows tuple.count, which nothing calls
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def is_torch_tensor(obj: object) -> bool:
    """Whether `obj` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class _TensorMemory:
    """The memory of a tensor, seen through numpy's array interface: `np.asarray` of it is
    a view whose base keeps the tensor alive. Tensor.numpy() would do the same, but marks
    the tensor's storage non-resizable for ever (FSDP then cannot free a flat parameter
    with resize_(0)); a raw pointer leaves the storage alone."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, tensor: Any, count: int, typestr: str, hold: bool = True) -> None:
        self.tensor = tensor if hold else None
        self.__array_interface__ = {
            "shape": (count,),
            "typestr": typestr,
            "data": (tensor.data_ptr(), False),
            "version": 3,
        }


# torch dtype -> (ours, the array-interface type string of its elements, or None for
# bfloat16, whose numpy dtype has none: viewed as raw bytes, then as ml_dtypes' bfloat16)
_torch_dtypes: dict[Any, tuple[DType, str | None]] = {}


def _torch_dtype(torch: Any, dt: Any) -> tuple[DType, str | None] | None:
    if not _torch_dtypes:
        for name in (
            "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
            "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
        ):  # fmt: skip
            ours = _dtypes.BY_NAME[name]
            typestr = None if name == "bfloat16" else ours.numpy.str
            _torch_dtypes[getattr(torch, name)] = (ours, typestr)
    return _torch_dtypes.get(dt)


def _torch_view(t: Any, what: str, hold: bool = True) -> tuple[np.ndarray, DType]:
    torch = sys.modules["torch"]
    if not t.is_cpu:
        raise UsageError(f"{what} is on device {t.device}; pycollective handles CPU tensors only")
    if t.layout is not torch.strided:
        raise UsageError(f"{what} must be a dense (strided) tensor, got layout {t.layout}")
    if not t.is_contiguous():
        raise UsageError(f"{what} must be contiguous (call .contiguous() first)")
    if t.is_conj() or t.is_neg():
        raise UsageError(
            f"{what} has its conjugate or negative bit set (its memory does not hold its "
            "values): call .resolve_conj() / .resolve_neg() first"
        )
    found = _torch_dtype(torch, t.dtype)
    if found is None:
        raise UsageError(f"{what} has dtype {t.dtype}, which pycollective cannot carry")
    dtype, typestr = found
    n = t.numel()
    if n == 0:
        return np.empty(0, dtype.numpy), dtype
    if typestr is not None:
        return np.asarray(_TensorMemory(t, n, typestr, hold)), dtype
    raw = np.asarray(_TensorMemory(t, n * dtype.itemsize, "|u1", hold))
    return raw.view(dtype.numpy), dtype


def unheld_tensor_view(t: Any, what: str = "tensor") -> np.ndarray | None:
    """A flat view of a CPU tensor's memory, checked as as_buffer checks it, that does NOT
    keep the tensor alive: valid only while the caller holds the tensor and its storage
    stays where it is (the torch backend's synchronous calls keep such views, one per
    address, length and dtype, and use one only for a tensor found at that address).
    None where the view's dtype would not be read back as the tensor's (bfloat16's view
    holds its raw bits)."""
    arr, dtype = _torch_view(t, what, hold=False)
    return arr if _dtypes.from_numpy_dtype(arr.dtype) is dtype else None


VIEWS_KEPT = 16  # a group's tensor views for synchronous calls (TensorViews)


class TensorViews:
    """For synchronous calls: flat views of contiguous CPU tensors' memory,
    made once per address, length, dtype and negative/conjugate bit, so that a repeated
    call finds its buffer in one look-up and the group's compiled path (ProcessGroup.fast,
    which takes buffers, not tensors) can run it. One per group: the torch backend's
    methods and our API's functions called with torch tensors share it.

    A view does not keep its tensor alive (nor its storage from being resized): it is used
    only for a tensor found at its address, during a call that holds the tensor. A tensor
    whose storage moved, or whose length, dtype, layout, contiguity or bits changed, finds
    another key (or none) and never a stale view."""

    __slots__ = ("_views",)

    def __init__(self) -> None:
        self._views: dict[tuple[Any, ...], Any] = {}

    def __len__(self) -> int:
        return len(self._views)

    def get(self, t: Any, what: str) -> Any:
        """The view of CPU tensor `t` (made if new, checked as as_buffer checks it: a
        UsageError says what is wrong), or `t` itself where no view reads back as the
        tensor (bfloat16)."""
        view = self.known(t)
        if view is None:
            arr = unheld_tensor_view(t, what)  # raises for what as_buffer refuses
            if len(self._views) >= VIEWS_KEPT:
                self._views.clear()
            dtype = t.dtype
            key = (t.data_ptr(), t.numel(), dtype, t.is_neg(), dtype.is_complex and t.is_conj())
            self._views[key] = view = t if arr is None else arr
        return view

    def known(self, t: Any) -> Any:
        """The view of `t` made before, if `t` is a contiguous dense tensor at its address
        with its length, dtype and bits, else None: the short way of a repeated call, no
        check it passed before read again but these (each a call into torch's C++)."""
        try:
            # Sparse and other non-strided layouts say False or raise here, or in
            # data_ptr (mkldnn): no layout read needed. The conjugate bit exists only
            # on complex tensors (torch asserts it), so real ones skip that read.
            if not t.is_contiguous():
                return None
            dtype = t.dtype
            key = (t.data_ptr(), t.numel(), dtype, t.is_neg(), dtype.is_complex and t.is_conj())
        except Exception:  # noqa: BLE001 - whatever torch raises: not a tensor we view
            return None
        return self._views.get(key)


def as_buffer(obj: object, what: str = "tensor", writable: bool = True) -> Buffer:
    """Validate `obj` and view it as a flat array; raise UsageError saying what is wrong."""
    if type(obj) is np.ndarray:  # the common case first: a plain, contiguous numpy array
        dtype = _dtypes.from_numpy_dtype(obj.dtype)
        flags = obj.flags
        if dtype is not None and flags.c_contiguous and (flags.writeable or not writable):
            flat = obj if obj.ndim == 1 else obj.reshape(-1)
            if flat.dtype is not dtype.numpy and dtype is _dtypes.BFLOAT16:
                flat = flat.view(dtype.numpy)  # ml_dtypes' bfloat16: its raw bits
            return Buffer(flat, dtype, obj)
    if is_torch_tensor(obj):
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
    flat = arr.reshape(-1)
    if dtype is _dtypes.BFLOAT16:
        flat = flat.view(dtype.numpy)  # ml_dtypes' bfloat16: its raw bits
    return Buffer(flat, dtype, obj)
