"""A shared-memory arena for the ranks of one group on one host: the segment's lifecycle,
its layout, and the per-rank phase counters the arena collectives synchronise on.

Lifecycle. Group rank 0 creates a file in /dev/shm (named after the user, the pid
namespace and its pid, so a later run can tell a stale one from a live one), reserves its
pages (a full tmpfs then fails here with an error instead of killing a process with SIGBUS
on first touch), the others map it, and once all have (one arena barrier) rank 0 unlinks
the name. From then on the memory lives exactly as long as some rank maps it: normal exit,
exceptions, signals and kill -9 all leave nothing behind. A segment whose creator died
before unlinking it is removed by the next creation on this host (`sweep_stale`). We do
not use multiprocessing.shared_memory: its resource tracker starts a process and would
unlink a segment it did not create at exit.

Layout: a 4 KiB header (magic, group size, slot size, creator pid), then one 128-byte
control block per rank (two cache lines, written only by its rank, so ranks never write
the same line), then the data: NBUF buffers, each with one slot of `slot_bytes` per
rank. Consecutive chunks of a collective take consecutive buffers (round robin), so a
rank can fill the next ones while slower ranks still read earlier ones.

Synchronisation: each rank owns a monotone phase counter (`EPOCH`). A phase is "bump my
counter, wait until every peer's counter is as high". Every rank runs the same phases for
the same calls, so the counters agree between calls. Waiting spins briefly, then keeps
polling with sched_yield (cheap under contention: a yielding poll lets the peer we wait on
run), then sleeps on the peer's counter with a futex; a rank that bumps its counter wakes
peers that said they sleep. Waits call `poll` periodically so the caller can enforce
deadlines and notice dead peers and abort notices.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from .. import _config
from .._errors import TransportError
from .._load import MachineLoad
from ..observe.timeline import WAIT as _WAIT
from . import _futex

SHM_DIR = "/dev/shm"
_PREFIX = "pycollective"
MAGIC = 0x50594353484D3031  # "PYCSHM01"
HEADER_BYTES = 4096
WORDS = 16  # int64 words per control block (128 bytes)
MAX_RANKS = 256

# Control block words (int64). Only the owning rank writes its block.
EPOCH = 0  # phase counter; its low 32 bits are the futex word peers sleep on
SLEEPING = 1  # nonzero while this rank may be asleep on a peer's counter
PID = 2
SEQ = 3  # announced call: group sequence number + 1 (0: none yet) ...
KIND = 4  # ... and its kind, dtype, count, root, op, algorithm codes
DTYPE = 5
COUNT = 6
ROOT = 7
OP = 8
ALGO = 9
# The buffer of this rank's current call when it lives in shared memory (`pycollective.empty`),
# announced with the call so peers can read it directly: fd + 1 (0: not shared), the inode
# of that fd, and the byte offset and length of the data in the file.
BUF_FD = 10
BUF_INO = 11
BUF_OFF = 12
BUF_LEN = 13
# Single copy (compiled only, csrc/arena.c run_single): the call's buffer address in the
# announcing process (0: not taking part), and what stopped its copies (0: none; the
# errno, and above bit 32 one more than the rank it could not reach: csrc/arena.c),
# written before the call's last phase.
ADDR = 14
SC_ERR = 15
NBUF = 4  # data buffers, taken round robin by consecutive chunks

# Header words
_H_MAGIC, _H_SIZE, _H_SLOT, _H_PID, _H_CHUNK = 0, 1, 2, 3, 4
# Single copy's claim word (compiled only, csrc/arena.c run_single): the next unclaimed
# piece of the call in progress; every rank zeroes it before the call's first phase and
# takes pieces from it (an atomic add) after.
H_CLAIM = 5

# A peer's words are data, never trusted: an announcement's fields must fit the frame
# header's (transport/_wire.py: kind, dtype, op and algorithm one byte each, root an int32,
# sequence number and count unsigned; checked in `announced`), and a shared buffer's
# description must be one a process could make. Reading an announcement that keeps
# changing gives up past a bound.
SETTLE_SPINS = 4096  # reads of a changing announcement before yielding between reads
SETTLE_SECONDS = 2.0  # ... and before giving up: its owner rewrites it in nanoseconds
# The names Segment.create makes: prefix, uid, pid namespace, pid, 12 random hex digits.
_NAME = re.compile(rf"{_PREFIX}-[0-9]+-[0-9]+-[0-9]+-[0-9a-f]{{12}}")
MAX_SLOT_BYTES = 1 << 30  # far above what slot_bytes_for makes (at most 4 MiB)


def affinity() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


# Largest chunk of a pipelined reduction (bytes per chunk, every rank's share of it; the
# slot bounds it too). Rank 0 chooses it for the group and writes it into the arena's
# header, so every rank cuts a call alike whichever arena (compiled or Python) it runs.
# Compiled: 256 KiB, so a chunk's slots and shares stay in the 2 MiB L2 from the copy in
# through the reduction to the copy out (p=2 pinned, alternating in the same ranks, load
# 12.7-13.3, fastest of 31 batches: 1 / 2 / 4 MiB 185 / 446 / 1118 us, against 273 / 511 /
# 1351 us with 1 MiB chunks; docs/shm.md). Python: 1 MiB, since its per-step work and
# waits add up below that (1 / 4 MiB at load 14: 0.75 / 27 ms fastest with 1 MiB chunks,
# 13.7 / 31 ms with 256 KiB). PYCOLLECTIVE_SHM_CHUNK_BYTES overrides both.
CHUNK_BYTES_COMPILED = 256 << 10
CHUNK_BYTES_PYTHON = 1 << 20


def chunk_bytes_for(compiled: bool) -> int:
    """The chunk rank 0 chooses for its group (see above)."""
    override = _config.get("PYCOLLECTIVE_SHM_CHUNK_BYTES")
    if override is not None:
        return int(override)
    return CHUNK_BYTES_COMPILED if compiled else CHUNK_BYTES_PYTHON


def slot_bytes_for(size: int, cores: int) -> int:
    """Slot size per rank per buffer: 1 MiB (a chunk's working set stays in L2/L3), and
    less for big groups so the arena stays ~32 MiB at most. With more ranks than cores,
    up to 4 MiB: every phase then costs context switches, so fewer, larger chunks win (a
    16 MiB all_reduce at p=4 on 2 cores took half the time with 2-4 MiB chunks than with
    1 MiB). PYCOLLECTIVE_SHM_SLOT_BYTES overrides."""
    override = _config.get("PYCOLLECTIVE_SHM_SLOT_BYTES")
    if override is not None:
        value = int(override)
    else:
        cap = (4 << 20) if size > cores else (1 << 20)
        value = min(cap, max(64 << 10, (32 << 20) // (NBUF * max(1, size))))
    return max(4096, value // 4096 * 4096)


def layout(size: int, slot_bytes: int) -> tuple[int, int, int]:
    """(control offset, data offset, total bytes) of an arena for `size` ranks."""
    ctrl = HEADER_BYTES
    data = ctrl + -(-size * WORDS * 8 // 4096) * 4096
    return ctrl, data, data + NBUF * size * slot_bytes


# ---------------------------------------------------------------------- the segment


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


def _name_prefix() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return f"{_PREFIX}-{uid}-{_pidns()}-"


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK)


def sweep_stale() -> list[str]:
    """Unlink segments left by creators of this user and pid namespace that are dead (they
    died between creating and unlinking). Returns the names removed."""
    prefix = _name_prefix()
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            pid = int(name[len(prefix) :].split("-")[0])
        except ValueError:
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Segment:
    """One mapped file in /dev/shm. The mapping outlives the name (see `unlink`)."""

    def __init__(self, name: str, fd: int, nbytes: int, created: bool) -> None:
        self.name = name
        self.nbytes = nbytes
        self.created = created
        self._linked = created
        try:
            self.mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, self.name)

    @classmethod
    def create(cls, nbytes: int) -> Segment:
        sweep_stale()
        name = f"{_name_prefix()}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, nbytes)  # ENOSPC now rather than SIGBUS later
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
            raise
        try:
            return cls(name, fd, nbytes, created=True)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
            raise

    @classmethod
    def attach(cls, name: str, nbytes: int) -> Segment:
        if not is_segment_name(name):
            raise OSError(f"not a pycollective segment name: {name!r}")
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | nofollow)
        try:
            st = os.fstat(fd)
            if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
                raise OSError(f"segment {name} belongs to uid {st.st_uid}, not to this user")
            if st.st_size < nbytes:
                raise OSError(f"segment {name} is smaller than {nbytes} bytes")
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, nbytes, created=False)

    def unlink(self) -> None:
        """Remove the name (creator only); mappings stay valid until every rank unmaps."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def is_segment_name(name: str) -> bool:
    """Whether `name` is one Segment.create could have made (no separator, no "..")."""
    return _NAME.fullmatch(name) is not None


def check_slot_bytes(slot_bytes: int) -> bool:
    """Whether `slot_bytes` is a slot size slot_bytes_for could have made."""
    return 4096 <= slot_bytes <= MAX_SLOT_BYTES and slot_bytes % 4096 == 0


# ---------------------------------------------------------------------- the arena

# The writer of a counter reads its peers' SLEEPING flags after the store; the sleeper
# stores its flag and then reads the counter. x86 may reorder a store with a later load,
# so both sides put a full fence between them (a lock acquire is a locked instruction)
# and no wake-up is lost. The futex timeout bounds the damage if one ever were.
_FENCE = threading.Lock()


def _fence() -> None:
    _FENCE.acquire()
    _FENCE.release()


class Arena:
    """This rank's view of a group's arena: control blocks, data slots, phase counter."""

    def __init__(
        self,
        segment: Segment,
        size: int,
        rank: int,
        slot_bytes: int,
        cores: int | None = None,
        ranks: Sequence[int] | None = None,
    ) -> None:
        ctrl_off, data_off, total = layout(size, slot_bytes)
        if segment.nbytes < total:
            raise ValueError(f"segment of {segment.nbytes} bytes, arena needs {total}")
        self.segment = segment
        self.size = size
        self.rank = rank
        self.slot_bytes = slot_bytes
        self._raw = np.frombuffer(segment.mm, dtype=np.uint8)
        self._addr = self._raw.ctypes.data
        self.header = memoryview(segment.mm)[:HEADER_BYTES].cast("q")
        self.ctrl = memoryview(segment.mm)[ctrl_off:data_off].cast("q")
        self._ctrl_addr = self._addr + ctrl_off
        self.data = self._raw[data_off:total]
        self._typed: dict[np.dtype, np.ndarray] = {}
        self.peers = tuple(q for q in range(size) if q != rank)
        # the group's ranks, by arena index: what errors name
        self.ranks = tuple(range(size)) if ranks is None else tuple(ranks)
        self.epoch = self.ctrl[rank * WORDS + EPOCH]
        self.next_buf = 0  # the buffer the next chunk takes; every rank counts alike
        self.chunk_bytes = CHUNK_BYTES_COMPILED  # the group's, from the header (check_header)
        # whether the machine is busy, read by waits (PYCOLLECTIVE_LOAD_AWARE=0: never)
        aware = _config.get("PYCOLLECTIVE_LOAD_AWARE") != "0"
        self.load = MachineLoad(None if aware else -1)
        # the group's cores, corrected by set_cores once the peers' affinities are known
        self.set_cores(len(affinity()) if cores is None else cores)

    def set_cores(self, cores: int) -> None:
        """How many cores the group's ranks share (the union of their affinities)."""
        self.oversubscribed = oversubscribed = self.size > cores
        # Spin budgets (seconds of sched_yield polling before sleeping). Spinning without
        # yielding is only for the first few checks: with more busy processes than cores a
        # pure spinner can hold the core the peer needs for a whole time slice.
        default_us = 300.0 if oversubscribed else 1000.0
        spin_us = _config.get("PYCOLLECTIVE_SHM_SPIN_US")
        self.yield_seconds = (default_us if spin_us is None else spin_us) * 1e-6
        self.pure_spins = 16 if oversubscribed else 256
        # While the machine is busy (more runnable tasks than CPUs), as if oversubscribed:
        # the peer we wait on may be waiting for this very core. Not a rank pinned to a
        # core of its own (mpirun's binding): its peer has another core, and sleeping
        # sooner only makes its own wake-up wait behind what else runs on its core
        # (compare_peers shm, stress-ng 6, pinned, 64 MiB: 67 -> 106 ms and 60 -> 91 ms
        # in 2 of 3 alternating pairs, load 8-12).
        self.pinned = len(affinity()) == 1 and not oversubscribed
        self.busy_spins = self.pure_spins if self.pinned else 16
        self.busy_yield_seconds = (
            self.yield_seconds if self.pinned else min(self.yield_seconds, BUSY_YIELD_SECONDS)
        )

    # ---------------------------------------------------------------- header, at setup

    def init_header(self) -> None:
        h = self.header
        h[_H_SIZE] = self.size
        h[_H_SLOT] = self.slot_bytes
        h[_H_CHUNK] = self.chunk_bytes
        h[_H_PID] = os.getpid()
        h[_H_MAGIC] = MAGIC

    def check_header(self) -> None:
        h = self.header
        if h[_H_MAGIC] != MAGIC or h[_H_SIZE] != self.size or h[_H_SLOT] != self.slot_bytes:
            raise ValueError(
                f"arena {self.segment.name} has layout ({h[_H_SIZE]} ranks, {h[_H_SLOT]}-byte "
                f"slots), expected ({self.size}, {self.slot_bytes})"
            )
        chunk = h[_H_CHUNK]
        if not 1 <= chunk <= MAX_SLOT_BYTES:  # written by rank 0: data, never trusted
            raise ValueError(f"arena {self.segment.name} has a chunk of {chunk} bytes")
        self.chunk_bytes = chunk
        self.ctrl[self.rank * WORDS + PID] = os.getpid()

    # ---------------------------------------------------------------- data views

    def typed(self, dtype: np.dtype) -> np.ndarray:
        """The data region as elements of `dtype` (cached)."""
        view = self._typed.get(dtype)
        if view is None:
            view = self._typed[dtype] = self.data.view(dtype)
        return view

    def slot(self, typed: np.ndarray, buf: int, q: int) -> np.ndarray:
        """Rank q's slot in buffer `buf` (taken modulo NBUF)."""
        per = self.slot_bytes // typed.itemsize
        start = ((buf % NBUF) * self.size + q) * per
        return typed[start : start + per]

    def region(self, typed: np.ndarray, buf: int) -> np.ndarray:
        """All p slots of buffer `buf` as one region."""
        per = self.size * self.slot_bytes // typed.itemsize
        b = buf % NBUF
        return typed[b * per : (b + 1) * per]

    def take(self, n: int = 1) -> int:
        """The first of `n` consecutive buffers for the next `n` chunks."""
        b = self.next_buf
        self.next_buf = (b + n) % NBUF
        return b

    # ---------------------------------------------------------------- announcements

    def announce(
        self,
        seq: int,
        kind: int,
        dtype: int,
        count: int,
        root: int,
        op: int,
        algo: int,
        shared: tuple[int, int, int, int] = (0, 0, 0, 0),
    ) -> None:
        """Say which call this rank is in (peers check it against theirs). A seqlock:
        SEQ is 0 while the fields change, so a reader never takes half of two calls.
        `shared`: (fd + 1, inode, offset, length) of the call's buffer if it is shared
        memory peers may map (see shared.py), else zeros."""
        c, base = self.ctrl, self.rank * WORDS
        c[base + SEQ] = 0
        c[base + BUF_FD], c[base + BUF_INO], c[base + BUF_OFF], c[base + BUF_LEN] = shared
        c[base + KIND] = kind
        c[base + DTYPE] = dtype
        c[base + COUNT] = count
        c[base + ROOT] = root
        c[base + OP] = op
        c[base + ALGO] = algo
        c[base + SEQ] = seq + 1

    def announced(self, q: int) -> tuple[int, int, int, int, int, int, int] | None:
        """(seq, kind, dtype, count, root, op, algo) rank q announced last, or None. Raises
        TransportError if the words are impossible, or never settle."""
        c, base = self.ctrl, q * WORDS
        tries = 0
        give_up = 0.0
        while True:
            seq = c[base + SEQ]
            fields = (
                c[base + KIND],
                c[base + DTYPE],
                c[base + COUNT],
                c[base + ROOT],
                c[base + OP],
                c[base + ALGO],
            )
            if seq == c[base + SEQ]:
                if seq == 0:
                    return None
                kind, dtype, count, root, op, algo = fields
                # literals, not the names above: this runs at every check of a peer
                if (
                    seq < 0
                    or count < 0
                    or (kind | dtype | op | algo) & ~0xFF
                    or not -0x80000000 <= root <= 0x7FFFFFFF
                ):
                    raise self._corrupt(q, f"an impossible call (words {(seq - 1, *fields)})")
                return (seq - 1, *fields)
            # the owner is rewriting it: it finishes within nanoseconds, unless it is
            # descheduled (then yield to it) or is no pycollective rank (then give up)
            tries += 1
            if tries >= SETTLE_SPINS:
                now = time.monotonic()
                if not give_up:
                    give_up = now + SETTLE_SECONDS
                elif now >= give_up:
                    raise self._corrupt(
                        q,
                        f"an announcement that never settled ({tries} reads in "
                        f"{SETTLE_SECONDS:g} s saw it change)",
                    )
                os.sched_yield()

    def shared_buffer(self, q: int) -> tuple[int, int, int, int, int]:
        """(pid, fd + 1, inode, offset, length) of rank q's announced buffer; fd + 1 is 0
        if it is not shared. Stable from q's first phase of a call until its next phase.
        Raises TransportError if the words describe no buffer a process could have."""
        c, base = self.ctrl, q * WORDS
        pid, fd1, ino, off, length = (
            c[base + PID],
            c[base + BUF_FD],
            c[base + BUF_INO],
            c[base + BUF_OFF],
            c[base + BUF_LEN],
        )
        if fd1 and (pid <= 0 or fd1 < 0 or ino < 0 or off < 0 or length <= 0):
            raise self._corrupt(
                q,
                f"an impossible shared buffer (pid {pid}, fd {fd1 - 1}, inode {ino}, "
                f"offset {off}, length {length})",
            )
        return pid, fd1, ino, off, length

    def _corrupt(self, q: int, what: str) -> TransportError:
        peer = self.ranks[q]
        return TransportError(
            f"rank {self.ranks[self.rank]}: rank {peer}'s control block in the shared-memory "
            f"arena {self.segment.name} holds {what}: it is corrupt, or written by something "
            "other than a pycollective rank of this group (PYCOLLECTIVE_TRANSPORT=tcp runs "
            "without shared memory)",
            peer=peer,
        )

    def epoch_of(self, q: int) -> int:
        return self.ctrl[q * WORDS + EPOCH]

    # ---------------------------------------------------------------- phases

    def bump(self) -> int:
        """Enter the next phase: publish it and wake peers asleep on us."""
        e = self.epoch + 1
        self.epoch = e
        c = self.ctrl
        c[self.rank * WORDS + EPOCH] = e
        _fence()
        for q in self.peers:
            if c[q * WORDS + SLEEPING]:
                _futex.wake(self._ctrl_addr + self.rank * WORDS * 8)
                break
        return e

    def lagging(self, target: int) -> list[int]:
        c = self.ctrl
        return [q for q in self.peers if c[q * WORDS + EPOCH] < target]

    def wait_all(self, target: int, poll: Callable[[int], None]) -> None:
        """Wait until every peer's counter reaches `target`. `poll(target)` is called every
        so often while waiting; it raises to give up (deadline, dead peer, abort)."""
        c = self.ctrl
        for q in self.peers:
            i = q * WORDS + EPOCH
            if c[i] < target:
                if _WAIT.on:  # PYCOLLECTIVE_TIMELINE: the time spent waiting for peers
                    t0, w0 = time.perf_counter(), _WAIT.total
                    self._wait_one(i, target, poll)
                    # = not +=: poll's transport checks inside were counted already
                    _WAIT.total = w0 + time.perf_counter() - t0
                else:
                    self._wait_one(i, target, poll)

    def _wait_one(self, i: int, target: int, poll: Callable[[int], None]) -> None:
        c = self.ctrl
        load = self.load
        # load.busy: the last reading (refreshed below), as csrc/wait.c does
        for _ in range(self.busy_spins if load.busy else self.pure_spins):
            if c[i] >= target:
                return
        start = time.monotonic()
        # The first checks (TCP, peers' calls) wait a little: most waits end sooner, and
        # with ranks outnumbering cores nearly every wait gets this far.
        next_poll = start + FIRST_POLL_SECONDS
        sleeping = self.rank * WORDS + SLEEPING
        addr = self._ctrl_addr + i * 8
        while c[i] < target:
            now = time.monotonic()
            if now >= next_poll:
                poll(target)
                next_poll = now + POLL_SECONDS
            busy = load.check(now)
            if now < start + (self.busy_yield_seconds if busy else self.yield_seconds):
                os.sched_yield()
                continue
            c[sleeping] = 1
            _fence()
            value = c[i]
            if value < target:
                _futex.wait(addr, value, min(SLEEP_SECONDS, max(1e-4, next_poll - now)))
            c[sleeping] = 0


# How long a wait yields before it sleeps while the machine is busy (at most; the
# oversubscribed default): the compiled arena yields less (shm/native.py).
BUSY_YIELD_SECONDS = 300e-6
POLL_SECONDS = 0.02  # how often a waiting rank checks deadline, liveness and abort notices
FIRST_POLL_SECONDS = 0.001  # ... and when it first does
SLEEP_SECONDS = 0.01  # longest single futex sleep
