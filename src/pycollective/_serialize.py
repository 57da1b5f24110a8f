"""How objects travel between ranks as bytes: pickle, or a pickle-free format.

Pickle (torch's choice for its object collectives) can carry any object, but unpickling
runs code the sender chose. So pickles are read only where the user chose them and only
from peers that proved the job's key (never with PYCOLLECTIVE_INSECURE=1):

    PYCOLLECTIVE_OBJECT_SERIALIZER=auto     (default) object collectives pickle, as torch's;
                                            the library's own transfers (elastic state, the
                                            parameter server's set-up) use the safe format
    PYCOLLECTIVE_OBJECT_SERIALIZER=pickle   both may pickle (a state with objects of your own)
    PYCOLLECTIVE_OBJECT_SERIALIZER=safe     nothing is pickled; pickled payloads are refused

(or `pycollective._serialize.use(name)`). Callers say which kind of transfer it is with
`allow_pickle(internal=...)`. The safe format carries a fixed set of plain types:

    b"PCS1" value
    value = tag:1 byte, then per tag:
      N T F                      None, True, False
      i  len:u32 bytes           int, two's complement, little-endian
      f  8 bytes / c  16 bytes   float / complex
      s / b / B  len:u32 bytes   str (UTF-8) / bytes / bytearray
      l / t / S / z  n:u32 n*value       list / tuple / set / frozenset
      d  n:u32 n*(value value)   dict
      o  n:u32 n*(value value) value     OrderedDict, then its _metadata (torch's state_dict) or N
      a  dtype value(str) ndim:u8 shape:ndim*u64 data   numpy array (plain dtypes only)
      g  dtype value(str) data   numpy scalar
      x  like a                  torch tensor (CPU) of a plain dtype, rebuilt with torch
      X  dtype value(str) ndim:u8 shape:ndim*u64 data   torch tensor of any dtype (bfloat16...)

Decoding checks every length against what is left of the payload and bounds the nesting,
so a malformed payload is an error, never a huge allocation or a crash.
"""

from __future__ import annotations

import collections
import pickle
import re
import struct
from typing import Any

import numpy as np

from . import _config
from ._errors import CollectiveError, MismatchError, UsageError

MAGIC = b"PCS1"
MAX_DEPTH = 100
MAX_INT_BYTES = 1 << 16
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_C128 = struct.Struct("<dd")
_PLAIN_KINDS = frozenset("biufc")  # no object, void/structured or datetime dtypes
_DTYPE_STR = re.compile(rb"[<>|=][biufc][0-9]{1,2}")  # a plain dtype's .str: "<f8", "|b1"
NAMES = ("auto", "pickle", "safe")

_chosen: str | None = None


def use(name: str | None) -> None:
    """Choose the serializer for this process ("pickle" or "safe"); None: the environment's."""
    global _chosen
    if name is not None and name not in NAMES:
        raise UsageError(f"object serializer must be one of {NAMES}, got {name!r}")
    _chosen = name


def chosen() -> str:
    return _chosen or _config.get("PYCOLLECTIVE_OBJECT_SERIALIZER")


def allow_pickle(internal: bool = False, authenticated: bool = True) -> bool:
    """Whether a transfer may pickle: object collectives (`internal` False) unless the
    serializer is "safe", the library's own transfers only under "pickle", and never with
    peers that proved nothing (`authenticated` False: PYCOLLECTIVE_INSECURE=1)."""
    mode = chosen()
    if not authenticated or mode == "safe":
        return False
    return mode == "pickle" or not internal


# ---------------------------------------------------------------------- encoding


def dumps(obj: Any, pickling: bool | None = None) -> bytes:
    """`obj` as bytes: pickled when `pickling` (None: allow_pickle()), else the safe format."""
    if pickling is None:
        pickling = allow_pickle()
    if pickling:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out = bytearray(MAGIC)
    _encode(obj, out, 0)
    return bytes(out)


def _dtype_name(dt: np.dtype) -> str:
    if dt.kind not in _PLAIN_KINDS:
        raise UsageError(
            f"the pickle-free object serializer carries numpy arrays of plain dtypes only, not {dt}"
        )
    name: str = dt.str
    return name


def _encode(obj: Any, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise UsageError(f"object nests deeper than {MAX_DEPTH} levels")
    t = type(obj)
    if obj is None:
        out += b"N"
    elif t is bool:
        out += b"T" if obj else b"F"
    elif t is int:
        n = (obj.bit_length() + 8) // 8  # room for the sign bit
        if n > MAX_INT_BYTES:
            raise UsageError("int too large for the pickle-free serializer")
        out += b"i" + _U32.pack(n) + obj.to_bytes(n, "little", signed=True)
    elif t is float:
        out += b"f" + _F64.pack(obj)
    elif t is complex:
        out += b"c" + _C128.pack(obj.real, obj.imag)
    elif t is str:
        raw = obj.encode("utf-8", "surrogatepass")
        out += b"s" + _U32.pack(len(raw)) + raw
    elif t is bytes or t is bytearray:
        out += (b"b" if t is bytes else b"B") + _U32.pack(len(obj)) + obj
    elif t in (list, tuple, set, frozenset):
        tags: dict[type, bytes] = {list: b"l", tuple: b"t", set: b"S", frozenset: b"z"}
        tag = tags[t]
        out += tag + _U32.pack(len(obj))
        for item in obj:
            _encode(item, out, depth + 1)
    elif t is dict or t is collections.OrderedDict:
        out += (b"d" if t is dict else b"o") + _U32.pack(len(obj))
        for k, v in obj.items():
            _encode(k, out, depth + 1)
            _encode(v, out, depth + 1)
        if t is collections.OrderedDict:  # torch's state_dict keeps versions here
            meta = getattr(obj, "_metadata", None)
            plain = type(meta) in (dict, collections.OrderedDict)
            _encode(meta if plain else None, out, depth + 1)
    elif isinstance(obj, np.ndarray):
        _encode_array(b"a", obj, out)
    elif isinstance(obj, np.generic):
        name = _dtype_name(obj.dtype)
        out += b"g"
        _encode(name, out, depth + 1)
        out += obj.tobytes()
    elif _is_torch_tensor(obj):
        _encode_tensor(obj, out)
    else:
        raise UsageError(
            f"the pickle-free object serializer cannot carry {t.__name__} objects "
            "(None, bool, int, float, complex, str, bytes, list, tuple, dict, set, numpy "
            "arrays and CPU tensors only); set PYCOLLECTIVE_OBJECT_SERIALIZER=pickle to "
            "send anything picklable"
        )


def _encode_array(tag: bytes, arr: np.ndarray, out: bytearray) -> None:
    name = _dtype_name(arr.dtype)
    if arr.ndim > 32:
        raise UsageError("arrays of more than 32 dimensions are not supported")
    out += tag
    _encode(name, out, 0)
    out += bytes([arr.ndim])
    for d in arr.shape:
        out += _U64.pack(d)
    out += np.ascontiguousarray(arr).tobytes()


def _encode_tensor(t: Any, out: bytearray) -> None:
    """A CPU tensor of any dtype as its raw bytes (bfloat16 and friends have no numpy twin)."""
    flat = t.detach().cpu().contiguous()
    if flat.ndim > 32:
        raise UsageError("tensors of more than 32 dimensions are not supported")
    name = str(flat.dtype)  # "torch.float32"
    out += b"X"
    _encode(name, out, 0)
    out += bytes([flat.ndim])
    for d in flat.shape:
        out += _U64.pack(d)
    if flat.numel():
        import torch  # present: `t` is one of its tensors

        out += flat.reshape(-1).view(torch.uint8).numpy().tobytes()


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "numpy")


# ---------------------------------------------------------------------- decoding


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise CollectiveError(
                f"malformed object payload: {n} bytes wanted at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u32(self) -> int:
        n: int = _U32.unpack(self.take(4))[0]
        return n

    def count(self, min_item_bytes: int = 1) -> int:
        """A count of items, each at least `min_item_bytes` long: bounded by what is left."""
        n = self.u32()
        if n * min_item_bytes > len(self.data) - self.pos:
            raise CollectiveError(f"malformed object payload: {n} items cannot fit")
        return n


def loads(data: bytes, sender: int | None = None, pickling: bool | None = None) -> Any:
    """Bytes from a peer back into an object. Pickled bytes are read only when `pickling`
    (None: allow_pickle()); otherwise they are refused, naming the sender."""
    if data[: len(MAGIC)] == MAGIC:
        r = _Reader(bytes(data))
        r.take(len(MAGIC))
        obj = _decode(r, 0)
        if r.pos != len(r.data):
            raise CollectiveError("malformed object payload: trailing bytes")
        return obj
    if pickling is None:
        pickling = allow_pickle()
    if not pickling:
        who = f"rank {sender}" if sender is not None else "a peer"
        if chosen() == "safe":
            raise MismatchError(
                f"{who} sent a pickled object, but this rank accepts only the pickle-free "
                "serializer (PYCOLLECTIVE_OBJECT_SERIALIZER=safe here; set it on every rank)"
            )
        raise MismatchError(
            f"{who} sent a pickled object where this rank reads only the pickle-free format "
            "(the library's own transfers pickle only with PYCOLLECTIVE_OBJECT_SERIALIZER="
            "pickle on every rank, and nothing is unpickled from unauthenticated peers)"
        )
    return pickle.loads(data)  # noqa: S301 - chosen, and from a peer that proved the key


def _decode(r: _Reader, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise CollectiveError(f"malformed object payload: nested deeper than {MAX_DEPTH}")
    tag = r.take(1)
    if tag == b"N":
        return None
    if tag == b"T":
        return True
    if tag == b"F":
        return False
    if tag == b"i":
        n = r.u32()
        if n > MAX_INT_BYTES:
            raise CollectiveError("malformed object payload: int too long")
        return int.from_bytes(r.take(n), "little", signed=True)
    if tag == b"f":
        return _F64.unpack(r.take(8))[0]
    if tag == b"c":
        re, im = _C128.unpack(r.take(16))
        return complex(re, im)
    if tag in (b"s", b"b", b"B"):
        raw = r.take(r.u32())
        if tag == b"s":
            try:
                return raw.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                raise CollectiveError("malformed object payload: bad UTF-8") from None
        return raw if tag == b"b" else bytearray(raw)
    if tag in (b"l", b"t", b"S", b"z"):
        items = [_decode(r, depth + 1) for _ in range(r.count())]
        try:
            return {b"l": list, b"t": tuple, b"S": set, b"z": frozenset}[tag](items)
        except TypeError:
            raise CollectiveError("malformed object payload: unhashable set item") from None
    if tag in (b"d", b"o"):
        n = r.count(2)
        out: dict[Any, Any] = {} if tag == b"d" else collections.OrderedDict()
        for _ in range(n):
            k = _decode(r, depth + 1)
            try:
                out[k] = _decode(r, depth + 1)
            except TypeError:
                raise CollectiveError("malformed object payload: unhashable key") from None
        if tag == b"o":
            meta = _decode(r, depth + 1)
            if meta is not None:
                if type(meta) not in (dict, collections.OrderedDict):
                    raise CollectiveError("malformed object payload: bad OrderedDict metadata")
                out._metadata = meta  # type: ignore[attr-defined]
        return out
    if tag == b"X":
        return _decode_tensor(r)
    if tag in (b"a", b"x"):
        return _decode_array(r, tag == b"x")
    if tag == b"g":
        dt = _decode_dtype(r)
        return np.frombuffer(r.take(dt.itemsize), dtype=dt)[0]
    raise CollectiveError(f"malformed object payload: unknown tag {tag!r}")


def _decode_dtype(r: _Reader) -> np.dtype:
    if r.take(1) != b"s":
        raise CollectiveError("malformed object payload: dtype name expected")
    name = r.take(r.u32())
    # Only what _dtype_name writes (a plain dtype's .str): numpy's own parser of dtype
    # strings takes far more, and raises what it likes (SyntaxError from "(,", say).
    if _DTYPE_STR.fullmatch(name) is None:
        raise CollectiveError(f"malformed object payload: bad dtype {name[:40]!r}")
    try:
        dt = np.dtype(name.decode("ascii"))
    except TypeError:  # a size no type has ("<f3")
        raise CollectiveError(f"malformed object payload: bad dtype {name[:40]!r}") from None
    if dt.kind not in _PLAIN_KINDS:
        raise CollectiveError(f"malformed object payload: dtype {dt} is not allowed")
    return dt


def _decode_tensor(r: _Reader) -> Any:
    if r.take(1) != b"s":
        raise CollectiveError("malformed object payload: tensor dtype name expected")
    name = r.take(r.u32()).decode("ascii", "replace")
    ndim = r.take(1)[0]
    if ndim > 32:
        raise CollectiveError("malformed object payload: too many dimensions")
    shape = tuple(_U64.unpack(r.take(8))[0] for _ in range(ndim))
    try:
        import torch
    except ImportError:
        raise CollectiveError(
            f"a peer sent a torch tensor ({name}) and torch is not installed here"
        ) from None
    dtype = getattr(torch, name.removeprefix("torch."), None) if name.startswith("torch.") else None
    if not isinstance(dtype, torch.dtype):
        raise CollectiveError(f"malformed object payload: bad tensor dtype {name[:40]!r}")
    n = 1
    for d in shape:
        n *= d
    nbytes = n * dtype.itemsize
    if nbytes > len(r.data) - r.pos:  # judged before anything is allocated
        raise CollectiveError("malformed object payload: tensor larger than the payload")
    try:
        if not n:
            return torch.empty(shape, dtype=dtype)
        raw = torch.frombuffer(bytearray(r.take(nbytes)), dtype=torch.uint8)
        return raw.view(dtype).reshape(shape)
    except (RuntimeError, TypeError, ValueError):  # a shape or dtype torch refuses
        raise CollectiveError(
            f"malformed object payload: no {name[:40]} tensor of shape {shape}"
        ) from None


def _decode_array(r: _Reader, as_torch: bool) -> Any:
    dt = _decode_dtype(r)
    ndim = r.take(1)[0]
    if ndim > 32:
        raise CollectiveError("malformed object payload: too many dimensions")
    shape = tuple(_U64.unpack(r.take(8))[0] for _ in range(ndim))
    n = 1
    for d in shape:
        n *= d
    nbytes = n * dt.itemsize
    if nbytes > len(r.data) - r.pos:  # judged before anything is allocated
        raise CollectiveError("malformed object payload: array larger than the payload")
    try:
        arr = np.frombuffer(r.take(nbytes), dtype=dt).reshape(shape).copy()
    except ValueError:  # a shape numpy refuses (a dimension past its limit, say)
        raise CollectiveError(f"malformed object payload: no array of shape {shape}") from None
    if as_torch:
        try:
            import torch
        except ImportError:
            return arr
        try:
            return torch.from_numpy(arr)
        except (TypeError, ValueError):  # a dtype torch lacks: long double, big-endian
            raise CollectiveError(f"malformed object payload: no tensor of dtype {dt}") from None
    return arr


__all__ = ["NAMES", "chosen", "dumps", "loads", "use"]
