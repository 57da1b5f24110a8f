"""The shared-memory arena's control blocks as the compiled core reads them
(pycollective._native: the phase counters, the SLEEPING flags and the announcement
seqlock), and as Python judges the same words (shm/arena.py `announced`,
runners/arena.py `_check_peer`).

The input sets the call this rank (arena rank 0) makes and what its peers wrote: each
peer's 16 control words as raw bytes, and the first bytes of the data slots. The call
then runs compiled, its status handled as runners/arena.py does (PENDING: Python polls
the laggards' announcements; CHECK: Python judges the peer C named), for a few rounds.
All_reduce calls above 1 KiB take single copy (csrc/arena.c run_single) with every
peer played by one sacrificial process (`cat`, which ends when we do): the buffer address
a peer announces (its ADDR word) and its error word (SC_ERR) are the input's, so C reads
and writes that process's memory wherever the input says, and only there (the pids are
set-up's, never a peer's words). Contract: C returns only its five statuses and never
reads or writes outside the arena or the call's buffers (AddressSanitizer checks that
under `python -m fuzz.native`);
every wait ends within its budget; Python's judgement of a peer's words is an answer or a
TransportError (corrupt words) or MismatchError (another call), never another exception;
and when C stops for a peer's announcement, Python finds that announcement wrong too.

Without the extension (not built) the target checks the Python judgement alone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess

import numpy as np

from pycollective._errors import MismatchError, TransportError
from pycollective.runners import arena as _runner
from pycollective.shm import arena as _arena
from pycollective.shm import native as _native
from pycollective.transport import _wire

SLOT = 4096
SIZES = (2, 3, 4)
ROUNDS = 4  # C's returns handled per input: peers that never arrive are a timeout
BUDGET_NS = 50_000
# (collective, wire kind) the compiled core runs, and the dtypes it takes
COLLECTIVES = tuple(_native._native.KIND_CODE)  # the compiled core's, numbered as the wire
DTYPES = {2: np.float32, 3: np.float64, 6: np.int32, 8: np.uint8, 16: np.uint8}
OPS_FLOAT = (0, 1, 2, 3, 7)  # SUM PRODUCT MIN MAX AVG: the API refuses bitwise ops on floats
OPS_INT = (0, 1, 2, 3, 4, 5, 6)  # ... and AVG on integers
STATUSES = {_native.DONE, _native.PENDING, _native.CHECK, _native.VIEWS, _native.FAILED}
COMPILED = _native._native is not None


class _Rank0:
    """Rank 0 of a `size`-rank arena whose peers the input plays."""

    def __init__(self, size: int) -> None:
        if not _arena.available():
            raise RuntimeError("arena_words needs a writable /dev/shm, as the arena does")
        seg = _arena.Segment.create(_arena.layout(size, SLOT)[2])
        seg.unlink()  # nothing left in /dev/shm, whatever happens
        self.arena = _arena.Arena(seg, size, 0, SLOT, cores=1, ranks=tuple(range(size)))
        self.arena.init_header()
        self.words = np.frombuffer(self.arena.ctrl, dtype=np.int64)
        self.group = _runner.LocalGroup(self.arena, tuple(range(size)), 1, None)
        self.c = None
        if COMPILED:
            ctrl, data, _ = _arena.layout(size, SLOT)
            self.c = _native._native.Arena(
                seg.mm, ctrl, data, size, 0, SLOT, _arena.NBUF, 1024, SLOT // 2
            )
            self.c.set_spin(0, 0, True, 0)  # no spinning: the peers here never move
            peer = _sacrifice().pid  # every peer's process, as set-up would have found it
            self.c.set_single_copy(1, 64, [os.getpid()] + [peer] * (size - 1))

    def close(self) -> None:
        if self.c is not None:
            self.c.release()


_ranks: dict[int, _Rank0] = {}
_victims: list[subprocess.Popen] = []


def _sacrifice() -> subprocess.Popen:
    """A process whose memory single copy may read and write at the input's addresses
    (restarted if the input's writes killed it)."""
    if not _victims or _victims[0].poll() is not None:
        # it reads our pipe: however this process ends (libFuzzer exits without running
        # atexit), the pipe closes and it exits; it holds none of our output
        cat = shutil.which("cat") or "cat"
        _victims[:] = [
            subprocess.Popen(  # noqa: S603 - a fixed command
                [cat], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]  # fmt: skip
    return _victims[0]


@atexit.register
def _release() -> None:
    for r in _ranks.values():
        r.close()
    for v in _victims:
        if v.stdin is not None:
            v.stdin.close()  # it exits at the end of its input
        v.kill()
        v.wait()


def _take(data: bytes, pos: int, n: int) -> tuple[bytes, int]:
    chunk = data[pos : pos + n]
    return chunk + bytes(n - len(chunk)), pos + n


def check(data: bytes) -> None:
    head, pos = _take(data, 0, 8)
    size = SIZES[head[0] % len(SIZES)]
    rank0 = _ranks.get(size) or _ranks.setdefault(size, _Rank0(size))
    collective = COLLECTIVES[head[1] % len(COLLECTIVES)]
    code = tuple(DTYPES)[head[2] % len(DTYPES)]
    ops = OPS_FLOAT if code in (2, 3) else OPS_INT
    op = ops[head[3] % len(ops)] if collective in ("all_reduce", "reduce", "reduce_scatter") else 0
    root = head[4] % size if collective in ("reduce", "broadcast") else 0
    count = int.from_bytes(head[5:7], "little") % 1200
    seq = head[7]
    kind = _wire.KIND_CODE[collective]
    header = _wire.Header(
        _wire.DATA, kind, code, op, _wire.ALGO_CODE["shm"], 1, seq, 0, root, count, 0
    )
    # The peers' control blocks, word for word from the input; ours as a real rank left it.
    words = rank0.words
    words[:] = 0
    epoch = int.from_bytes(_take(data, pos, 2)[0], "little")
    pos += 2
    words[_arena.EPOCH] = epoch
    for q in range(1, size):
        raw, pos = _take(data, pos, _arena.WORDS * 8)
        words[q * _arena.WORDS : (q + 1) * _arena.WORDS] = np.frombuffer(raw, dtype=np.int64)
    rest = data[pos : pos + rank0.arena.data.size]
    rank0.arena.data[: len(rest)] = np.frombuffer(rest, dtype=np.uint8)

    target = epoch + 1
    for q in range(1, size):  # Python's judgement of each peer: an answer or our errors
        try:
            rank0.group._check_peer(q, header, target)
        except (MismatchError, TransportError):
            pass
    if rank0.c is None:
        return
    _run_compiled(rank0, collective, code, op, root, count, header, size)


def _run_compiled(rank0, collective, code, op, root, count, header, size) -> None:
    dt = DTYPES[code]
    plan = _native._native.Plan(
        _wire.KIND_CODE[collective], code, op, root, 0,
        (header.kind, header.dtype, header.count, header.root, header.op, header.algo),
    )  # fmt: skip
    inp = out = None
    if collective == "all_gather":
        inp, out = np.ones(count, dt), np.zeros(count * size, dt)
    elif collective == "reduce_scatter":
        inp, out = np.ones(count * size, dt), np.zeros(count, dt)
    elif collective != "barrier":
        out = np.ones(count, dt)
    before = None if out is None else out.nbytes
    c = rank0.c
    rc = c.run(plan, inp, out, header.seq, BUDGET_NS, None)
    for _ in range(ROUNDS):
        assert rc in STATUSES, rc
        if rc == _native.DONE:
            break
        if rc == _native.FAILED:  # single copy could not reach a peer: the call fails
            code, q = c.failure
            assert code > 0 and 0 <= q < size, (code, q)
            break
        if rc == _native.VIEWS:
            raise AssertionError("C asked for shared views of a call that has none")
        try:
            if rc == _native.CHECK:
                q = c.peer
                assert 0 < q < size, q
                rank0.group._check_peer(q, header, c.target)
                raise AssertionError(
                    f"C stopped on rank {q}'s announcement, which Python finds right: "
                    f"{rank0.arena.announced(q)} at epoch {rank0.arena.epoch_of(q)}, "
                    f"ours {header} at target {c.target}"
                )
            for q in c.lagging(c.target):  # PENDING: what the runner's poll does
                assert 0 < q < size, q
                rank0.group._check_peer(q, header, c.target)
        except (MismatchError, TransportError):
            break  # the call fails, as the runner would fail it
        rc = c.resume(BUDGET_NS)
    assert out is None or out.nbytes == before
