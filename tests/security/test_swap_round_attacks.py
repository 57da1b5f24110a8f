"""A hostile peer against the compiled round of a small swap (csrc/swapio.c): whatever it
sends, nothing lands in the caller's buffer unless the stream is exactly one frame with
our header byte for byte, no byte is written past the buffers (a guard after the
destination stays as it was; AddressSanitizer runs these too: `make sanitize`), and the
regular machinery then refuses what is wrong, naming the peer."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from pycollective import CollectiveError
from pycollective.transport import _wire
from pycollective.transport._wire import Header
from pycollective.transport.tcp import TCPTransport
from pycollective.transport.tcp import transport as tt

pytest.importorskip("pycollective._native")

N = 4  # float32 items of the call
OURS = Header(_wire.DATA, 1, 2, 0, 9, 77, 0, 0, 0, N, 4 * N)
GUARD = 64


def _swap_against(stream: bytes):
    """Rank 0's swap of N float32 summed into a buffer with a guard behind it, the
    peer's side of the stream `stream` and then its end. Returns (rc, transport, the
    destination with its guard, the bytes of the peer's payload it was given)."""
    ours, hostile = socket.socketpair()
    t0 = TCPTransport(0, 2, {1: ours})
    assert t0._round is not None
    hostile.sendall(stream)
    hostile.shutdown(socket.SHUT_WR)
    whole = np.full(N + GUARD, 7.0, np.float32)
    dst = whole[:N]
    mine = np.arange(N, dtype=np.float32)
    into = bytearray(4 * N)
    fold = (memoryview(dst).cast("B"), 0, OURS.dtype)
    rc = t0.swap(1, OURS, memoryview(mine).cast("B"), memoryview(into), False, fold)
    return rc, t0, hostile, whole, into


def _finish_refused(t0, hostile) -> str:
    with pytest.raises(CollectiveError) as err:
        t0.swap_finish(time.monotonic() + 5)
    hostile.close()
    t0.close()
    return str(err.value)


def test_a_frame_claiming_more_than_ours_is_not_reduced_and_is_refused() -> None:
    claim = OURS._replace(nbytes=1 << 30)  # our call, a gigabyte announced
    rc, t0, hostile, whole, _ = _swap_against(claim.pack() + b"\x01" * 4096)
    assert rc == tt.SWAP_PENDING
    assert (whole == 7.0).all()  # nothing combined, the guard untouched
    assert "rank 1" in _finish_refused(t0, hostile)


def test_a_surplus_behind_our_frame_is_not_reduced_and_is_refused_as_a_frame() -> None:
    surplus = np.ones(N * 4, np.float32).tobytes()  # our frame, then 4x its payload again
    rc, t0, hostile, whole, into = _swap_against(OURS.pack() + surplus)
    assert rc == tt.SWAP_PENDING  # more than the frame came: the regular way reads on
    assert (whole == 7.0).all()
    t0.swap_finish(time.monotonic() + 5)  # our frame, into `into` (the caller reduces)
    assert bytes(into) == surplus[: 4 * N]
    assert "invalid frame" in t0.lost_peers()[1]  # the rest read as a frame: refused
    hostile.close()
    t0.close()


@pytest.mark.parametrize("field", ["seq", "op", "count", "dtype"])
def test_a_frame_differing_in_any_field_is_not_reduced(field: str) -> None:
    other = OURS._replace(**{field: getattr(OURS, field) + 1})
    rc, t0, hostile, whole, into = _swap_against(other.pack() + b"\x00" * (4 * N))
    assert rc == tt.SWAP_PENDING
    assert (whole == 7.0).all() and not any(into)
    _finish_refused(t0, hostile)  # a mismatch, or the peer gone before our frame came


def test_exactly_our_frame_is_reduced_and_nothing_beyond() -> None:
    payload = np.full(N, 2.0, np.float32)
    rc, t0, hostile, whole, _ = _swap_against(OURS.pack() + payload.tobytes())
    assert rc == tt.SWAP_FOLDED
    assert whole[:N].tolist() == [9.0] * N and (whole[N:] == 7.0).all()  # 7 + 2
    hostile.close()
    t0.close()
