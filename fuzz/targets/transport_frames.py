"""The transport's frames as a peer sends them: transport/_wire.py's header, and the TCP
transport's receive path that reads, bounds and matches them.

The input is the byte stream a hostile rank 1 sends rank 0, which waits for one frame
of a known call (group 1, call #0, 4 float32), first in an exchange, then (a connection
of its own) in a swap that sums the frame into ours, by the compiled round
(csrc/swapio.c) where the extension is there. Contract: every header either unpacks to
fields that pack back to the same bytes, or raises FrameError; the exchange either
delivers the 16 bytes it asked for or raises a CollectiveError subclass (a refused frame,
a lost peer, a mismatch, an abort the peer reported); the bytes set aside for early
frames stay within the transport's bound; and the transport still exchanges correct data
with an honest rank 2 afterwards in group 2 (a hostile peer cannot break the others'
connections; only frames that claim group 2 may fail its call, and then with a
CollectiveError). The swap sums into our buffer only when the stream is exactly our
frame (then the sum is numpy's), and otherwise finishes with the frame's 16 bytes or a
CollectiveError.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np

from pycollective._errors import CollectiveError
from pycollective.transport import _calls, _wire
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import TCPTransport
from pycollective.transport.tcp.transport import SWAP_DONE, SWAP_FOLDED, SWAP_PENDING

EXPECT = _wire.Header(_wire.DATA, 1, 2, 0, 1, 1, 0, 0, 0, 4, 16)  # group 1, #0, 4 x float32
EARLY_BOUND = 1 << 20  # bytes of early frames rank 0 may set aside (max_unexpected)
_BESIDE = _wire.Header(_wire.DATA, 1, 1, 0, 1, 2, 0, 0, 0, 64, 64)  # group 2's call


def _headers(data: bytes) -> None:
    for pos in range(0, min(len(data), 4 * _wire.SIZE) - _wire.SIZE + 1, _wire.SIZE):
        chunk = data[pos : pos + _wire.SIZE]
        try:
            header = _wire.unpack(chunk)
        except _wire.FrameError:
            continue
        assert header.pack() == chunk, (header, chunk)
        assert isinstance(header.describe(), str)
        assert set(_wire.meta_differences(header, EXPECT)) <= {
            "kind", "dtype", "count", "root", "op", "algo"
        }  # fmt: skip
        assert isinstance(_calls.describe_peer(1, header), str)


def _beside(t0: TCPTransport, t2: TCPTransport) -> None:
    """Group 2 exchanges checked data between ranks 0 and 2, both ways at once."""
    out0, out2 = os.urandom(64), os.urandom(64)
    in0, in2 = bytearray(64), bytearray(64)
    errors: list[BaseException] = []

    def rank2() -> None:
        try:
            t2.exchange(
                [OutMessage(0, _BESIDE, memoryview(out2))],
                [InMessage(0, _BESIDE, memoryview(in2))],
                time.monotonic() + 10,
                2,
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    th = threading.Thread(target=rank2)
    th.start()
    try:
        t0.exchange(
            [OutMessage(2, _BESIDE, memoryview(out0))],
            [InMessage(2, _BESIDE, memoryview(in0))],
            time.monotonic() + 10,
            2,
        )
    except BaseException:
        t2.interrupt("rank 0 gave up this call")  # rank 2 stops waiting for it now
        raise
    finally:
        th.join(10)
    assert not errors, errors
    assert bytes(in0) == out2 and bytes(in2) == out0, "the group beside got wrong data"


def _names_group(data: bytes, group: int) -> bool:
    """Whether a header anywhere in `data` names `group`."""
    for pos in range(len(data) - _wire.SIZE + 1):
        try:
            if _wire.unpack(data, pos).group == group:
                return True
        except _wire.FrameError:
            pass
    return False


def _swap(data: bytes) -> None:
    """The stream as the only peer's answer to a swap of our 4 float32 for its own."""
    ours, hostile = socket.socketpair()
    t0 = TCPTransport(0, 2, {1: ours})
    mine = np.arange(4, dtype=np.float32)
    dst = mine.copy()
    into = bytearray(16)
    try:
        try:
            hostile.sendall(data)
        except OSError:
            pass
        hostile.shutdown(socket.SHUT_WR)
        fold = (memoryview(dst).cast("B"), 0, EXPECT.dtype)  # SUM, float32
        rc = t0.swap(1, EXPECT, memoryview(mine).cast("B"), memoryview(into), False, fold)
        frame = data[: _wire.SIZE] == EXPECT.pack()
        payload = data[_wire.SIZE : _wire.SIZE + 16]
        if rc in (SWAP_FOLDED, SWAP_DONE):  # compiled (reduced) or Python (left in `into`)
            assert frame and len(data) == _wire.SIZE + 16, data
            if rc == SWAP_DONE:
                assert bytes(into) == payload
                return
            want = mine + np.frombuffer(payload, np.float32)
            assert dst.tobytes() == want.tobytes(), (dst, want)
            return
        assert rc == SWAP_PENDING and dst.tobytes() == mine.tobytes(), rc
        try:
            t0.swap_finish(time.monotonic() + 5)
        except CollectiveError:
            return
        # finished: `into` has the 16 bytes behind one of our frames in the stream (others,
        # probes say, may come first)
        head, pos = EXPECT.pack(), -1
        while (pos := data.find(head, pos + 1)) >= 0:
            if bytes(into) == data[pos + _wire.SIZE : pos + _wire.SIZE + 16]:
                return
        raise AssertionError(f"finished without our frame's payload: {data!r}")
    finally:
        hostile.close()  # first: rank 0's close waits a moment for its peers to hang up
        t0.close()


def check(data: bytes) -> None:
    _headers(data)
    _swap(data)
    a1, hostile = socket.socketpair()
    a2, b0 = socket.socketpair()
    b1, spare = socket.socketpair()
    t0 = TCPTransport(0, 3, {1: a1, 2: a2})
    t0.max_unexpected = EARLY_BOUND
    t2 = TCPTransport(2, 3, {0: b0, 1: b1})
    try:
        try:
            hostile.sendall(data)
        except OSError:
            pass  # rank 0 hung up on it already
        hostile.shutdown(socket.SHUT_WR)
        dest = bytearray(16)
        try:
            t0.exchange([], [InMessage(1, EXPECT, memoryview(dest))], time.monotonic() + 5, 1)
        except CollectiveError:
            pass  # refused, lost, mismatched or aborted: each is the contract
        assert t0._unexpected_bytes <= EARLY_BOUND, t0._unexpected_bytes
        try:
            _beside(t0, t2)
        except CollectiveError:
            # Only frames that claim the group beside may fail it (rank 1 is not in it,
            # and a member's frame of another call is a mismatch there too).
            assert _names_group(data, _BESIDE.group), data
    finally:
        t0.close()
        t2.close()
        for s in (hostile, spare):
            s.close()
