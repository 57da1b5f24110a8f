"""The abort notice's codec: a rank that fails tells its peers why in an ABORT frame whose
`kind` is the error's class, `root` the rank at fault when there is exactly one, and whose
payload is the message (bounded). Sans-IO: the transport sends and reads the frames."""

from __future__ import annotations

from ..._errors import (
    CollectiveError,
    CollectiveTimeout,
    MismatchError,
    TransportError,
    UsageError,
)
from .. import _wire
from .._wire import Header

ERROR_CODES: dict[type[CollectiveError], int] = {
    CollectiveError: 1,
    TransportError: 2,
    CollectiveTimeout: 3,
    MismatchError: 4,
    UsageError: 5,
}
ERROR_TYPES = {code: cls for cls, code in ERROR_CODES.items()}


def error_code(exc: BaseException) -> int:
    """The wire code of `exc`'s class (its nearest known base; 1 for anything else)."""
    for cls in type(exc).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]
    return 1


def encode(error: CollectiveError, group: int, seq: int) -> bytes:
    """The ABORT frame (header and payload) telling peers that collective `seq` of `group`
    failed with `error`."""
    reason = str(error).encode("utf-8", "replace")[: _wire.MAX_ABORT_PAYLOAD]
    # `root` names the rank at fault when there is exactly one (the lost peer, the rank
    # a timeout waited on), so the relayed error keeps .peer / .waiting_on.
    culprit = -1
    if isinstance(error, TransportError) and error.peer is not None:
        culprit = error.peer
    elif isinstance(error, CollectiveTimeout) and len(error.waiting_on) == 1:
        culprit = error.waiting_on[0]
    header = Header(_wire.ABORT, error_code(error), 0, 0, 0, group, seq, 0, culprit, 0, len(reason))
    return header.pack() + reason


def decode(peer: int, header: Header, payload: bytes | None) -> CollectiveError:
    """The error an ABORT frame from `peer` reports (its payload None if it had none)."""
    reason = bytes(payload).decode("utf-8", "replace") if payload is not None else ""
    cls = ERROR_TYPES.get(header.kind, CollectiveError)
    if cls is UsageError:
        cls = CollectiveError  # someone else's misuse is not ours
    message = f"rank {peer} failed: {reason}"
    culprit = header.root if header.root >= 0 else None
    if cls is TransportError:
        return TransportError(message, peer=culprit)
    if cls is CollectiveTimeout:
        waiting = () if culprit is None else (culprit,)
        return CollectiveTimeout(message, waiting_on=waiting)
    return cls(message)


def copy_error(exc: CollectiveError) -> CollectiveError:
    """A fresh exception like `exc` (same class, message and details) to raise again."""
    if isinstance(exc, TransportError):
        return TransportError(str(exc), peer=exc.peer)
    if isinstance(exc, CollectiveTimeout):
        return CollectiveTimeout(str(exc), op=exc.op, seq=exc.seq, waiting_on=exc.waiting_on)
    return type(exc)(str(exc))
