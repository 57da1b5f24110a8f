"""The scheduled runner's path of repeated calls over TCP (runners/swap.py,
TCPTransport.swap): a small all_reduce between two ranks like one that ran before is one
sendmsg and one recv_into. Real jobs over loopback (the worker of the compiled arena's
path, tests/native/_fast_worker.py, with PYCOLLECTIVE_TRANSPORT=tcp): results equal the
regular path's bit for bit (FAST_TEST_OFF), other frames between calls (point-to-point,
probes, other collectives) are read in order, and a mismatch, a killed peer or a timeout
raise on every rank as on the regular path."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from tests._launch import REPO, describe, run_ranks, tagged, within

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


@pytest.mark.timeout(120)
def test_the_python_round_gives_the_compiled_rounds_bits() -> None:
    """PYCOLLECTIVE_NATIVE=0: a small swap's round in the Python loop (the reference)
    instead of the compiled core's, every dtype and op of the "bits" job alike."""
    compiled = _job("bits")
    python = _job("bits", env={"PYCOLLECTIVE_NATIVE": "0"})
    for c, p in zip(compiled, python, strict=True):
        assert c.returncode == 0 and p.returncode == 0, (describe(c), describe(p))
        assert tagged(c, "DIGEST") == tagged(p, "DIGEST"), (describe(c), describe(p))
        (fc,), (fp,) = tagged(c, "FAST"), tagged(p, "FAST")
        assert fc["calls"] > 10 and fp["calls"] > 10, (fc, fp)
        # the compiled round reduced most calls itself; the Python round none
        assert fc["folded"] > 10 and fp["folded"] == 0, (fc, fp)
        # and most calls ran in C from the API function on (csrc/swappath.c); without the
        # compiled core, SwapFast alone (runners/swap.py)
        assert fc["compiled"] > 10 and "compiled" not in fp, (fc, fp)


@pytest.mark.timeout(120)
def test_repeated_large_calls_read_straight_into_place_with_the_regular_paths_bits() -> None:
    """all_reduce of 1.2 MiB (over the read buffer: the payload is read into the swap's
    destination, the send's rest written in between), SUM, MAX and AVG taking turns
    (AVG is never a swap: its division follows the call)."""
    fast = _job("large")
    regular = _job("large", env=OFF)
    for f, p in zip(fast, regular, strict=True):
        assert f.returncode == 0 and p.returncode == 0, (describe(f), describe(p))
        assert tagged(f, "DIGEST") == tagged(p, "DIGEST"), (describe(f), describe(p))
        # SUM and MAX seven times each after their first call (24 calls, the three ops
        # taking turns; halfway the arena's single copy is asked for, which TCP has not),
        # twice more on a new array: 16 at most. A call that finds the peer's frame already
        # in its read buffer, or its own last send not yet out, takes the regular path
        # (swap_ready: timing decides), so a loaded machine may see a few fewer.
        assert 12 <= tagged(f, "FAST")[0]["calls"] <= 16, describe(f)
        assert tagged(p, "FAST") == [None], describe(p)


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
        # the first call ran the regular path; of the other four, one whose peer's frame
        # came early (in the read buffer already) may too: swap_ready, timing
        assert 3 <= before["calls"] <= 4, describe(r)
        # Rank 0's call is a repeated signature: its swap path either started it and handed
        # it to Python on the peer's mismatched frame, or declined it (the frame was already
        # there, which timing decides); rank 1's call is another signature: the regular path.
        assert after["handed"] - before["handed"] in ((0, 1) if r.rank == 0 else (0,)), describe(r)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("collective", ["all_reduce", "all_reduce_large"])
def test_a_peer_killed_while_the_other_waits_in_a_repeated_call_is_named_at_once(
    collective: str,
) -> None:
    results = _job("kill", "1", collective, env={"PYCOLLECTIVE_TIMEOUT": "60"})
    killed_at = tagged(results[1], "RESULT")[0]["at"]
    assert results[1].returncode == -9, describe(results[1])
    r = results[0]
    (call,) = tagged(r, "RESULT")
    assert call["error"] == "TransportError" and "rank 1" in call["msg"], describe(r)
    assert call["at"] - killed_at < within(0.5), (call["at"] - killed_at, describe(r))
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


def _transports(compiled: bool = True):
    """Two transports over a socket pair; `compiled`: a small swap's round runs in the
    compiled core (csrc/swapio.c), else in the Python loop (the reference)."""
    import socket  # noqa: PLC0415

    from pycollective.transport.tcp import TCPTransport  # noqa: PLC0415

    a, b = socket.socketpair()
    t0, t1 = TCPTransport(0, 2, {1: a}), TCPTransport(1, 2, {0: b})
    for t in (t0, t1):
        assert (t._round is not None) or not compiled, "the compiled core is not built"
        if not compiled:
            t._round = None
    return t0, t1, a, b


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
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_partial_send_goes_on_the_regular_way(compiled: bool) -> None:
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, a, b = _transports(compiled)
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
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_frames_before_and_behind_the_expected_one_are_read_in_order(compiled: bool) -> None:
    import time  # noqa: PLC0415

    from pycollective.transport._base import InMessage, OutMessage  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports(compiled)
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
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_swap_declines_what_it_does_not_expect_untouched(compiled: bool) -> None:
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports(compiled)
    h = _data_header(0, 8)
    assert t0.swap(1, h, memoryview(b"x" * 4), memoryview(bytearray(8))) == tt.SWAP_DECLINED
    t0.interrupt("stop")
    assert not t0.swap_ready(1, h)
    assert t0.swap(1, h, memoryview(b"x" * 8), memoryview(bytearray(8))) == tt.SWAP_DECLINED
    t0.close()
    t1.close()


# ------------------------------------------------ a swap larger than the read buffer
# (its header read into the read buffer, its payload straight into the destination)

LARGE_SWAP = 200_000  # over the 64 KiB read buffer, under the socket pair's buffers


def _pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(256)) * (n // 256) + bytes(n % 256)


def _drain(sock, n: int, into: bytearray) -> threading.Thread:
    """A thread reading `n` bytes of `sock` into `into` (the other side's whole frame)."""

    def run() -> None:
        got = 0
        view = memoryview(into)
        while got < n:
            try:
                k = sock.recv_into(view[got:])
            except OSError:  # the test closed it
                return
            if not k:
                return
            got += k

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.timeout(30)
def test_two_large_swaps_meet_whole() -> None:
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports()
    n = 1 << 20  # more than the socket pair's buffers: both sends go on during the reads
    h = _data_header(0, n)
    mine, theirs = _pattern(n, 1), _pattern(n, 2)
    got0, got1 = bytearray(n), bytearray(n)

    def side(t, payload: bytes, into: bytearray) -> None:
        if t.swap(1 - t.rank, h, memoryview(payload), memoryview(into)) != tt.SWAP_DONE:
            t.swap_finish(time.monotonic() + 10)

    peer = threading.Thread(target=side, args=(t1, theirs, got1))
    peer.start()
    side(t0, mine, got0)
    peer.join()
    assert bytes(got0) == theirs and bytes(got1) == mine
    for t in (t0, t1):
        assert t.swap_ready(1 - t.rank, _data_header(1, n))  # nothing left behind
        t.close()


@pytest.mark.timeout(30)
def test_a_64_kib_swap_takes_the_compiled_round_whole() -> None:
    """The read buffer holds a 64 KiB payload and its header: the compiled round sends,
    reads and reduces it (SWAP_FOLDED), not the large swap's Python loop."""
    import numpy as np  # noqa: PLC0415

    from pycollective._dtypes import BY_NAME  # noqa: PLC0415
    from pycollective._reduce_ops import ReduceOp, fold_codes  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, _ = _transports()
    for t in (t0, t1):
        t._spin = 1.0  # the polling budget (its most): the other side's thread may start late
    n = 64 << 10
    h = _data_header(0, n)
    codes = fold_codes(ReduceOp.SUM, BY_NAME["float32"])
    xs = [np.arange(n // 4, dtype=np.float32) * (k + 1) for k in range(2)]
    sent = [x.copy() for x in xs]
    results: list[int] = [-1, -1]

    def side(t, k: int) -> None:
        raw = memoryview(xs[k]).cast("B")
        results[k] = t.swap(1 - k, h, memoryview(sent[k]).cast("B"), memoryview(bytearray(n)),
                            False, (raw, *codes))  # fmt: skip
        if results[k] == tt.SWAP_PENDING:
            t.swap_finish(time.monotonic() + 10)

    peer = threading.Thread(target=side, args=(t1, 1))
    peer.start()
    side(t0, 0)
    peer.join()
    assert results == [tt.SWAP_FOLDED, tt.SWAP_FOLDED], results
    want = np.arange(n // 4, dtype=np.float32) * 3
    assert np.array_equal(xs[0], want) and np.array_equal(xs[1], want)
    for t in (t0, t1):
        assert t.swap_ready(1 - t.rank, _data_header(1, n))  # nothing left behind
        t.close()


@pytest.mark.timeout(30)
def test_a_large_swap_part_way_in_is_read_on_the_regular_way() -> None:
    from pycollective.transport import _wire  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, b = _transports()
    b.setblocking(True)  # rank 1's side written and read raw here
    n, half = LARGE_SWAP, LARGE_SWAP // 2
    h = _data_header(0, n)
    theirs = _pattern(n, 3)
    frame = h.pack() + theirs
    b.sendall(frame[: _wire.SIZE + half])  # the header and half the payload, then a pause
    seen = bytearray(_wire.SIZE + n)
    reader = _drain(b, len(seen), seen)
    got = bytearray(n)
    assert t0.swap(1, h, memoryview(_pattern(n, 4)), memoryview(got)) == tt.SWAP_PENDING
    conn = t0._conns[1]
    assert conn.cur == h and conn.got == half  # the connection's current read, part way
    threading.Timer(0.2, b.sendall, (frame[_wire.SIZE + half :],)).start()
    t0.swap_finish(time.monotonic() + 10)
    reader.join()
    assert bytes(got) == theirs and bytes(seen) == h.pack() + _pattern(n, 4)
    assert t0.swap_ready(1, _data_header(1, n))
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_peer_lost_in_the_middle_of_a_large_swap_is_named() -> None:
    from pycollective._errors import TransportError  # noqa: PLC0415
    from pycollective.transport import _wire  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, b = _transports()
    b.setblocking(True)  # rank 1's side written and read raw here
    n = LARGE_SWAP
    h = _data_header(0, n)
    b.sendall((h.pack() + _pattern(n, 5))[: _wire.SIZE + n // 3])
    seen = bytearray(_wire.SIZE + n)
    reader = _drain(b, len(seen), seen)
    got = bytearray(n)
    assert t0.swap(1, h, memoryview(_pattern(n, 6)), memoryview(got)) == tt.SWAP_PENDING
    b.shutdown(socket.SHUT_RDWR)  # the peer goes, a third of its payload sent
    reader.join()
    b.close()
    started = time.monotonic()
    with pytest.raises(TransportError, match="rank 1") as err:
        t0.swap_finish(time.monotonic() + 10)
    assert "closed by peer" in str(err.value)
    assert time.monotonic() - started < 5
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_large_swap_behind_another_frame_reads_both_in_order() -> None:
    from pycollective.transport._base import InMessage  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, b = _transports()
    b.setblocking(True)  # rank 1's side written and read raw here
    n = LARGE_SWAP
    h, p2p = _data_header(0, n), _p2p_header(5, 4)
    theirs = _pattern(n, 7)
    b.sendall(p2p.pack() + b"abcd")  # a point-to-point message comes first
    writer = threading.Thread(target=b.sendall, args=(h.pack() + theirs,))
    writer.start()
    seen = bytearray(len(h.pack()) + n)
    reader = _drain(b, len(seen), seen)
    got = bytearray(n)
    assert t0.swap(1, h, memoryview(_pattern(n, 8)), memoryview(got)) == tt.SWAP_PENDING
    deadline = time.monotonic() + 10
    t0.swap_finish(deadline)
    writer.join()
    reader.join()
    assert bytes(got) == theirs
    into = bytearray(4)
    t0.exchange([], [InMessage(1, p2p, memoryview(into))], deadline, 0)
    assert bytes(into) == b"abcd"
    t0.close()
    t1.close()


@pytest.mark.timeout(30)
def test_a_large_frame_come_early_is_taken_from_where_it_was_kept() -> None:
    from pycollective.transport._base import InMessage  # noqa: PLC0415
    from pycollective.transport.tcp import transport as tt  # noqa: PLC0415

    t0, t1, _, b = _transports()
    b.setblocking(True)  # rank 1's side written and read raw here
    n = LARGE_SWAP
    h = _data_header(0, n)
    theirs = _pattern(n, 9)
    writer = threading.Thread(target=b.sendall, args=(h.pack() + theirs,))
    writer.start()
    deadline = time.monotonic() + 10
    while not t0._unexpected and time.monotonic() < deadline:
        t0.check_group(77)  # reads it: kept early, whole
    writer.join()
    b.setblocking(False)  # rank 1's transport reads the rest
    assert t0.swap_ready(1, h)
    got1 = bytearray(n)
    peer = threading.Thread(
        target=t1.exchange, args=([], [InMessage(0, h, memoryview(got1))], deadline, 77)
    )
    peer.start()
    got = bytearray(n)
    if t0.swap(1, h, memoryview(_pattern(n, 10)), memoryview(got)) != tt.SWAP_DONE:
        t0.swap_finish(deadline)  # (its send may not have gone at once)
    peer.join()
    assert bytes(got) == theirs and bytes(got1) == _pattern(n, 10)
    t0.close()
    t1.close()


# ------------------------------------------------ plans of steps (runners/swap.py)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_ring_of_two_is_two_swaps_the_second_in_place(rank: int) -> None:
    import numpy as np  # noqa: PLC0415

    from pycollective.runners import swap  # noqa: PLC0415
    from pycollective.runners.executor import make_plan  # noqa: PLC0415
    from pycollective.schedule import build  # noqa: PLC0415

    data = np.zeros(10, np.float32)
    plan = swap.swap_plan(
        make_plan(build("all_reduce", "ring", rank, 2, 10)), {"data": data}, (5, 9)
    )
    assert plan is not None and plan.peer == (9, 5)[rank]
    (t0, s0lo, s0hi, r0lo, r0hi, red0), (t1, s1lo, s1hi, r1lo, r1hi, red1) = plan.steps
    assert red0 and not red1 and t0 != t1
    # reduce-scatter: send the peer's half, combine ours; all-gather: send ours, take theirs
    theirs, ours = (s0lo, s0hi), (r0lo, r0hi)
    assert {theirs, ours} == {(0, 20), (20, 40)}
    assert (s1lo, s1hi) == ours and (r1lo, r1hi) == theirs
    one = swap.swap_plan(
        make_plan(build("all_reduce", "recursive_doubling", rank, 2, 10)), {"data": data}, (5, 9)
    )
    assert one is not None and len(one.steps) == 1 and one.steps[0][1:] == (0, 40, 0, 40, True)


@pytest.mark.parametrize(
    "algorithm,nprocs,count", [("ring", 2, 9), ("ring", 3, 12), ("tree", 2, 8)]
)
def test_what_is_not_equal_swaps_with_one_peer_has_no_swap_plan(
    algorithm: str, nprocs: int, count: int
) -> None:
    import numpy as np  # noqa: PLC0415

    from pycollective.runners import swap  # noqa: PLC0415
    from pycollective.runners.executor import make_plan  # noqa: PLC0415
    from pycollective.schedule import build  # noqa: PLC0415

    # (9 items: halves of 4 and 5, whose headers would differ; 3 ranks: two peers; a
    # tree: a send one way, then a receive)
    plan = make_plan(build("all_reduce", algorithm, 0, nprocs, count))
    data = np.zeros(count, np.float32)
    assert swap.swap_plan(plan, {"data": data}, tuple(range(nprocs))) is None


RING = {"PYCOLLECTIVE_ALL_REDUCE_ALGORITHM": "ring"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["bits", "mixed"])
def test_repeated_calls_of_two_swaps_give_the_regular_paths_bits(scenario: str) -> None:
    """The ring at p=2: a reduce-scatter swap, then an all-gather swap received in place;
    `mixed` hands calls over part way (a late rank, frames between calls)."""
    fast = _job(scenario, env=RING)
    regular = _job(scenario, env={**OFF, **RING})
    for f, p in zip(fast, regular, strict=True):
        assert f.returncode == 0 and p.returncode == 0, (describe(f), describe(p))
        assert tagged(f, "DIGEST") == tagged(p, "DIGEST"), (describe(f), describe(p))
        assert tagged(f, "FAST")[0]["calls"] > 10, describe(f)
    if scenario == "mixed":  # the late rank's partner waited past the budget: handed over
        assert sum(tagged(r, "FAST")[0]["handed"] for r in fast) >= 2, describe(fast[0])


@pytest.mark.timeout(60)
def test_a_peer_killed_during_repeated_calls_of_two_swaps_is_named_at_once() -> None:
    results = _job("kill", "1", env={**RING, "PYCOLLECTIVE_TIMEOUT": "60"})
    killed_at = tagged(results[1], "RESULT")[0]["at"]
    r = results[0]
    (call,) = tagged(r, "RESULT")
    assert call["error"] == "TransportError" and "rank 1" in call["msg"], describe(r)
    assert call["at"] - killed_at < within(0.5), (call["at"] - killed_at, describe(r))
    before, after = tagged(r, "FAST")
    assert after["handed"] == before["handed"] + 1, describe(r)


@pytest.mark.parametrize(
    "count,world,same_host,ring",
    [
        (1 << 18, 2, True, True),  # 1 MiB of float32: the ring's two swaps
        (1 << 20, 2, True, True),  # 4 MiB: still repeated as swaps (2 MiB halves)
        (1 << 17, 2, False, True),  # 512 KiB, the peer on another host: the ring
        (1 << 17, 2, True, False),  # 512 KiB, the peer on this host: one swap
        (1 << 17, 2, None, True),  # a transport that cannot tell: as another host
        (1 << 18 | 1, 2, True, False),  # halves unequal: no swaps; the cost model's choice
        (1 << 16, 2, False, False),  # 256 KiB: one swap of the whole
        (1 << 18, 3, True, False),  # the transport has another peer: no swaps
    ],
)
def test_two_ranks_that_swap_take_the_ring_from_half_a_mebibyte_across_hosts(
    count: int, world: int, same_host: bool | None, ring: bool
) -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from pycollective import _dtypes  # noqa: PLC0415
    from pycollective.runners._base import Spec  # noqa: PLC0415
    from pycollective.runners.scheduled import ScheduledRunner  # noqa: PLC0415
    from pycollective.tuning.params import Tuning  # noqa: PLC0415

    asked: list[int] = []
    transport = SimpleNamespace(size=world, swap=None)
    if same_host is not None:
        transport.same_host = lambda peer: asked.append(peer) or same_host
    members = SimpleNamespace(
        size=2, ranks=(3, 8), me=1, transport=transport, tuning=Tuning(), transport_name="tcp"
    )
    runner = ScheduledRunner(members)  # type: ignore[arg-type]
    spec = Spec("all_reduce", count, _dtypes.BY_NAME["float32"], 0, 0)
    chosen = runner.choose(spec)
    if ring:
        assert chosen == "ring"
    else:  # the cost model's choice (the regular path's price of a round)
        assert chosen == ("ring" if count * 4 >= 4 << 20 else "recursive_doubling")
    # asked about the one peer, by its global rank, wherever two ranks swap
    consulted = same_host is not None and world == 2 and count % 2 == 0
    assert asked == ([3] if consulted else []), asked


def test_a_loopback_connection_is_to_the_same_host(pair) -> None:
    t0, t1 = pair
    assert t0.same_host(1) and t1.same_host(0)
    t0._conns[1].sock.close()  # read when it was made: closing it changes nothing
    assert t0.same_host(1)
    assert not t0.same_host(7)  # no such peer


def test_a_connection_that_is_not_over_ip_is_not_the_same_host() -> None:
    t0, t1, _, _ = _transports()  # a Unix socket pair: no addresses to judge by
    assert not t0.same_host(1) and not t1.same_host(0)
    t0.close()
    t1.close()
