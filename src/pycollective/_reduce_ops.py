"""ReduceOp and the kernels that apply it in place, with numpy ufuncs."""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np

from ._dtypes import BFLOAT16, DType
from ._errors import UsageError


class ReduceOp(enum.IntEnum):
    """The reduction operations of torch.distributed.ReduceOp (PREMUL_SUM excepted)."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,  # summed on the wire, divided once at the end
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
_BOOL_UFUNC = {  # numpy's add/multiply on bool already mean or/and; min/max likewise
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}
BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def to_reduce_op(op: object) -> ReduceOp:
    """Accept our ReduceOp, torch's ReduceOp (or its RedOpType), or a name like "sum"."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise UsageError(f"unknown reduce op {op!r}") from None
    name = getattr(op, "name", None)  # torch.distributed.ReduceOp.RedOpType members
    if name is None:
        text = str(op)  # e.g. "RedOpType.SUM" or "ReduceOp.SUM"
        name = text.rsplit(".", 1)[-1]
    if isinstance(name, str) and name.upper() in ReduceOp.__members__:
        return ReduceOp[name.upper()]
    raise UsageError(f"unsupported reduce op {op!r}; expected one of {[o.name for o in ReduceOp]}")


def check_op_dtype(op: ReduceOp, dtype: DType) -> None:
    """Raise UsageError when `op` makes no sense on `dtype` (before anything is sent)."""
    if op in BITWISE and dtype.kind not in "iub":
        raise UsageError(
            f"{op.name} is a bitwise op: it needs an integer or bool tensor, got {dtype.name}"
        )
    if dtype.kind == "c" and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise UsageError(f"{op.name} is not defined on complex tensors ({dtype.name})")
    if op is ReduceOp.AVG and dtype.kind == "b":
        raise UsageError("AVG is not defined on bool tensors")


Kernel = Callable[[np.ndarray, np.ndarray], None]


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    # Round to nearest, ties to even, as torch does; NaNs stay NaN.
    u = values.view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = np.isnan(values)
    rounded[nan] = (u[nan] >> 16) | np.uint32(0x40)
    return rounded.astype(np.uint16)


def kernel(op: ReduceOp, dtype: DType) -> Kernel:
    """An in-place kernel: kernel(dst, src) sets dst = op(dst, src) elementwise."""
    if dtype.kind == "b":
        ufunc = _BOOL_UFUNC[op]
    else:
        ufunc = _UFUNC[op]
    if dtype is BFLOAT16 and dtype.numpy == np.dtype(np.uint16):
        # No ml_dtypes: widen the raw bits to float32, reduce, round back.
        def bf16_kernel(dst: np.ndarray, src: np.ndarray) -> None:
            out = ufunc(_bf16_bits_to_f32(dst), _bf16_bits_to_f32(src))
            dst[...] = _f32_to_bf16_bits(np.ascontiguousarray(out, dtype=np.float32))

        return bf16_kernel

    def ufunc_kernel(dst: np.ndarray, src: np.ndarray) -> None:
        # Overflow and NaN arithmetic are the caller's data, not our error: no warnings,
        # as in torch.
        with np.errstate(all="ignore"):
            ufunc(dst, src, out=dst)

    return ufunc_kernel


def finish_average(data: np.ndarray, dtype: DType, divisor: int) -> None:
    """Turn a SUM into AVG in place: true division for floats, truncation for integers."""
    if divisor <= 1 or data.size == 0:
        return
    if dtype.kind in "iu":
        # Exact integer division, truncated toward zero like C and NCCL.
        quotient = data // divisor
        quotient[(data < 0) & (quotient * divisor != data)] += 1
        data[...] = quotient
    elif dtype is BFLOAT16 and dtype.numpy == np.dtype(np.uint16):
        data[...] = _f32_to_bf16_bits(_bf16_bits_to_f32(data) / np.float32(divisor))
    else:
        np.divide(data, data.dtype.type(divisor), out=data)
