"""The abort notice's codec (transport/tcp/aborts.py) on its own: what each error becomes on the
wire and what the peer rebuilds from it. No sockets."""

from __future__ import annotations

import pytest

from pycollective._errors import (
    AuthenticationError,
    CollectiveError,
    CollectiveTimeout,
    MismatchError,
    TransportError,
    UsageError,
)
from pycollective.transport import _wire
from pycollective.transport.tcp import aborts as _abort

GROUP, SEQ, SENDER = 7, 41, 3


def roundtrip(error: CollectiveError) -> tuple[_wire.Header, CollectiveError]:
    frame = _abort.encode(error, GROUP, SEQ)
    header = _wire.unpack(frame)
    payload = frame[_wire.SIZE :]
    assert len(payload) == header.nbytes
    return header, _abort.decode(SENDER, header, payload)


# (error sent) -> (code on the wire, rank at fault on the wire, class rebuilt, .peer,
# .waiting_on)
CASES = [
    (CollectiveError("boom"), 1, -1, CollectiveError, None, None),
    (TransportError("lost", peer=2), 2, 2, TransportError, 2, None),
    (TransportError("lost"), 2, -1, TransportError, None, None),
    (CollectiveTimeout("slow", waiting_on=(5,)), 3, 5, CollectiveTimeout, None, (5,)),
    (CollectiveTimeout("slow", waiting_on=(1, 2)), 3, -1, CollectiveTimeout, None, ()),
    (MismatchError("differ"), 4, -1, MismatchError, None, None),
    # a peer's misuse is its own: here, the group failed
    (UsageError("bad root"), 5, -1, CollectiveError, None, None),
    # a class without a code travels as its nearest base that has one
    (AuthenticationError("no key"), 1, -1, CollectiveError, None, None),
]


@pytest.mark.parametrize("error, code, at_fault, cls, peer, waiting_on", CASES)
def test_roundtrip(error, code, at_fault, cls, peer, waiting_on) -> None:
    header, got = roundtrip(error)
    assert (header.frame, header.kind, header.group, header.seq, header.root) == (
        _wire.ABORT, code, GROUP, SEQ, at_fault,
    )  # fmt: skip
    assert type(got) is cls
    assert str(got) == f"rank {SENDER} failed: {error}"
    if peer is not None or cls is TransportError:
        assert got.peer == peer
    if waiting_on is not None:
        assert got.waiting_on == waiting_on


def test_a_subclass_of_a_coded_class_keeps_its_base() -> None:
    class Lost(TransportError):
        pass

    assert _abort.error_code(Lost("x")) == _abort.ERROR_CODES[TransportError]
    assert _abort.error_code(ValueError("not ours")) == 1


def test_codes_are_distinct_and_fixed() -> None:
    # codes never change meaning: a peer of another version reads them
    assert _abort.ERROR_CODES == {
        CollectiveError: 1, TransportError: 2, CollectiveTimeout: 3, MismatchError: 4,
        UsageError: 5,
    }  # fmt: skip
    assert {v: k for k, v in _abort.ERROR_CODES.items()} == _abort.ERROR_TYPES


def test_a_long_message_is_cut_to_the_limit() -> None:
    header, got = roundtrip(CollectiveError("x" * (_wire.MAX_ABORT_PAYLOAD + 100)))
    assert header.nbytes == _wire.MAX_ABORT_PAYLOAD
    assert str(got) == f"rank {SENDER} failed: " + "x" * _wire.MAX_ABORT_PAYLOAD


# (header kind, payload from a peer) -> what it is read as
RECEIVED = [
    (99, b"new kind", CollectiveError, "rank 3 failed: new kind"),  # a code we do not know
    (0, b"zero", CollectiveError, "rank 3 failed: zero"),
    (4, b"\xff\xfebad utf-8", MismatchError, "rank 3 failed: \ufffd\ufffdbad utf-8"),
    (1, None, CollectiveError, "rank 3 failed: "),  # no payload at all
    (1, memoryview(b"view"), CollectiveError, "rank 3 failed: view"),
]


@pytest.mark.parametrize("kind, payload, cls, message", RECEIVED)
def test_decode_what_a_peer_sent(kind, payload, cls, message) -> None:
    header = _wire.Header(_wire.ABORT, kind, 0, 0, 0, GROUP, SEQ, 0, -1, 0, 0)
    got = _abort.decode(SENDER, header, payload)
    assert type(got) is cls and str(got) == message


def test_a_message_that_is_not_utf8_is_sent_replaced() -> None:
    header, got = roundtrip(CollectiveError("caf\udce9"))  # a lone surrogate
    assert str(got) == f"rank {SENDER} failed: caf?"
