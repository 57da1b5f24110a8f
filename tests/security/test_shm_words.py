"""Bad words in shared memory and in the arena's set-up record (issue 18, finding 10, the
Python side): what a peer writes into its control block or sends in the set-up exchange
is read as data, never trusted.

* The seqlock read of a peer's announcement spun without bound while the words kept
  changing: it now yields after a few thousand tries and past a deadline raises a
  TransportError naming the rank whose announcement never settled.
* A negative or impossible word (a buffer length, offset, pid, an announced count, kind or
  sequence number) raised an uncaught OverflowError/ValueError from mmap, or was shown as a
  call: every one is a TransportError naming the rank and the word.
* The arena name in rank 0's set-up record was decoded as UTF-8 (UnicodeDecodeError on
  bad bytes) and joined to /dev/shm unchecked: it must match exactly the names the
  library makes; its slot size must be one the library makes too.

Sans-IO where it can be: an Arena over a real segment, made in this process, with words
written into it by hand; the set-up exchange with its one transport call replaced by
the records an attacker would send."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from pycollective._dtypes import BYTE
from pycollective._errors import TransportError
from pycollective.runners import arena as _runner
from pycollective.runners.executor import ScratchPool
from pycollective.shm import arena as _arena
from pycollective.shm import collectives as _collectives
from pycollective.shm import shared as _shared
from pycollective.transport import _wire

pytestmark = pytest.mark.skipif(not _arena.available(), reason="no writable /dev/shm")

SLOT = 4096
RANKS = (3, 7)  # the group's ranks: messages name these, not the arena's 0 and 1


@pytest.fixture
def pair():
    """Rank 0's and rank 1's views of one real arena (one segment, two mappings)."""
    seg = _arena.Segment.create(_arena.layout(2, SLOT)[2])
    other = _arena.Segment.attach(seg.name, seg.nbytes)
    a0 = _arena.Arena(seg, 2, 0, SLOT, ranks=RANKS)
    a1 = _arena.Arena(other, 2, 1, SLOT, ranks=RANKS)
    a0.init_header()
    a1.check_header()
    seg.unlink()
    yield a0, a1


def _word(a: _arena.Arena, q: int, word: int, value: int) -> None:
    a.ctrl[q * _arena.WORDS + word] = value


# ---------------------------------------------------------------------- the seqlock


class _Restless:
    """A control block whose owner never stops rewriting its announcement: every read of
    SEQ sees a new value (what a peer mid-rewrite forever, or a corrupt one, looks like)."""

    def __init__(self, real) -> None:
        self.real = real
        self.reads = 0

    def __getitem__(self, i: int) -> int:
        if i % _arena.WORDS == _arena.SEQ:
            self.reads += 1
            return self.reads
        return self.real[i]


@pytest.mark.timeout(20)
def test_an_announcement_that_never_settles_raises_naming_the_rank(pair, monkeypatch) -> None:
    a0, _ = pair
    monkeypatch.setattr(_arena, "SETTLE_SECONDS", 0.2)
    restless = a0.ctrl = _Restless(a0.ctrl)
    yields = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: (yields.append(1), real_yield()))
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=f"rank {RANKS[1]}'s control block.* never settled"):
        a0.announced(1)
    assert 0.2 <= time.monotonic() - t0 < 10
    assert restless.reads > _arena.SETTLE_SPINS and yields  # spun a while, then yielded


def test_an_announcement_being_rewritten_is_read_once_it_settles(pair) -> None:
    """The bound does not refuse an owner that is merely busy: a few changing reads, then
    the same value twice, is an announcement."""
    a0, a1 = pair
    a1.announce(5, 1, 2, 10, 0, 0, 11)

    class Busy(_Restless):
        def __getitem__(self, i: int) -> int:
            if i % _arena.WORDS == _arena.SEQ and self.reads < 100:
                self.reads += 1
                return self.reads
            return self.real[i]

    a0.ctrl = Busy(a0.ctrl)
    assert a0.announced(1) == (5, 1, 2, 10, 0, 0, 11)


# ---------------------------------------------------------------------- announced words


@pytest.mark.parametrize(
    "word, value",
    [
        (_arena.SEQ, -5),
        (_arena.COUNT, -1),
        (_arena.KIND, 300),
        (_arena.DTYPE, -2),
        (_arena.OP, -1),  # was shown as op=AVG: OP_NAMES[-1]
        (_arena.ALGO, 1 << 40),
        (_arena.ROOT, 1 << 33),
    ],
)
def test_an_impossible_announcement_is_a_transport_error(pair, word, value) -> None:
    a0, a1 = pair
    a1.announce(0, _wire.KIND_CODE["all_reduce"], BYTE.code, 4, 0, 0, 13)
    _word(a1, 1, word, value)
    with pytest.raises(TransportError, match=f"rank {RANKS[1]}.*corrupt") as info:
        a0.announced(1)
    assert info.value.peer == RANKS[1]
    group = _runner.LocalGroup(a0, RANKS, 1, None)
    mine = _wire.Header(_wire.DATA, 1, BYTE.code, 0, 13, 1, 0, 0, 0, 4, 0)
    with pytest.raises(TransportError, match="corrupt"):  # not a MismatchError of garbage
        group._check_peer(1, mine, 1)


@pytest.mark.parametrize(
    "word, value",
    [
        (_arena.BUF_LEN, -1),  # mmap: OverflowError
        (_arena.BUF_LEN, 0),  # mmap of an empty length: ValueError, or the whole file
        (_arena.BUF_OFF, -4096),
        (_arena.PID, -1),
        (_arena.BUF_FD, -3),
        (_arena.BUF_INO, -1),
    ],
)
def test_a_bad_shared_buffer_word_is_a_transport_error(pair, word, value) -> None:
    """Rank 1 announces a shared buffer (pycollective.empty) whose description is bad;
    rank 0, itself on a shared buffer, asks for its peers' views."""
    a0, a1 = pair
    data = _shared.allocate(64).view(np.float32)
    fd1, ino, off, length = _shared.describe(data)
    for a, q in ((a0, 0), (a1, 1)):
        a.ctrl[q * _arena.WORDS + _arena.PID] = os.getpid()
        a.announce(0, 1, 1, 16, 0, 0, 13, (fd1, ino, off, length))
    group = _runner.LocalGroup(a0, RANKS, 1, None)
    assert len(group._peer_views(data, "all_reduce")) == 2  # the honest description maps
    group = _runner.LocalGroup(a0, RANKS, 1, None)
    _word(a1, 1, word, value)
    with pytest.raises(TransportError, match=f"rank {RANKS[1]}"):
        group._peer_views(data, "all_reduce")


# ---------------------------------------------------------------------- the set-up record


def _rank0_record(name: bytes, slot_bytes: int, mine: np.ndarray) -> np.ndarray:
    rec = np.zeros(_runner._RECORD, np.uint8)
    rec[:16] = mine[:16]  # the same host, so rank 1 goes on to map the arena
    rec[_runner._CPUS_AT : _runner._CPUS_AT + _runner._CPUS_LEN] = mine[
        _runner._CPUS_AT : _runner._CPUS_AT + _runner._CPUS_LEN
    ]
    rec[17] = 1  # "I made an arena"
    rec[24:32] = np.frombuffer(np.int64(slot_bytes).tobytes(), np.uint8)
    rec[_runner._NAME_AT : _runner._NAME_AT + len(name)] = np.frombuffer(name, np.uint8)
    return rec


def _set_up_with(monkeypatch, name: bytes, slot_bytes: int = SLOT):
    """Rank 1's set-up with rank 0's record replaced by `name` and `slot_bytes`."""

    def exchange(plan, arrays, *args, **kwargs):
        mine = arrays["input"]
        out = arrays["output"].reshape(2, _runner._RECORD)
        out[0] = _rank0_record(name, slot_bytes, mine)
        out[1] = mine

    monkeypatch.setattr(_runner, "run_schedule", exchange)
    monkeypatch.setattr(_runner, "transport_mode", lambda: "auto")
    monkeypatch.setattr(_arena, "slot_bytes_for", lambda p, cores: SLOT)
    header = _runner.setup_header(1, _wire.ALGO_CODE["shm-setup"])
    return _runner._setup(
        RANKS, 1, 1, object(), header, time.monotonic() + 5, ScratchPool(), "auto"
    )


@pytest.mark.parametrize(
    "name",
    [
        b"\xff\xfe\xfd",  # not UTF-8: UnicodeDecodeError before
        b"pycollective-0-1-2-" + "é".encode() * 6,
        b"pycollective-../../../etc/passwd",
        b"pycollective-0-4026531836-1/../../x",
        b"pycollective-0-4026531836-12-abc",  # not the 12 hex digits the library draws
        b"pycollective-0-4026531836-12-abcdefabcdef\nx",
        b"other-0-4026531836-12-abcdefabcdef",
        b"",
    ],
)
def test_a_bad_arena_name_in_the_set_up_record_is_a_transport_error(monkeypatch, name) -> None:
    with pytest.raises(TransportError, match=f"rank {RANKS[0]}.*arena name"):
        _set_up_with(monkeypatch, name)


@pytest.mark.parametrize("slot_bytes", [-4096, 0, 4097, 1 << 40])
def test_a_bad_slot_size_in_the_set_up_record_is_a_transport_error(monkeypatch, slot_bytes) -> None:
    seg = _arena.Segment.create(_arena.layout(2, SLOT)[2])
    try:
        with pytest.raises(TransportError, match=f"rank {RANKS[0]}.*slot size"):
            _set_up_with(monkeypatch, seg.name.encode(), slot_bytes)
    finally:
        seg.unlink()


def test_a_good_set_up_record_still_maps_the_arena(monkeypatch) -> None:
    """The checks above refuse only what the library never makes: rank 0's real name maps."""
    seg = _arena.Segment.create(_arena.layout(2, SLOT)[2])
    try:
        a0 = _arena.Arena(seg, 2, 0, SLOT)
        a0.init_header()
        a0.bump()  # rank 0 has passed the set-up's last phase: rank 1 does not wait
        group = _set_up_with(monkeypatch, seg.name.encode())
        assert group is not None and group.arena.size == 2 and group.arena.ranks == RANKS
    finally:
        seg.unlink()


def test_attach_refuses_names_the_library_never_makes() -> None:
    for name in ("pycollective-x", "pycollective-0-0-0-abcdefabcdef/..", "../pycollective-0"):
        with pytest.raises(OSError, match="not a pycollective segment name"):
            _arena.Segment.attach(name, 10)


def test_the_group_chunk_travels_in_the_header_and_is_checked() -> None:
    """Rank 0's chunk reaches every rank through the header (a compiled and a Python rank
    then cut a call alike); a chunk no library would write is refused."""
    seg = _arena.Segment.create(_arena.layout(2, 4096)[2])
    try:
        other = _arena.Segment.attach(seg.name, seg.nbytes)
        a0, a1 = _arena.Arena(seg, 2, 0, 4096), _arena.Arena(other, 2, 1, 4096)
        a0.chunk_bytes = 2000
        a0.init_header()
        a1.check_header()
        assert a1.chunk_bytes == 2000
        assert _collectives.chunk_elements(a1, 4) == 500
        a0.chunk_bytes = 1 << 20
        a0.init_header()
        a1.check_header()
        assert _collectives.chunk_elements(a1, 4) == 1024  # the 4 KiB slot bounds it
        for bad in (0, -1, _arena.MAX_SLOT_BYTES + 1):
            a0.chunk_bytes = bad
            a0.init_header()
            with pytest.raises(ValueError, match="chunk"):
                a1.check_header()
    finally:
        seg.unlink()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("word", "errno_name", "rank"),
    [
        (5 | 1001 << 32, "EIO", 1),  # errno 5, a rank far past the arena's: its writer
        (-1, "EIO", 1),  # every bit set: no errno, no rank
        (1 << 40, "EIO", 1),  # no errno at all, a rank of 65535
        (99999 | 1 << 32, "EIO", 0),  # an errno past any: EIO; rank 0 is in range
        (13 | 2 << 32, "EACCES", 1),  # an honest word: errno 13, rank 1
    ],
)
def test_a_peers_single_copy_error_word_is_read_as_data(
    word: int, errno_name: str, rank: int
) -> None:
    """A peer's single-copy error word (csrc/arena.c single_verdict) carries an errno and
    1 + the rank it could not reach. Written by a hostile peer after a call that went well,
    it fails the call (every rank must raise alike), with an errno within 1-4095 (else
    EIO) and a rank of the arena (else the word's writer), never a value out of range."""
    pytest.importorskip("pycollective._native")  # (single copy is compiled only)
    from tests._arena_ranks import run_on_new_arena  # noqa: PLC0415
    from tests.native.test_single_copy import SLOT as CALL_SLOT  # noqa: PLC0415
    from tests.native.test_single_copy import _worker_or_idler  # noqa: PLC0415

    results = run_on_new_arena(2, CALL_SLOT, _worker_or_idler, lambda r: (word,))
    status, msg = results[0]
    assert status == "raised", results
    assert f"with rank {rank} failed: {errno_name} " in msg, msg
    assert results[1] is True, results  # (the peer's own buffer holds the result)
