"""The compiled round of a small swap (csrc/swapio.c, TCPTransport.swap with `fold`): our
frame sent, the peer's polled for with the GIL released and reduced into the caller's
buffer, with numpy's bits (the Python kernel, the reference); what it cannot finish (the
peer gone, our frame with more behind it) is left to the regular machinery in its terms;
and the binding refuses lengths, ops and dtypes it cannot honour, saying what it takes.
Ranks are transports over a socket pair in this process."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from tests.transport.test_swap_path import _data_header, _p2p_header, _transports

from pycollective import TransportError
from pycollective._dtypes import BY_NAME
from pycollective._reduce_ops import ReduceOp, fold_codes, kernel
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import transport as tt

_native = pytest.importorskip("pycollective._native")


def _peer_sends_first(t1, h, payload: bytes) -> tuple[threading.Thread, bytearray]:
    """Rank 1's regular exchange of `payload` for rank 0's frame, its frame on the wire
    before rank 0's swap starts (so the round finds it within any budget)."""
    got = bytearray(len(payload))

    def run() -> None:
        t1.exchange([OutMessage(0, h, memoryview(payload))], [InMessage(0, h, memoryview(got))],
                    time.monotonic() + 10, h.group)  # fmt: skip

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.05)
    return th, got


CASES = [
    ("float32", ReduceOp.SUM), ("float32", ReduceOp.MAX), ("float64", ReduceOp.PRODUCT),
    ("float16", ReduceOp.SUM), ("int32", ReduceOp.MIN), ("int64", ReduceOp.BXOR),
    ("uint8", ReduceOp.SUM), ("complex64", ReduceOp.SUM), ("bfloat16", ReduceOp.MAX),
    ("bool", ReduceOp.SUM), ("bool", ReduceOp.PRODUCT),
]  # fmt: skip


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "op"), CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_the_compiled_round_reduces_with_the_python_kernels_bits(name: str, op) -> None:
    dtype = BY_NAME[name]
    codes = fold_codes(int(op), dtype)
    assert codes is not None
    rng = np.random.default_rng(int(op) + dtype.code)
    n = 37  # items: not a multiple of any vector width
    raw = rng.integers(0, 256, (2, n * dtype.itemsize), np.uint8)
    if dtype.kind == "b":
        raw %= 2  # a bool is 0 or 1
    elif dtype.kind in "fc" or dtype.name == "bfloat16":
        raw[:, : 4 * dtype.itemsize] = 0  # and a few zeros
    mine, theirs = raw[0].copy(), raw[1].copy()
    t0, t1, _, _ = _transports()
    h = _data_header(0, mine.nbytes)
    th, got1 = _peer_sends_first(t1, h, theirs.tobytes())
    dst = mine.view(dtype.numpy).copy()
    into = bytearray(mine.nbytes)
    dst_bytes = memoryview(dst).cast("B")
    rc = t0.swap(1, h, memoryview(mine.tobytes()), memoryview(into), False, (dst_bytes, *codes))
    th.join(10)
    assert rc == tt.SWAP_FOLDED
    assert bytes(got1) == mine.tobytes() and bytes(into) == theirs.tobytes()
    want = mine.view(dtype.numpy).copy()
    kernel(op, dtype)(want, theirs.view(dtype.numpy))
    assert dst.tobytes() == want.tobytes()  # bit for bit, NaN payloads included
    assert t0.swap_ready(1, _data_header(1, mine.nbytes))  # nothing left behind
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_our_frame_with_more_behind_it_lands_and_the_rest_is_read_in_order() -> None:
    t0, t1, _, _ = _transports()
    deadline = time.monotonic() + 10
    h, p2p = _data_header(0, 8), _p2p_header(5, 4)
    for hh, payload in ((h, b"12345678"), (p2p, b"abcd")):
        t1.exchange([OutMessage(0, hh, memoryview(payload))], [], deadline, hh.group)
    time.sleep(0.05)
    got = bytearray(8)
    dst = np.zeros(2, np.float32)
    fold = (memoryview(dst).cast("B"), int(ReduceOp.SUM), 2)
    assert t0.swap(1, h, memoryview(b"ABCDEFGH"), memoryview(got), False, fold) == tt.SWAP_PENDING
    t0.swap_finish(deadline)
    assert bytes(got) == b"12345678"  # in `into`: the caller reduces (not folded)
    assert not dst.any()
    into = bytearray(4)
    t0.exchange([], [InMessage(1, p2p, memoryview(into))], deadline, 0)
    assert bytes(into) == b"abcd"
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_peer_gone_during_the_round_is_named_by_the_regular_way(compiled: bool) -> None:
    t0, t1, _, b = _transports(compiled)
    b.close()  # rank 1's end: rank 0's read finds the connection closed
    h = _data_header(0, 8)
    assert t0.swap(1, h, memoryview(b"ABCDEFGH"), memoryview(bytearray(8))) == tt.SWAP_PENDING
    start = time.monotonic()
    with pytest.raises(TransportError, match="rank 1") as err:
        t0.swap_finish(time.monotonic() + 10)
    assert time.monotonic() - start < 2
    assert "closed" in str(err.value) or "reset" in str(err.value) or "pipe" in str(err.value)
    t0.close()
    t1.close()


def test_the_binding_refuses_what_it_cannot_honour() -> None:
    import socket

    a, b = socket.socketpair()
    head, payload, rbuf, into = b"h" * 44, b"p" * 8, bytearray(64), bytearray(8)
    dst = bytearray(8)
    r = _native.swap_round
    with pytest.raises(ValueError, match="into"):
        r(a.fileno(), head, payload, rbuf, 0.0, bytearray(4), None, 0, 0)
    with pytest.raises(ValueError, match="rbuf"):
        r(a.fileno(), head, payload, bytearray(40), 0.0, into, None, 0, 0)
    with pytest.raises(ValueError, match="dst"):
        r(a.fileno(), head, payload, rbuf, 0.0, into, bytearray(4), 0, 2)
    with pytest.raises(ValueError, match="whole number of 8-byte items"):
        r(a.fileno(), head, b"p" * 12, rbuf, 0.0, bytearray(12), bytearray(12), 0, 3)
    with pytest.raises(ValueError, match="no kernel for op 7"):  # AVG: divided after the call
        r(a.fileno(), head, payload, rbuf, 0.0, into, dst, int(ReduceOp.AVG), 2)
    with pytest.raises(ValueError, match="no kernel for op 0 on dtype code 999"):
        r(a.fileno(), head, payload, rbuf, 0.0, into, dst, 0, 999)
    with pytest.raises(ValueError, match="spin of 0 to 1 seconds"):
        r(a.fileno(), head, payload, rbuf, 5.0, into, None, 0, 0)
    with pytest.raises(ValueError, match="writable"):
        r(a.fileno(), head, payload, bytes(64), 0.0, into, None, 0, 0)
    with pytest.raises(TypeError, match="swap_round"):
        r(a.fileno(), head)
    # nothing came: one read, nothing landed, and our frame went whole
    assert r(a.fileno(), head, payload, rbuf, 0.0, into, None, 0, 0) == (52, 0, 0, 0, 0, 0)
    assert b.recv(64) == head + payload
    a.close()
    b.close()
