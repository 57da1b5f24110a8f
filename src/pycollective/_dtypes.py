"""The element types pycollective moves and reduces, and their one-byte wire codes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    # bfloat16 travels and is reduced as its raw bits (uint16): numpy has no bfloat16 of
    # its own, and ml_dtypes' (half a second of CPU to import, in every process) is needed
    # only by programs that hold such arrays, which have imported it already.
    _d("bfloat16", 15, np.uint16, "f"),
    _d("byte", 16, np.uint8, "u"),  # raw bytes of object collectives
]

BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
BY_CODE: dict[int, DType] = {d.code: d for d in _TABLE}
BFLOAT16 = BY_NAME["bfloat16"]
BYTE = BY_NAME["byte"]

_BY_NUMPY: dict[np.dtype, DType] = {
    d.numpy: d for d in _TABLE if d.name not in ("bfloat16", "byte")
}


def from_numpy_dtype(dtype: np.dtype) -> DType | None:
    """from_numpy for what is already an np.dtype (an array's .dtype): no conversion.
    A bfloat16 array (ml_dtypes') is BFLOAT16: view it as uint16 to carry it."""
    found = _BY_NUMPY.get(dtype)
    if found is None and dtype.name == "bfloat16" and dtype.itemsize == 2:
        return BFLOAT16
    return found


def from_numpy(dtype: np.dtype) -> DType | None:
    """The DType of a numpy dtype, or None when pycollective cannot carry it."""
    return from_numpy_dtype(np.dtype(dtype))


def code_name(code: int) -> str:
    d = BY_CODE.get(code)
    return d.name if d else f"<dtype code {code}>"
