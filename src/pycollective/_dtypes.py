"""The element types pycollective moves and reduces, and their one-byte wire codes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:  # ml_dtypes gives numpy a real bfloat16; without it bfloat16 travels as raw uint16
    import ml_dtypes as _ml_dtypes

    _NP_BFLOAT16: np.dtype | None = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only where ml_dtypes is absent
    _NP_BFLOAT16 = None


@dataclass(frozen=True)
class DType:
    name: str
    code: int
    itemsize: int
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool, "c" complex
    numpy: np.dtype  # the storage dtype of the flat view we hand to numpy

    def __hash__(self) -> int:
        # Calls are cached by keys holding their DType: hash by the code alone (every
        # DType is one of the table's, so equal ones have equal codes).
        return self.code

    @property
    def is_integral(self) -> bool:
        return self.kind in "iub"


def _d(name: str, code: int, np_dtype: np.dtype | type, kind: str) -> DType:
    dt = np.dtype(np_dtype)
    return DType(name, code, dt.itemsize, kind, dt)


_TABLE = [
    _d("float16", 1, np.float16, "f"),
    _d("float32", 2, np.float32, "f"),
    _d("float64", 3, np.float64, "f"),
    _d("int8", 4, np.int8, "i"),
    _d("int16", 5, np.int16, "i"),
    _d("int32", 6, np.int32, "i"),
    _d("int64", 7, np.int64, "i"),
    _d("uint8", 8, np.uint8, "u"),
    _d("uint16", 9, np.uint16, "u"),
    _d("uint32", 10, np.uint32, "u"),
    _d("uint64", 11, np.uint64, "u"),
    _d("bool", 12, np.bool_, "b"),
    _d("complex64", 13, np.complex64, "c"),
    _d("complex128", 14, np.complex128, "c"),
    # bfloat16 is stored as whatever numpy can hold: ml_dtypes' bfloat16, or raw uint16 bits.
    _d("bfloat16", 15, _NP_BFLOAT16 if _NP_BFLOAT16 is not None else np.uint16, "f"),
    _d("byte", 16, np.uint8, "u"),  # raw bytes of object collectives
]

BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
BY_CODE: dict[int, DType] = {d.code: d for d in _TABLE}
BFLOAT16 = BY_NAME["bfloat16"]
BYTE = BY_NAME["byte"]

_BY_NUMPY: dict[np.dtype, DType] = {
    d.numpy: d for d in _TABLE if d.name not in ("bfloat16", "byte")
}
if _NP_BFLOAT16 is not None:
    _BY_NUMPY[_NP_BFLOAT16] = BFLOAT16


def from_numpy_dtype(dtype: np.dtype) -> DType | None:
    """from_numpy for what is already an np.dtype (an array's .dtype): no conversion."""
    return _BY_NUMPY.get(dtype)


def from_numpy(dtype: np.dtype) -> DType | None:
    """The DType of a numpy dtype, or None when pycollective cannot carry it."""
    return _BY_NUMPY.get(np.dtype(dtype))


def code_name(code: int) -> str:
    d = BY_CODE.get(code)
    return d.name if d else f"<dtype code {code}>"
