"""The compiled read-and-reduce of a TCP payload (csrc/sockio.c recv_reduce) reads what
our side expects and not a byte more, whatever a peer sends: the length is the receive's
destination (from our call), never the peer's; a frame announcing more than we expect is
refused before any of its payload is combined; arguments that would take the loop outside
its buffers are refused before it runs."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from tests.transport.test_conformance import _both, _data, _mesh

from pycollective._errors import CollectiveError
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import folding

pytestmark = pytest.mark.timeout(60)
recv_reduce = folding.compiled()  # `make setup` builds the extension: None fails here
SUM, F32 = 0, 2


def test_a_peer_sending_more_than_expected_gets_exactly_the_expected_bytes_read() -> None:
    assert recv_reduce is not None
    a, b = socket.socketpair()
    a.setblocking(False)
    n = 4096  # float32s we expect
    region = np.zeros(n + 64, np.float32)  # the destination, and a guard after it
    dst = memoryview(region[:n].view(np.uint8))
    b.sendall(np.ones(4 * n, np.float32).tobytes())  # four times what we expect
    time.sleep(0.05)
    got = reduced = have = 0
    while reduced < dst.nbytes:
        nread, r, have, status = recv_reduce(
            a.fileno(), dst[reduced:], memoryview(bytearray(1000)), have, SUM, F32, 1 << 20
        )
        assert status == 0
        got, reduced = got + nread, reduced + r
    assert got == reduced == 4 * n
    assert region[:n].min() == 1.0 and not region[n:].any()  # the guard untouched
    rest = a.recv(1 << 20)
    assert len(rest) == 3 * 4 * n  # the surplus stayed in the socket for the framing
    a.close()
    b.close()


@pytest.mark.parametrize(
    "dst_bytes, scratch_bytes, have, budget, why",
    [
        (4096, 1024, 1025, 1 << 20, "have beyond scratch"),
        (1024, 4096, 1028, 1 << 20, "have beyond dst"),
        (4096, 1024, -1, 1 << 20, "negative have"),
        (4098, 1024, 0, 1 << 20, "dst not whole items"),
        (4096, 2, 0, 1 << 20, "scratch shorter than an item"),
        (4096, 1024, 0, 0, "no budget"),
    ],
)
def test_arguments_that_would_leave_the_buffers_are_refused(
    dst_bytes: int, scratch_bytes: int, have: int, budget: int, why: str
) -> None:
    assert recv_reduce is not None
    a, b = socket.socketpair()
    try:
        b.sendall(b"\xff" * 8192)
        dst = bytearray(dst_bytes)
        with pytest.raises(ValueError, match="recv_reduce"):
            recv_reduce(a.fileno(), dst, bytearray(scratch_bytes), have, SUM, F32, budget)
        assert not any(dst), why  # nothing read, nothing combined
    finally:
        a.close()
        b.close()


def test_unknown_kernels_are_refused() -> None:
    assert recv_reduce is not None
    a, b = socket.socketpair()
    try:
        for op, dtype in ((99, F32), (SUM, 99), (-1, F32), (7, F32)):  # 7: AVG is summed
            with pytest.raises(ValueError, match="no kernel"):
                recv_reduce(a.fileno(), bytearray(64), bytearray(64), 0, op, dtype, 64)
    finally:
        a.close()
        b.close()


def test_a_frame_announcing_more_than_expected_is_refused_before_any_is_combined() -> None:
    t0, t1 = _mesh(2)
    try:
        assert recv_reduce is not None
        t0._fold = recv_reduce  # PYCOLLECTIVE_TCP_NATIVE=1's path
        n = 1 << 20
        region = np.zeros(n // 4 + 1024, np.float32)
        dst = memoryview(region[: n // 4].view(np.uint8))
        m = InMessage(1, _data(1, 0, n), dst, sink=lambda p: None, align=4, fold=(SUM, F32))
        big = np.ones(4 * n // 4, np.float32)  # the peer claims and sends 4 MiB
        errs = _both(
            lambda: t0.exchange([], [m], time.monotonic() + 10, 77),
            # The sender's own fate does not matter: it waits on a socket nobody reads.
            lambda: t1.exchange([OutMessage(0, _data(1, 0, 4 * n), memoryview(big))], [],
                                time.monotonic() + 1, 77),
        )  # fmt: skip
        assert isinstance(errs[0], CollectiveError), errs
        assert not region.any()  # nothing of it combined, the guard untouched
    finally:
        t0.close()
        t1.close()
