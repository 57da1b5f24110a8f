"""The frame header every data message carries; its rules are transport/_calls.py's.

The receiver checks it against what it expects, so two ranks that called different
collectives (or the same one with different dtypes, counts, roots or ops) find out at the
first message instead of hanging or computing garbage.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .. import _dtypes

MAGIC = b"PC"
VERSION = 1

# Frame types
DATA = 1  # a step of a collective
P2P = 2  # send/recv between two ranks, matched by tag in FIFO order
ABORT = 3  # a rank failed; payload is the UTF-8 reason, `kind` is the error class code
PROBE = 4  # no payload: "I have waited a while on you in this collective" (its header)

_STRUCT = struct.Struct("<2sBBBBBBIQIiQQ")
SIZE = _STRUCT.size
# Where a packed header holds its sequence number (a little-endian uint64): the compiled
# swap (csrc/swappath.c) packs a signature's header once and writes each call's there.
SEQ_OFFSET = struct.calcsize(_STRUCT.format[: _STRUCT.format.index("Q")])
MAX_ABORT_PAYLOAD = 64 * 1024

# Collective kinds (codes on the wire)
KINDS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "gather",
    "scatter",
    "all_to_all",
    "barrier",
    "send_recv",
)
KIND_CODE = {name: i + 1 for i, name in enumerate(KINDS)}
KIND_NAME = {code: name for name, code in KIND_CODE.items()}
_REDUCING = {KIND_CODE[k] for k in ("all_reduce", "reduce", "reduce_scatter")}
_ROOTED = {KIND_CODE[k] for k in ("broadcast", "reduce", "gather", "scatter")}
OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG")  # ReduceOp's values
# Algorithm codes on the wire (a frame names the algorithm its sender runs, so two ranks that
# chose differently find out). Codes never change meaning: a new algorithm takes a new code.
ALGO_CODE: dict[str, int] = {
    "bruck": 1,
    "chain": 2,
    "dissemination": 3,
    "halving_doubling": 4,
    "linear": 5,
    "naive": 6,
    "p2p": 7,
    "pairwise": 8,
    "recursive_doubling": 9,
    "recursive_halving": 10,
    "ring": 11,
    "tree": 12,
    "shm": 13,  # the shared-memory arena (runners/arena.py)
    "shm-setup": 14,  # its set-up exchange
    "hierarchical": 15,  # runners/hierarchical.py
    "hierarchical-hosts": 16,  # its host-identity exchange
}
ALGO_NAME: dict[int, str] = {code: name for name, code in ALGO_CODE.items()}


class Header(NamedTuple):
    """A tuple (cheap to build and compare: one is made per message on the hot path)."""

    frame: int
    kind: int
    dtype: int
    op: int
    algo: int
    group: int
    seq: int
    tag: int
    root: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, which nothing calls
    nbytes: int

    def pack(self) -> bytes:
        return _PACK(MAGIC, VERSION, *self)

    def with_tag(self, tag: int, nbytes: int) -> Header:
        return _make((*self[:7], tag, self[8], self[9], nbytes))

    @property
    def key(self) -> tuple[int, int, int, int]:
        """What a receive matches on: frame type, group, sequence number, tag."""
        return (self.frame, self.group, self.seq, self.tag)

    def describe(self) -> str:
        kind = KIND_NAME.get(self.kind, f"<kind {self.kind}>")
        if self.frame == P2P:
            return (
                f"send(tag={self.tag}, dtype={_dtypes.code_name(self.dtype)}, bytes={self.nbytes})"
            )
        algo = ALGO_NAME.get(self.algo, str(self.algo))
        # Only what the call has: a root for rooted collectives (or one a peer set where
        # none belongs), an op for reducing ones.
        root = f"root={self.root}, " if self.kind in _ROOTED or self.root else ""
        op = ""
        if self.kind in _REDUCING:
            op = f"op={OP_NAMES[self.op] if self.op < len(OP_NAMES) else self.op}, "
        return (
            f"{kind}(#{self.seq}, dtype={_dtypes.code_name(self.dtype)}, count={self.count}, "
            f"{root}{op}algorithm={algo})"
        )


class FrameError(ValueError):
    """Bytes that are not a valid header."""


_PACK = _STRUCT.pack
_UNPACK_FROM = _STRUCT.unpack_from
_make = Header._make
_FRAMES = frozenset((DATA, P2P, ABORT, PROBE))


def unpack(data: bytes | bytearray | memoryview, offset: int = 0) -> Header:
    """The header in `data` at `offset` (SIZE bytes)."""
    fields = _UNPACK_FROM(data, offset)
    if fields[0] != MAGIC:
        raise FrameError(f"bad magic {fields[0]!r}")
    if fields[1] != VERSION:
        raise FrameError(f"unsupported frame version {fields[1]}")
    if fields[2] not in _FRAMES:
        raise FrameError(f"unknown frame type {fields[2]}")
    return _make(fields[2:])


def meta_differences(got: Header, want: Header) -> list[str]:
    """The fields in which a peer's collective differs from ours (tags excluded)."""
    if got[1:5] == want[1:5] and got[8:10] == want[8:10]:
        return []  # the common case, checked as two slices
    diffs = []
    names = ("kind", "dtype", "count", "root", "op", "algo")
    for name in names:
        a, b = getattr(got, name), getattr(want, name)
        if a != b:
            diffs.append(name)
    return diffs
