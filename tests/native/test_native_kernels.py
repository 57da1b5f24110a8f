"""The compiled reduction kernels (pycollective._native.reduce) against the Python
reference (_reduce_ops.fused_reduce), bit for bit: every op x dtype the API accepts,
every kernel set this CPU can run, awkward lengths, unaligned and aliased buffers. No
processes: these run in milliseconds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycollective import _dtypes
from pycollective._errors import UsageError
from pycollective._reduce_ops import ReduceOp, check_op_dtype, finish_average, fused_reduce

if os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0":
    pytest.skip("PYCOLLECTIVE_NATIVE=0: the compiled core is switched off", allow_module_level=True)
from pycollective import _native  # noqa: E402 - built by `pip install -e .` (make setup)

DTYPES = [d for d in _dtypes.BY_NAME.values() if d.name != "byte"]
SETS = _native.kernel_sets()
LENGTHS = (0, 1, 7, 4097)


def _valid_ops(dtype):
    ops = []
    for op in ReduceOp:
        try:
            check_op_dtype(op, dtype)
        except UsageError:
            continue
        ops.append(op)
    return ops


def _bits(rng, dtype, n):
    """n random elements of dtype, specials included (NaNs with payloads, infinities,
    signed zeros, subnormals)."""
    np_dt = dtype.numpy
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 256, n * np_dt.itemsize, dtype=np.uint8).view(np_dt)
    if dtype.itemsize == 2:  # float16, bfloat16: any bit pattern, half of them near 1
        raw = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        lo = 0x3C00 if dtype.name == "float16" else 0x3F80
        near = rng.integers(lo, lo + 0x100, n)
        raw = np.where(rng.random(n) < 0.5, raw, near.astype(np.uint16))
        return raw.view(np_dt)
    real = np.float32 if dtype.name in ("float32", "complex64") else np.float64
    count = n * (2 if dtype.kind == "c" else 1)
    vals = rng.standard_normal(count).astype(real) * real(4.0)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-42, np.finfo(real).max], real)
    mask = rng.random(count) < 0.1
    vals[mask] = rng.choice(specials, int(mask.sum()))
    return vals.view(np_dt)


def _unaligned(a: np.ndarray) -> np.ndarray:
    raw = bytearray(a.nbytes + 1)
    view = np.frombuffer(raw, a.dtype, a.size, offset=1)
    view[...] = a
    return view


def _nan_mask(a: np.ndarray, bf16: bool = False) -> np.ndarray:
    """Where `a` holds NaNs, per float (complex: per component), from the bits. bfloat16
    travels as its raw uint16 bits: `bf16` says that is what `a` holds."""
    if a.dtype.kind == "c":
        a = a.view(np.float32 if a.dtype.itemsize == 8 else np.float64)
    if bf16:
        return (a.view(np.uint16) & 0x7FFF) > 0x7F80
    if a.dtype.kind in "iub":
        return np.zeros(a.shape, bool)
    if a.dtype.itemsize == 2:  # float16 bits
        return (a.view(np.uint16) & 0x7FFF) > 0x7C00
    return np.isnan(a)


def _same_bits(got: np.ndarray, want: np.ndarray, what: str, bf16: bool = False) -> None:
    """Bit for bit, except that a NaN matches any NaN: which operand's payload (and sign)
    an addition of two NaNs keeps is the hardware's and the compiler's choice (operands of
    a commutative op may be swapped), in numpy as in our kernels."""
    want = np.ascontiguousarray(want)
    unit = {8: np.float32, 16: np.float64}[got.itemsize] if got.dtype.kind == "c" else got.dtype
    g, w = got.view(unit), want.view(unit)
    both_nan = _nan_mask(g, bf16) & _nan_mask(w, bf16)
    size = g.itemsize
    differ = (g.view(np.uint8).reshape(-1, size) != w.view(np.uint8).reshape(-1, size)).any(1)
    bad = np.nonzero(differ & ~both_nan)[0]
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}: element {i} of {g.size} differs: got {g[i]!r} "
            f"({g[i : i + 1].tobytes().hex()}), want {w[i]!r} ({w[i : i + 1].tobytes().hex()})"
        )


@pytest.fixture(params=SETS)
def kernels(request):
    old = _native.use_kernels(request.param)
    yield request.param
    _native.use_kernels(old)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_op_matches_the_reference(kernels, dtype) -> None:
    rng = np.random.default_rng(dtype.code)
    bf16 = dtype is _dtypes.BFLOAT16
    for op in _valid_ops(dtype):
        divisor = 3 if op is ReduceOp.AVG else 0
        for n in LENGTHS:
            for m in (1, 2, 3, 5):
                srcs = [_bits(rng, dtype, n) for _ in range(m)]
                want = np.empty(n, dtype.numpy)
                fused_reduce(op, dtype, want, srcs, divisor)
                got = np.empty(n, dtype.numpy)
                _native.reduce(int(op), dtype.code, got, srcs, divisor)
                _same_bits(got, want, f"{kernels} {op.name} {dtype.name} n={n} m={m}", bf16)
                if n:
                    odd = [_unaligned(s) for s in srcs]
                    out = _unaligned(np.zeros(n, dtype.numpy))
                    _native.reduce(int(op), dtype.code, out, odd, divisor)
                    _same_bits(out, want, f"unaligned {op.name} {dtype.name} n={n} m={m}", bf16)
                    # out may be any of the inputs (the arena reduces into a rank's own data)
                    alias = [s.copy() for s in srcs]
                    _native.reduce(int(op), dtype.code, alias[-1], alias, divisor)
                    _same_bits(
                        alias[-1], want, f"in place {op.name} {dtype.name} n={n} m={m}", bf16
                    )
                    alias = [s.copy() for s in srcs]
                    _native.reduce(int(op), dtype.code, alias[0], alias, divisor)
                    _same_bits(
                        alias[0], want, f"into the first {op.name} {dtype.name} n={n} m={m}", bf16
                    )


def test_undefined_ops_are_refused() -> None:
    out = np.zeros(4, np.complex64)
    with pytest.raises(ValueError, match="not defined"):
        _native.reduce(int(ReduceOp.MIN), _dtypes.BY_NAME["complex64"].code, out, [out, out])
    with pytest.raises(ValueError, match="as long as"):
        _native.reduce(0, 2, np.zeros(4, np.float32), [np.zeros(3, np.float32)] * 2)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_every_half_precision_value_rounds_like_the_reference(kernels, name) -> None:
    # Every bit pattern against a few partners, sums and products: the widening and the
    # single rounding (ties, subnormals, overflow to infinity, NaN payloads).
    dtype = _dtypes.BY_NAME[name]
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype.numpy)
    partners = [0x0000, 0x8000, 0x0001, 0x3C00, 0x3C01, 0x7BFF, 0x7C00, 0x7E01, 0xBC00]
    if name == "bfloat16":
        partners = [0x0000, 0x8000, 0x0001, 0x3F80, 0x3F81, 0x7F7F, 0x7F80, 0x7FC1, 0xBF80]
    for partner in partners:
        other = np.full(every.size, partner, np.uint16).view(dtype.numpy)
        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG):
            want = np.empty_like(every)
            fused_reduce(op, dtype, want, [every, other, every], 3)
            got = np.empty_like(every)
            _native.reduce(int(op), dtype.code, got, [every, other, every], 3)
            _same_bits(
                got, want, f"{kernels} {name} {op.name} partner {partner:#06x}", name == "bfloat16"
            )


def test_fused_avg_equals_sum_then_finish_average() -> None:
    # The arena may fuse AVG's division; it must give what SUM + finish_average gives.
    rng = np.random.default_rng(7)
    for dtype in DTYPES:
        if dtype.kind == "b":
            continue
        srcs = [_bits(rng, dtype, 999) for _ in range(4)]
        want = np.empty(999, dtype.numpy)
        _native.reduce(int(ReduceOp.SUM), dtype.code, want, srcs)
        finish_average(want, dtype, 4)
        got = np.empty(999, dtype.numpy)
        _native.reduce(int(ReduceOp.AVG), dtype.code, got, srcs, 4)
        _same_bits(got, want, f"AVG {dtype.name}", dtype is _dtypes.BFLOAT16)


FLOATS = [_dtypes.BY_NAME[n] for n in ("float16", "bfloat16", "float32", "float64")]


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(FLOATS),
    op=st.sampled_from([ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]),
    m=st.integers(2, 5),
    data=st.data(),
)
def test_any_bits(dtype, op, m, data) -> None:
    n = data.draw(st.integers(0, 40))
    isz = dtype.itemsize
    srcs = [
        np.frombuffer(data.draw(st.binary(min_size=n * isz, max_size=n * isz)), dtype.numpy)
        for _ in range(m)
    ]
    divisor = data.draw(st.integers(2, 9))
    want = np.empty(n, dtype.numpy)
    fused_reduce(op, dtype, want, srcs, divisor)
    got = np.empty(n, dtype.numpy)
    _native.reduce(int(op), dtype.code, got, srcs, divisor)
    _same_bits(got, want, f"{op.name} {dtype.name}", dtype is _dtypes.BFLOAT16)
