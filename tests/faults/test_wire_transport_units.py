"""No processes: the frame header (_wire) and TCPTransport's error paths over socketpairs."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycollective import CollectiveTimeout, MismatchError, TransportError
from pycollective.transport import _wire
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport._wire import Header
from pycollective.transport.tcp import MAX_FRAME_BYTES, TCPTransport

GROUP = 7
U8 = st.integers(0, 255)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)


# ---------------------------------------------------------------------- _wire


@given(
    st.sampled_from([_wire.DATA, _wire.P2P, _wire.ABORT, _wire.PROBE]),
    U8,
    U8,
    U8,
    U8,
    U32,
    U64,
    U32,
    I32,
    U64,
    U64,
)
def test_header_round_trips(frame, kind, dtype, op, algo, group, seq, tag, root, count, nbytes):
    h = Header(frame, kind, dtype, op, algo, group, seq, tag, root, count, nbytes)
    packed = h.pack()
    assert len(packed) == _wire.SIZE
    assert _wire.unpack(packed) == h
    assert _wire.unpack(memoryview(bytearray(packed))) == h


def _data(**kw) -> Header:
    fields = dict(
        frame=_wire.DATA,
        kind=_wire.KIND_CODE["all_reduce"],
        dtype=0,
        op=0,
        algo=0,
        group=GROUP,
        seq=1,
        tag=0,
        root=0,
        count=4,
        nbytes=16,
    )
    fields.update(kw)
    return Header(**fields)


@pytest.mark.parametrize(
    "offset,value,message",
    [
        (0, b"XX", "bad magic"),
        (2, bytes([99]), "version"),
        (3, bytes([0]), "frame type"),
        (3, bytes([200]), "frame type"),
    ],
)
def test_unpack_rejects_bad_headers(offset, value, message):
    raw = bytearray(_data().pack())
    raw[offset : offset + len(value)] = value
    with pytest.raises(_wire.FrameError, match=message):
        _wire.unpack(bytes(raw))


def test_frame_error_is_a_value_error():
    assert issubclass(_wire.FrameError, ValueError)


def test_meta_differences_ignores_tags_and_sizes():
    a = _data()
    assert _wire.meta_differences(a, a.with_tag(5, 99)) == []
    b = _data(kind=_wire.KIND_CODE["broadcast"], count=9, op=3)
    assert _wire.meta_differences(a, b) == ["kind", "count", "op"]


def test_describe_names_the_collective_its_op_and_algorithm():

    ring = _wire.ALGO_CODE["ring"]
    text = _data(op=3, algo=ring).describe()
    assert text.startswith("all_reduce(#1") and "op=MAX" in text and "algorithm=ring" in text
    assert "root=" not in text  # an all_reduce has no root: none is shown
    bc = _data(kind=_wire.KIND_CODE["broadcast"], root=2).describe()
    assert "broadcast(" in bc and "root=2" in bc and "op=" not in bc
    p2p = Header(_wire.P2P, 10, 0, 0, 0, GROUP, 0, 3, 0, 0, 8).describe()
    assert "send(tag=3" in p2p and "bytes=8" in p2p


# ---------------------------------------------------------------------- TCPTransport


@pytest.fixture
def pair():
    """Rank 0's transport, and the raw socket standing for rank 1."""
    a, b = socket.socketpair()
    t = TCPTransport(0, 2, {1: a})
    b.settimeout(5)
    yield t, b
    t.close()
    b.close()


@pytest.fixture
def two():
    """Two connected transports (ranks 0 and 1)."""
    a, b = socket.socketpair()
    t0, t1 = TCPTransport(0, 2, {1: a}), TCPTransport(1, 2, {0: b})
    yield t0, t1
    t0.close()
    t1.close()


def _recv(peer: int, header: Header, n: int = 16) -> InMessage:
    return InMessage(peer, header, memoryview(np.zeros(n, np.uint8)))


def _send(peer: int, header: Header, n: int = 16) -> OutMessage:
    return OutMessage(peer, header.with_tag(header.tag, n), memoryview(np.ones(n, np.uint8)))


def _soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.timeout(10)
def test_oversized_frame_is_refused_without_allocating(pair):
    t, raw = pair
    raw.sendall(_data(nbytes=MAX_FRAME_BYTES + 1).pack())
    with pytest.raises(TransportError, match="over the limit") as info:
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)
    assert info.value.peer == 1
    assert 1 in t.lost_peers()
    with pytest.raises(TransportError, match="rank 1"):  # and the peer stays lost
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)


@pytest.mark.timeout(10)
def test_unrequested_data_beyond_the_bound_is_refused(pair):
    t, raw = pair
    t.max_unexpected = 1 << 20
    raw.sendall(_data(seq=9, nbytes=1 << 30).pack())  # a later collective, 1 GiB, unasked
    with pytest.raises(TransportError, match="nobody asked for"):
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)


@pytest.mark.timeout(10)
def test_garbage_bytes_lose_the_connection_with_a_clear_error(pair):
    t, raw = pair
    raw.sendall(b"\x00garbage!" * 10)
    with pytest.raises(TransportError, match="invalid frame") as info:
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)
    assert info.value.peer == 1


@pytest.mark.timeout(10)
def test_peer_hanging_up_names_the_peer(pair):
    t, raw = pair
    raw.close()
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="lost rank 1") as info:
        t.exchange([], [_recv(1, _data())], _soon(30), GROUP)
    assert time.monotonic() - t0 < 2
    assert info.value.peer == 1


@pytest.mark.timeout(10)
def test_timeout_names_the_rank_waited_on(pair):
    t, _raw = pair
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout, match=r"waiting for rank\(s\) \[1\]") as info:
        t.exchange([], [_recv(1, _data())], time.monotonic() + 0.3, GROUP, "all_reduce#1")
    assert 0.25 < time.monotonic() - t0 < 1.5
    assert info.value.waiting_on == (1,)


@pytest.mark.timeout(10)
def test_mismatched_header_raises_naming_both_sides(pair):
    t, raw = pair
    theirs = _data(kind=_wire.KIND_CODE["broadcast"])
    raw.sendall(theirs.pack() + bytes(16))
    with pytest.raises(MismatchError) as info:
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)
    msg = str(info.value)
    assert "rank 0 called all_reduce(" in msg and "rank 1 called broadcast(" in msg


@pytest.mark.timeout(10)
def test_stale_frame_of_an_earlier_collective_is_a_mismatch(pair):
    """Rank 1 sent a frame in collective #1 that rank 0 never asked for (rank 0's #1 only
    sent): at rank 0's next collective it must not sit unread while the ranks go on."""
    t, raw = pair
    bc = _wire.KIND_CODE["broadcast"]
    t.exchange([_send(1, _data(seq=1, kind=bc))], [], _soon(), GROUP)  # our #1: send only
    raw.recv(1 << 16)
    raw.sendall(_data(seq=1, kind=bc, root=1).pack() + bytes(16))  # theirs: another root
    t.check_group(GROUP, 2)  # reads it (into the stash) without waiting
    with pytest.raises(MismatchError, match="root differ"):
        t.exchange([_send(1, _data(seq=2))], [_recv(1, _data(seq=2))], _soon(), GROUP)


@pytest.mark.timeout(10)
def test_stale_frame_is_a_mismatch_even_when_the_next_call_runs_in_the_arena(pair):
    """As above, but rank 0's next collective never touches TCP (the shared-memory arena):
    the check before it must find the frame, naming what each rank called in #1."""
    t, raw = pair
    bc = _wire.KIND_CODE["broadcast"]
    t.exchange([_send(1, _data(seq=1, kind=bc))], [], _soon(), GROUP)  # our #1: send only
    raw.recv(1 << 16)
    raw.sendall(_data(seq=1, kind=bc, root=1).pack() + bytes(16))  # theirs: another root
    deadline = time.monotonic() + 5
    with pytest.raises(MismatchError, match="root differ") as info:
        while time.monotonic() < deadline:  # until the frame has arrived and been read
            t.check_group(GROUP, 2, _data(seq=2))
            time.sleep(0.01)
    assert "root=0" in str(info.value) and "root=1" in str(info.value)


@pytest.mark.timeout(10)
def test_abort_notice_keeps_class_and_culprit_and_waits_for_its_collective(two):
    t0, t1 = two
    t1.abort([0], GROUP, TransportError("rank 1 lost rank 5: gone", peer=5), seq=3)
    # rank 0 is still in #2: the failure is in #3, so #2's own data may still come
    got = np.zeros(16, np.uint8)
    done = threading.Event()

    def rank1_sends_its_part():
        t1.exchange([_send(0, _data(seq=2))], [], _soon(), GROUP)
        done.set()

    th = threading.Thread(target=rank1_sends_its_part)
    th.start()
    t0.exchange([], [InMessage(1, _data(seq=2), memoryview(got))], _soon(), GROUP)
    th.join(5)
    assert (got == 1).all()
    with pytest.raises(TransportError, match="rank 1 failed: rank 1 lost rank 5") as info:
        t0.check_group(GROUP, 3)
    assert info.value.peer == 5
    with pytest.raises(TransportError):  # point-to-point: at once
        t0.exchange(
            [], [_recv(1, Header(_wire.P2P, 10, 0, 0, 0, GROUP, 0, 0, 0, 0, 16))], _soon(), GROUP
        )


@pytest.mark.timeout(10)
def test_ranks_waiting_on_each_other_in_different_collectives_find_out(two):
    """No data flows (each only receives): a PROBE frame reveals the mismatch quickly to
    the rank that gets it, whose abort notice (as ProcessGroup.fail sends) tells the other."""
    t0, t1 = two
    errors = {}

    def run(t, peer, header, rank):
        try:
            t.exchange([], [_recv(peer, header)], _soon(8), GROUP)
        except MismatchError as exc:
            errors[rank] = exc
            t.abort([peer], GROUP, exc, seq=header.seq)

    start = time.monotonic()
    threads = [
        threading.Thread(target=run, args=(t0, 1, _data(), 0)),
        threading.Thread(target=run, args=(t1, 0, _data(kind=_wire.KIND_CODE["gather"]), 1)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert time.monotonic() - start < 3
    assert set(errors) == {0, 1}
    for exc in errors.values():
        assert isinstance(exc, MismatchError), errors
        assert "all_reduce(" in str(exc) and "gather(" in str(exc)


@pytest.mark.timeout(10)
def test_probe_to_a_slow_peer_is_checked_when_it_gets_there(two):
    t0, t1 = two
    with pytest.raises(CollectiveTimeout):  # rank 0 waits 0.8 s: it probes rank 1 once
        t0.exchange([], [_recv(1, _data(seq=4))], time.monotonic() + 0.8, GROUP)
    t1.check_group(GROUP, 3)  # rank 1 reads the probe while not yet in #4
    with pytest.raises(MismatchError, match="count differ"):
        t1.exchange([_send(0, _data(seq=4, count=5))], [], _soon(), GROUP)


@pytest.mark.timeout(10)
def test_interrupt_from_another_thread_ends_the_wait_promptly(pair):
    t, _raw = pair
    threading.Timer(0.2, t.interrupt, args=("destroyed",)).start()
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="destroyed"):
        t.exchange([], [_recv(1, _data())], _soon(30), GROUP)
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(TransportError, match="destroyed"):  # and stays so
        t.exchange([], [_recv(1, _data())], _soon(30), GROUP)


@pytest.mark.timeout(10)
def test_a_peer_that_left_is_only_an_error_for_whoever_still_needs_it(pair):
    """A hang-up alone does not fail the group (the peer may have finished its part and
    exited cleanly); what it sent before leaving is still delivered; waiting on it raises."""
    t, raw = pair
    raw.sendall(_data(seq=2).pack() + bytes(range(16)))
    raw.close()
    time.sleep(0.05)
    t.check_group(GROUP, 2)
    got = _recv(1, _data(seq=2))
    t.exchange([], [got], _soon(), GROUP)
    assert bytes(got.dest) == bytes(range(16))
    with pytest.raises(TransportError, match="rank 1") as info:
        t.exchange([], [_recv(1, _data(seq=3))], _soon(), GROUP)
    assert info.value.peer == 1


def test_closed_transport_refuses_and_close_is_idempotent(pair):
    t, _raw = pair
    t.close()
    t.close()
    with pytest.raises(TransportError, match="closed"):
        t.exchange([], [_recv(1, _data())], _soon(), GROUP)
    with pytest.raises(TransportError, match="closed"):
        t.check_group(GROUP)
