"""The compiled read-and-reduce of a TCP reduction's payload (transport/tcp/folding.py,
csrc/sockio.c) against the Python reference (the window and the sink, numpy's kernel):
the same bits for every dtype and op it takes, whatever the reads' sizes (items split
between reads), including bytes read before it takes over; a peer lost or stalled
mid-payload raises as on the Python path. Ranks are threads of this process over
loopback; recv_reduce itself on a socket pair."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from tests._launch import REPO, assert_all_ok, run_ranks, steps_of
from tests.transport.test_conformance import _both, _data

from pycollective import CollectiveTimeout, TransportError
from pycollective._dtypes import BY_CODE, BY_NAME
from pycollective._errors import UsageError
from pycollective._reduce_ops import ReduceOp, check_op_dtype, fold_codes, kernel
from pycollective.transport._base import InMessage, OutMessage
from pycollective.transport.tcp import folding

recv_reduce = folding.compiled()  # None would fail the tests: `make setup` builds it


def _cases() -> list[tuple[str, ReduceOp]]:
    out = []
    for name, dt in sorted((d.name, d) for d in BY_CODE.values() if d.name != "byte"):
        for op in ReduceOp:
            try:
                check_op_dtype(op, dt)
            except Exception:  # noqa: BLE001 - op undefined on the dtype
                continue
            out.append((name, op))
    return out


def _values(name: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = BY_NAME[name]
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(np.bool_)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt.numpy)
    if dt.kind == "f":
        if name == "bfloat16":
            return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(
                np.uint16
            )
        v = rng.standard_normal(n).astype(dt.numpy)
        v[::97] = np.nan  # NaNs through min/max
        return v
    info = np.iinfo(dt.numpy)
    return rng.integers(max(info.min, -(1 << 20)), min(info.max, 1 << 20), n, dt.numpy)


def _receive(t0, t1, dst: np.ndarray, src: np.ndarray, fold, k) -> int:
    """t1 sends src; t0 combines it into dst through a sink (and `fold`); the number of
    bytes the sink was handed."""
    handed = [0]
    done = [0]

    def sink(piece: memoryview) -> None:
        a = np.frombuffer(piece, dtype=dst.dtype)
        k(dst[done[0] : done[0] + a.size], a)
        done[0] += a.size
        handed[0] += piece.nbytes

    raw = memoryview(dst.view(np.uint8))
    h = _data(1, 0, raw.nbytes)
    m = InMessage(1, h, raw, sink=sink, align=dst.itemsize, fold=fold)
    errs = _both(
        lambda: t0.exchange([], [m], time.monotonic() + 20, 77),
        lambda: t1.exchange([OutMessage(0, h, memoryview(src.view(np.uint8)))], [],
                            time.monotonic() + 20, 77),
    )  # fmt: skip
    assert errs == [None, None]
    return handed[0]


@pytest.mark.timeout(120)
def test_every_dtype_and_op_gives_the_python_paths_bits(pair) -> None:
    t0, t1 = pair
    assert recv_reduce is not None
    n_bytes = (3 << 20) + 24  # a short last piece; several reads
    compared = 0
    for name, op in _cases():
        dt = BY_NAME[name]
        fold = fold_codes(op, dt)
        if fold is None:
            continue
        n = n_bytes // dt.itemsize
        base, src = _values(name, n, 1), _values(name, n, 2)
        k = kernel(op, dt)
        results = []
        for native in (True, False):
            t0._fold = recv_reduce if native else None
            dst = base.copy()
            handed = _receive(t0, t1, dst, src, fold, k)
            # the compiled path hands the sink at most what came with the header
            assert handed < 64 << 10 if native else handed == dst.nbytes
            results.append(dst)
        expect = base.copy()
        k(expect, src)
        assert results[0].tobytes() == results[1].tobytes() == expect.tobytes(), (name, op)
        compared += 1
    assert compared >= 40


def test_no_fold_where_numpy_has_its_own_formula() -> None:
    assert fold_codes(ReduceOp.PRODUCT, BY_NAME["complex64"]) is None
    assert fold_codes(ReduceOp.AVG, BY_NAME["float32"]) == (int(ReduceOp.SUM), 2)


@pytest.mark.parametrize("itemsize_name", ["int8", "float16", "float32", "complex128"])
def test_items_split_between_reads_are_carried_whole(itemsize_name: str) -> None:
    """The writer sends odd-sized pieces; every read ends wherever they do."""
    dt = BY_NAME[itemsize_name]
    n = 5000
    base, src = _values(dt.name, n, 3), _values(dt.name, n, 4)
    fold = fold_codes(ReduceOp.SUM, dt)
    assert fold is not None and recv_reduce is not None
    a, b = socket.socketpair()
    a.setblocking(False)
    dst = base.copy()
    out = memoryview(dst.view(np.uint8))
    scratch = memoryview(bytearray(4096))
    payload = src.tobytes()
    pos = have = reduced_total = 0
    sizes = [1, 3, 7, 13, 4093, 17, 2, 5000]
    i = 0
    while pos < len(payload) or have:
        if pos < len(payload):
            step = sizes[i % len(sizes)]
            b.sendall(payload[pos : pos + step])
            pos += min(step, len(payload) - pos)
            i += 1
        start = reduced_total
        nread, reduced, have, status = recv_reduce(
            a.fileno(), out[start:], scratch, have, fold[0], fold[1], 1 << 20
        )
        assert status == 0 and have < dt.itemsize
        reduced_total += reduced
        if pos == len(payload) and not nread and reduced_total == len(payload):
            break
    a.close()
    b.close()
    expect = base.copy()
    kernel(ReduceOp.SUM, dt)(expect, src)
    assert reduced_total == len(payload)
    assert dst.tobytes() == expect.tobytes()


def _send_all(sock: socket.socket, data: bytes | memoryview) -> None:
    """Write all of `data` to a non-blocking socket, as a peer that keeps sending."""
    view, done = memoryview(data), 0
    while done < view.nbytes:
        try:
            done += sock.send(view[done:])
        except BlockingIOError:
            time.sleep(0.001)


@pytest.mark.timeout(60)
def test_peer_lost_mid_payload_raises_naming_it(pair) -> None:
    t0, t1 = pair
    t0._fold = recv_reduce  # PYCOLLECTIVE_TCP_NATIVE=1's path
    n = 64 << 20
    dst = np.zeros(n // 4, np.float32)
    raw = memoryview(dst.view(np.uint8))
    m = InMessage(1, _data(1, 0, n), raw, sink=lambda p: None, align=4, fold=(0, 2))
    sock = t1._conns[0].sock

    def half_then_gone() -> None:
        _send_all(sock, _data(1, 0, n).pack() + np.ones(n // 8, np.float32).tobytes())
        sock.shutdown(socket.SHUT_RDWR)  # t0 reads the end of the stream, as of a crash

    w = threading.Thread(target=half_then_gone)
    w.start()
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        t0.exchange([], [m], time.monotonic() + 20, 77)
    w.join(10)
    assert info.value.peer == 1
    assert "closed by peer" in str(info.value) or "connection error" in str(info.value)
    assert time.monotonic() - start < 10
    assert dst[: n // 16 - 1].min() == 1.0  # what came was combined, in place


@pytest.mark.timeout(60)
def test_a_peer_stalled_mid_payload_times_out_within_bounds(pair) -> None:
    t0, t1 = pair
    t0._fold = recv_reduce
    n, sent = 16 << 20, (5 << 20) + 1001  # stalls inside an item
    dst = np.zeros(n // 4, np.float32)
    m = InMessage(1, _data(1, 0, n), memoryview(dst.view(np.uint8)), sink=lambda p: None,
                  align=4, fold=(0, 2))  # fmt: skip
    sock = t1._conns[0].sock
    data = memoryview(_data(1, 0, n).pack() + np.ones(n // 4, np.float32).tobytes()[:sent])

    w = threading.Thread(target=_send_all, args=(sock, data))
    w.start()
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout):
        t0.exchange([], [m], time.monotonic() + 1.5, 77, "all_reduce")
    assert time.monotonic() - start < 3.0
    w.join(10)
    assert dst[: sent // 4].min() == 1.0 and dst[sent // 4 :].max() == 0.0
    assert "abandoned mid-message" in (t0._conns[1].lost or "")


def test_the_switches_turn_it_on_and_off(monkeypatch) -> None:
    monkeypatch.delenv("PYCOLLECTIVE_TCP_NATIVE", raising=False)
    monkeypatch.delenv("PYCOLLECTIVE_NATIVE", raising=False)
    assert folding.native_fold() is None  # off by default
    monkeypatch.setenv("PYCOLLECTIVE_TCP_NATIVE", "1")
    assert folding.native_fold() is recv_reduce is not None
    monkeypatch.setenv("PYCOLLECTIVE_NATIVE", "0")
    assert folding.native_fold() is None
    monkeypatch.delenv("PYCOLLECTIVE_NATIVE")
    assert folding.native_fold() is recv_reduce
    monkeypatch.setenv("PYCOLLECTIVE_TCP_NATIVE", "maybe")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_TCP_NATIVE"):
        folding.native_fold()


def test_a_build_numbering_ops_otherwise_is_not_used(monkeypatch) -> None:
    """An extension from other sources (an op code or an itemsize unlike ours) would
    combine with the wrong kernel: folding refuses it, with the same check as the arena."""
    from pycollective import _native

    class Foreign:
        recv_reduce = _native.recv_reduce
        OP_CODE = dict(_native.OP_CODE)
        ITEMSIZE = dict(_native.ITEMSIZE)

    monkeypatch.setattr(folding, "_native", Foreign)
    assert folding.compiled() is recv_reduce  # as built: the same tables
    Foreign.OP_CODE = dict(_native.OP_CODE, SUM=_native.OP_CODE["MAX"])
    assert folding.compiled() is None
    Foreign.OP_CODE = dict(_native.OP_CODE)
    Foreign.ITEMSIZE = {code: size * 2 for code, size in _native.ITEMSIZE.items()}
    assert folding.compiled() is None


@pytest.mark.timeout(200)
def test_a_tcp_job_with_it_on_gives_every_algorithms_results() -> None:
    """Three processes over TCP with PYCOLLECTIVE_TCP_NATIVE=1: every all_reduce
    algorithm, four dtypes, SUM, MAX and AVG of 3 MiB, against the fused reduction."""
    results = run_ranks(
        REPO / "tests" / "transport" / "_fold_worker.py",
        3,
        timeout=180,
        env={"PYCOLLECTIVE_TRANSPORT": "tcp", "PYCOLLECTIVE_TCP_NATIVE": "1"},
    )
    assert_all_ok(results)
    for r in results:
        step = steps_of(r)["fold"]
        assert step["bad"] == [], step["bad"]
        assert step["read"] > 10 * step["window"], "the compiled path read little or nothing"
