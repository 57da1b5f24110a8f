"""ReduceOp and the kernels that apply it in place, with numpy ufuncs."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np

from ._dtypes import BFLOAT16, BY_CODE, DType
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
    """Accept our ReduceOp or torch's ReduceOp (or its RedOpType). A string such as "sum"
    or a bare int is refused, as torch.distributed refuses them: code that passed ours
    would fail under torch."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, (str, int)) and not hasattr(op, "name"):
        hint = f"ReduceOp.{op.upper()}" if isinstance(op, str) else "ReduceOp.SUM"
        raise UsageError(
            f"op must be a ReduceOp (e.g. {hint}), not {type(op).__name__} {op!r}; "
            f"one of {[o.name for o in ReduceOp]} (torch.distributed refuses it too)"
        )
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
    out: np.ndarray = rounded.astype(np.uint16)
    return out


def kernel(op: ReduceOp, dtype: DType) -> Kernel:
    """An in-place kernel: kernel(dst, src) sets dst = op(dst, src) elementwise."""
    ufunc: np.ufunc
    if dtype.kind == "b":
        ufunc = _BOOL_UFUNC[op]
    else:
        ufunc = _UFUNC[op]
    if dtype is BFLOAT16:
        # On the raw bits (how bfloat16 travels): widen to float32, reduce, round back.
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


def fold_codes(op: int, dtype: DType) -> tuple[int, int] | None:
    """What kernel(op, dtype) computes, as pycollective._native's kernel codes (op, dtype),
    for a compiled path that combines dst = dst op src itself; None where its bits might
    differ from numpy's (a complex product: numpy's formula is its own)."""
    if op == ReduceOp.AVG:
        op = ReduceOp.SUM  # summed on the wire, divided once at the end (as kernel())
    if dtype.kind == "c" and op == ReduceOp.PRODUCT:
        return None
    return int(op), dtype.code


def kernel_code_differences(ext: Any) -> list[str]:
    """Where pycollective._native numbers ops or sizes dtypes unlike this module and
    _dtypes (its OP_CODE and ITEMSIZE tables): Python is the definition, and a build from
    other sources would combine with the wrong kernel. Every compiled reduction's check
    (shm/native.py's whole contract, tcp/folding.py's recv_reduce)."""
    tables: list[tuple[str, dict[Any, Any], dict[Any, Any]]] = [
        ("op ", {op.name: int(op) for op in ReduceOp}, getattr(ext, "OP_CODE", {})),
        ("itemsize of dtype code ", {d.code: d.itemsize for d in BY_CODE.values()},
         getattr(ext, "ITEMSIZE", {})),
    ]  # fmt: skip
    return [
        f"{what}{key}: {theirs.get(key)} in C, {mine.get(key)} in Python"
        for what, mine, theirs in tables
        for key in sorted(set(mine) | set(theirs), key=str)
        if mine.get(key) != theirs.get(key)
    ]


def finish_average(data: np.ndarray, dtype: DType, divisor: int) -> None:
    """Turn a SUM into AVG in place: true division for floats, truncation for integers."""
    if divisor <= 1 or data.size == 0:
        return
    if dtype.kind in "iu":
        # Exact integer division, truncated toward zero like C and NCCL.
        quotient = data // divisor
        quotient[(data < 0) & (quotient * divisor != data)] += 1
        data[...] = quotient
    elif dtype is BFLOAT16:
        # On the raw bits: the same rounding (and NaNs) as the arena's compiled kernels.
        bits = data.view(np.uint16)
        bits[...] = _f32_to_bf16_bits(_bf16_bits_to_f32(bits) / np.float32(divisor))
    else:
        with np.errstate(all="ignore"):  # NaN and overflow are the caller's data
            np.divide(data, data.dtype.type(divisor), out=data)


def _widen(dtype: DType, a: np.ndarray) -> np.ndarray | None:
    """float32 copy of a float16 or bfloat16 array (exact), else None."""
    if dtype is BFLOAT16:
        return _bf16_bits_to_f32(a.view(np.uint16))
    if dtype.numpy == np.dtype(np.float16):
        return a.astype(np.float32)
    return None


def fused_reduce(
    op: ReduceOp, dtype: DType, out: np.ndarray, srcs: list[np.ndarray], divisor: int = 0
) -> None:
    """out = srcs[0] op srcs[1] op ... op srcs[-1], folded in that (rank) order: the
    arena's reduction, which the compiled kernels (pycollective._native.reduce) match bit
    for bit. float16 and bfloat16 are widened to float32 for the whole fold and rounded
    once (so a p-input sum rounds once, not p - 1 times); complex products use the
    textbook formula, never a fused multiply-add; AVG (divisor > 1) divides as
    finish_average does. `out` may be one of the inputs."""
    ufunc = (_BOOL_UFUNC if dtype.kind == "b" else _UFUNC)[op]
    with np.errstate(all="ignore"):
        wide = _widen(dtype, srcs[0])
        if wide is not None:
            for s in srcs[1:]:
                ufunc(wide, _widen(dtype, s), out=wide)  # type: ignore[arg-type]  # same dtype: widened too
            if dtype is BFLOAT16:
                result = _f32_to_bf16_bits(wide).view(dtype.numpy)
            else:
                result = wide.astype(np.float16)
        elif dtype.kind == "c" and op is ReduceOp.PRODUCT:
            result = np.array(srcs[0], copy=True)
            for s in srcs[1:]:
                re = result.real * s.real - result.imag * s.imag
                im = result.real * s.imag + result.imag * s.real
                result.real, result.imag = re, im
        elif len(srcs) == 1:
            result = np.array(srcs[0], copy=True)
            if dtype.kind == "b":
                result = result.view(np.uint8) != 0
        else:
            result = ufunc(srcs[0], srcs[1])
            for s in srcs[2:]:
                ufunc(result, s, out=result)
        if op is ReduceOp.AVG:
            finish_average(result, dtype, divisor)
        out[...] = result
