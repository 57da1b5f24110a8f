"""The object serializer's pickle-free format (_serialize.py loads), fed a peer's payload.

The input is the payload after the format's magic (b"PCS1"). Contract: loads returns a
value or raises CollectiveError ("malformed object payload ..."), never another
exception; what it returns holds no more memory than a bounded multiple of the payload
(every count and length is judged against the bytes left before anything is allocated);
and it travels again: the safe format encodes it, and decodes that back to an equal
value. Payloads without the magic (pickles) are refused with MismatchError.
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Any

import numpy as np

from pycollective import _serialize
from pycollective._errors import CollectiveError, MismatchError

try:
    import torch
except ImportError:  # the torch extra is absent: tensors decode to nothing here
    torch = None  # type: ignore[assignment]

# Bytes a decoded value may hold per payload byte: a one-byte item ("N") becomes an
# 8-byte slot of its container, and small containers carry Python's fixed overheads.
PER_BYTE = 64
FIXED = 4096


def _size(value: Any, depth: int = 0) -> int:
    """Bytes the value holds (its containers, their items, array and tensor data)."""
    if isinstance(value, np.ndarray):
        return value.nbytes + 112
    if torch is not None and isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes() + 112
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_size(k, depth + 1) + _size(v, depth + 1) for k, v in value.items())
        meta = getattr(value, "_metadata", None)
        if meta is not None:
            size += _size(meta, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        size += sum(_size(x, depth + 1) for x in value)
    return size


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to itself and arrays and tensors compared by dtype, shape
    and bytes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if torch is not None and isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and _tensor_bytes(a) == _tensor_bytes(b)
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        pairs = zip(a.items(), b.items(), strict=True)  # keys in order: NaN keys too
        if not all(_same(ka, kb) and _same(va, vb) for (ka, va), (kb, vb) in pairs):
            return False
        if isinstance(a, collections.OrderedDict):
            return _same(getattr(a, "_metadata", None), getattr(b, "_metadata", None))
        return True
    if isinstance(a, (set, frozenset)):
        return sorted(map(_canon, a)) == sorted(map(_canon, b))
    return a == b  # None, bools, ints, strings, bytes


def _canon(x: Any) -> tuple:
    """A hashable item as comparable data: NaN equal to NaN, sets in a fixed order."""
    if isinstance(x, (set, frozenset)):
        return (type(x).__name__, tuple(sorted(map(_canon, x))))
    if isinstance(x, tuple):
        return ("tuple", tuple(map(_canon, x)))
    return (type(x).__name__, repr(x))


def _tensor_bytes(t: Any) -> bytes:
    flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def check(data: bytes) -> None:
    payload = _serialize.MAGIC + data
    try:
        value = _serialize.loads(payload, sender=1, pickling=False)
    except CollectiveError as exc:
        assert "malformed object payload" in str(exc) or "torch" in str(exc), exc
        return
    held = _size(value)
    assert held <= PER_BYTE * len(payload) + FIXED, (held, len(payload))
    again = _serialize.dumps(value, pickling=False)
    assert _same(_serialize.loads(again, pickling=False), value), (value, again)
    try:
        _serialize.loads(data, sender=1, pickling=False)
    except MismatchError:
        pass
    except CollectiveError:
        assert data.startswith(_serialize.MAGIC)
