"""The scheduled runner's path of repeated calls over TCP (runners/swap.py,
TCPTransport.swap): a small all_reduce between two ranks like one that ran before is one
sendmsg and one recv_into. Real jobs over loopback (the worker of the compiled arena's
path, tests/native/_fast_worker.py, with PYCOLLECTIVE_TRANSPORT=tcp): results equal the
regular path's bit for bit (FAST_TEST_OFF), other frames between calls (point-to-point,
probes, other collectives) are read in order, and a mismatch, a killed peer or a timeout
raise on every rank as on the regular path."""

from __future__ import annotations

import pytest
from tests._launch import REPO, describe, run_ranks, tagged

WORKER = REPO / "tests" / "native" / "_fast_worker.py"
OFF = {"FAST_TEST_OFF": "1"}


def _job(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return run_ranks(
        WORKER, 2, args, timeout=timeout, env={"PYCOLLECTIVE_TRANSPORT": "tcp", **(env or {})}
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["bits", "mixed", "threads"])
def test_repeated_calls_give_the_regular_paths_bits(scenario: str) -> None:
    fast = _job(scenario)
    regular = _job(scenario, env=OFF)
    for r in fast + regular:
        assert r.returncode == 0, describe(r)
    # rank by rank: recursive doubling reduces in another order on each rank (complex
    # products, NaN payloads may differ between ranks, as on the regular path)
    for f, p in zip(fast, regular, strict=True):
        assert tagged(f, "DIGEST") == tagged(p, "DIGEST"), (describe(f), describe(p))
    for r in fast:
        (counts,) = tagged(r, "FAST")
        # (in "threads" most calls queue behind asynchronous ones: the engine runs them)
        assert counts is not None and counts["calls"] > (0 if scenario == "threads" else 10)
    for r in regular:
        assert tagged(r, "FAST") == [None], describe(r)
    if scenario == "bits":
        assert tagged(fast[0], "REFUSED") == tagged(regular[0], "REFUSED")
    if scenario == "mixed":  # the late rank's partner waited past the budget: handed over
        assert sum(tagged(r, "FAST")[0]["handed"] for r in fast) >= 2, describe(fast[0])


@pytest.mark.timeout(60)
def test_the_flight_recorder_shows_repeated_calls_as_regular_ones() -> None:
    fast = _job("flight")
    regular = _job("flight", env=OFF)
    for f, p in zip(fast, regular, strict=True):
        assert f.returncode == 0 and p.returncode == 0, (describe(f), describe(p))
        (ff,), (fp,) = tagged(f, "FLIGHT"), tagged(p, "FLIGHT")
        assert ff["times_ok"] and ff == fp, (ff, fp)
        seqs = [e["seq"] for e in ff["entries"]]
        assert seqs == list(range(seqs[0], seqs[0] + 30))
        assert tagged(f, "FAST")[0]["calls"] >= 9, describe(f)


@pytest.mark.timeout(60)
def test_a_count_mismatch_after_repeated_calls_raises_on_both_ranks() -> None:
    for r in _job("mismatch", "count", env={"PYCOLLECTIVE_TIMEOUT": "20"}):
        (call,) = tagged(r, "RESULT")
        assert call["error"] == "MismatchError", describe(r)
        assert "count differ" in call["msg"] and "#6" in call["msg"], describe(r)
        assert call["elapsed"] < 5.0, describe(r)
        before, after = tagged(r, "FAST")
        assert before["calls"] == 4, describe(r)  # the first call ran the regular path
        # Rank 0's call is a repeated signature: its swap path either started it and handed
        # it to Python on the peer's mismatched frame, or declined it (the frame was already
        # there, which timing decides); rank 1's call is another signature: the regular path.
        assert after["handed"] - before["handed"] in ((0, 1) if r.rank == 0 else (0,)), describe(r)


@pytest.mark.timeout(60)
def test_a_peer_killed_while_the_other_waits_in_a_repeated_call_is_named_at_once() -> None:
    results = _job("kill", "1", env={"PYCOLLECTIVE_TIMEOUT": "60"})
    killed_at = tagged(results[1], "RESULT")[0]["at"]
    assert results[1].returncode == -9, describe(results[1])
    r = results[0]
    (call,) = tagged(r, "RESULT")
    assert call["error"] == "TransportError" and "rank 1" in call["msg"], describe(r)
    assert call["at"] - killed_at < 0.1, (call["at"] - killed_at, describe(r))
    before, after = tagged(r, "FAST")
    assert after["handed"] == before["handed"] + 1, describe(r)  # it was a repeated call


@pytest.mark.timeout(60)
def test_a_timeout_in_a_repeated_call_names_the_rank_waited_on() -> None:
    timeout = 1.5
    results = _job("never", env={"PYCOLLECTIVE_TIMEOUT": str(timeout)})
    r = results[0]
    (call,) = tagged(r, "RESULT")
    assert call["error"] == "CollectiveTimeout", describe(r)
    assert call["waiting_on"] == [1] and "rank(s) [1]" in call["msg"], describe(r)
    assert timeout - 0.1 < call["elapsed"] < timeout + 1.0, describe(r)
    before, after = tagged(r, "FAST")
    assert after["handed"] == before["handed"] + 1, describe(r)


# ---------------------------------------------------------------- TCPTransport.swap alone


def _transports():
    import socket  # noqa: PLC0415

    from pycollective.transport.tcp import TCPTransport  # noqa: PLC0415

    a, b = socket.socketpair()
    return TCPTransport(0, 2, {1: a}), TCPTransport(1, 2, {0: b}), a, b


def _data_header(seq: int, nbytes: int):
    from pycollective.transport import _wire  # noqa: PLC0415
    from pycollective.transport._wire import Header  # noqa: PLC0415

    return Header(_wire.DATA, 1, 1, 0, 9, 77, seq, 0, 0, nbytes // 4, nbytes)


def _p2p_header(tag: int, nbytes: int):
    from pycollective.transport import _wire  # noqa: PLC0415
    from pycollective.transport._wire import Header  # noqa: PLC0415

    return Header(_wire.P2P, 10, 1, 0, 7, 0, 0, tag, 0, nbytes // 4, nbytes)


def _regular(t, h, payload: bytes, into: bytearray, deadline: float) -> None:
    from pycollective.transport._base import InMessage, OutMessage  # noqa: PLC0415

    t.exchange([OutMessage(1 - t.rank, h, memoryview(payload))],
               [InMessage(1 - t.rank, h, memoryview(into))], deadline, h.group)  # fmt: skip


@pytest.mark.timeout(30)
def test_a_partial_send_goes_on_the_regular_way() -> None:
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, a, b = _transports()
    for s in (a, b):  # small socket buffers: 16 KiB does not fit at once
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    n = 16 * 1024
    h = _data_header(3, n)
    mine, theirs = bytes(range(256)) * (n // 256), bytes(reversed(range(256))) * (n // 256)
    got0, got1 = bytearray(n), bytearray(n)
    assert t0.swap_ready(1, h)
    assert t0.swap(1, h, memoryview(mine), memoryview(got0)) == tt.SWAP_PENDING
    assert t0._conns[1].outq and t0._conns[1].out_sent < n  # the rest of it is queued
    peer = threading.Thread(target=_regular, args=(t1, h, theirs, got1, time.monotonic() + 10))
    peer.start()
    t0.swap_finish(time.monotonic() + 10)
    peer.join()
    assert bytes(got0) == theirs and bytes(got1) == mine
    assert t0.swap_ready(1, _data_header(4, n))  # all in the regular state again
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_frames_before_and_behind_the_expected_one_are_read_in_order() -> None:
    import time  # noqa: PLC0415

    from pycollective.transport._base import InMessage, OutMessage  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports()
    deadline = time.monotonic() + 10
    p2p = _p2p_header(5, 4)
    # rank 1: a point-to-point message, then its data, then another message right behind
    for h, payload in ((p2p, b"abcd"), (_data_header(0, 8), b"12345678"), (p2p, b"efgh")):
        t1.exchange([OutMessage(0, h, memoryview(payload))], [], deadline, h.group)
    time.sleep(0.05)
    got = bytearray(8)
    h = _data_header(0, 8)
    assert t0.swap(1, h, memoryview(b"ABCDEFGH"), memoryview(got)) == tt.SWAP_PENDING
    t0.swap_finish(deadline)
    assert bytes(got) == b"12345678"
    for want in (b"abcd", b"efgh"):
        into = bytearray(4)
        t0.exchange([], [InMessage(1, p2p, memoryview(into))], deadline, 0)
        assert bytes(into) == want
    # the peer's frame for the next call, come early, is taken from where it was kept
    t1.exchange([OutMessage(0, _data_header(1, 8), memoryview(b"87654321"))], [], deadline, 77)
    time.sleep(0.05)
    t0.check_group(77)  # reads it: kept early
    h = _data_header(1, 8)
    assert t0.swap_ready(1, h)
    assert t0.swap(1, h, memoryview(b"ABCDEFGH"), memoryview(got)) == tt.SWAP_DONE
    assert bytes(got) == b"87654321"
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_swap_declines_what_it_does_not_expect_untouched() -> None:
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports()
    h = _data_header(0, 8)
    assert t0.swap(1, h, memoryview(b"x" * 4), memoryview(bytearray(8))) == tt.SWAP_DECLINED
    t0.interrupt("stop")
    assert not t0.swap_ready(1, h)
    assert t0.swap(1, h, memoryview(b"x" * 8), memoryview(bytearray(8))) == tt.SWAP_DECLINED
    t0.close()
    t1.close()
