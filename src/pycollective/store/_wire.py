"""The store's wire format: length-prefixed frames with bounds checked before allocation.

    request  = op:u8  nargs:u32  timeout_ms:i64 (-1: no limit)  { len:u32  bytes }*nargs
    response = status:u8  len:u32  payload

Each op fixes how many arguments it takes and which of them are values (bounded by
MAX_VALUE_BYTES) rather than keys (bounded by MAX_KEY_BYTES), so a peer's length field
is judged against the right limit before a byte is allocated for it.
"""

from __future__ import annotations

import enum
import socket
import struct

from ._base import MAX_KEY_BYTES, MAX_VALUE_BYTES

REQUEST_HEADER = struct.Struct("!BIq")
RESPONSE_HEADER = struct.Struct("!BI")
LENGTH = struct.Struct("!I")

# wait/check may name many keys, but the whole request stays bounded.
MAX_ARGS = 65536
MAX_FRAME_BYTES = 2 * MAX_VALUE_BYTES + 2 * MAX_KEY_BYTES


class Op(enum.IntEnum):
    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    DELETE = 7
    NUM_KEYS = 8
    # SET whose key the server deletes when this connection closes: a liveness lease
    # (ZooKeeper's ephemeral node). The kernel closes a dead process's socket at once.
    SET_LEASE = 9


class Status(enum.IntEnum):
    OK = 0
    TIMEOUT = 1  # payload: the missing keys, packed as arguments
    ERROR = 2  # payload: a UTF-8 message


# op -> (min args, max args, positions that hold values rather than keys)
ARITY: dict[Op, tuple[int, int, frozenset[int]]] = {
    Op.SET: (2, 2, frozenset({1})),
    Op.GET: (1, 1, frozenset()),
    Op.ADD: (2, 2, frozenset()),
    Op.COMPARE_SET: (3, 3, frozenset({1, 2})),
    Op.WAIT: (0, MAX_ARGS, frozenset()),
    Op.CHECK: (0, MAX_ARGS, frozenset()),
    Op.DELETE: (1, 1, frozenset()),
    Op.NUM_KEYS: (0, 0, frozenset()),
    Op.SET_LEASE: (2, 2, frozenset({1})),
}


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection must be dropped."""


class PeerClosed(Exception):
    """The peer closed the connection (cleanly, between frames or mid-frame)."""


_FIRST_BYTES = 1 << 20  # a payload's buffer starts this big and doubles as bytes come


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Read exactly n bytes (the caller has already bounded n). The buffer grows as the
    bytes arrive, so a peer that announces a large payload and sends little costs little."""
    buf = bytearray(min(n, _FIRST_BYTES))
    got = 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(len(buf), n - len(buf))))
        with memoryview(buf) as view, view[got:] as rest:
            k = sock.recv_into(rest)
        if k == 0:
            raise PeerClosed
        got += k
    return buf


def pack_args(args: list[bytes]) -> bytes:
    parts: list[bytes] = []
    for a in args:
        parts.append(LENGTH.pack(len(a)))
        parts.append(a)
    return b"".join(parts)


def unpack_args(data: bytes | bytearray) -> list[bytes]:
    """Inverse of pack_args, for payloads already bounded by the frame size."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + LENGTH.size > len(data):
            raise ProtocolError("truncated argument list")
        (n,) = LENGTH.unpack_from(data, pos)
        pos += LENGTH.size
        if pos + n > len(data):
            raise ProtocolError("truncated argument")
        out.append(bytes(data[pos : pos + n]))
        pos += n
    return out


def encode_request(op: Op, args: list[bytes], timeout: float | None) -> bytes:
    timeout_ms = -1 if timeout is None else int(timeout * 1000 + 0.999)
    return REQUEST_HEADER.pack(op, len(args), timeout_ms) + pack_args(args)


def read_request(sock: socket.socket) -> tuple[Op, list[bytes], float | None]:
    """Read one request, judging every length before allocating for it."""
    header = recv_exact(sock, REQUEST_HEADER.size)
    raw_op, nargs, timeout_ms = REQUEST_HEADER.unpack(header)
    try:
        op = Op(raw_op)
    except ValueError:
        raise ProtocolError(f"unknown op {raw_op}") from None
    lo, hi, values = ARITY[op]
    if not lo <= nargs <= hi:
        raise ProtocolError(f"{op.name} takes {lo}..{hi} arguments, got {nargs}")
    if timeout_ms < -1:
        raise ProtocolError(f"bad timeout {timeout_ms} ms")
    args: list[bytes] = []
    total = 0
    for i in range(nargs):
        (n,) = LENGTH.unpack(recv_exact(sock, LENGTH.size))
        limit = MAX_VALUE_BYTES if i in values else MAX_KEY_BYTES
        if n > limit:
            raise ProtocolError(f"{op.name} argument {i} claims {n} bytes (limit {limit})")
        total += n
        if total > MAX_FRAME_BYTES:
            raise ProtocolError(f"{op.name} request exceeds {MAX_FRAME_BYTES} bytes")
        args.append(bytes(recv_exact(sock, n)))
    return op, args, (None if timeout_ms == -1 else timeout_ms / 1000.0)


def encode_response(status: Status, payload: bytes) -> bytes:
    return RESPONSE_HEADER.pack(status, len(payload)) + payload


def read_response(sock: socket.socket) -> tuple[Status, bytes]:
    raw_status, n = RESPONSE_HEADER.unpack(recv_exact(sock, RESPONSE_HEADER.size))
    try:
        status = Status(raw_status)
    except ValueError:
        raise ProtocolError(f"unknown status {raw_status}") from None
    if n > MAX_FRAME_BYTES:
        raise ProtocolError(f"response claims {n} bytes (limit {MAX_FRAME_BYTES})")
    return status, bytes(recv_exact(sock, n))
