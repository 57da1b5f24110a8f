"""Glue between a ProcessGroup and a shared-memory arena: who is on this host, the set-up
exchange, and running a collective over the arena with the group's error semantics.

At a group's first collective its members exchange (over TCP, once) a host identity, the
transport they want (PYCOLLECTIVE_TRANSPORT=auto|tcp|shm) and, from group rank 0, the
name of a fresh arena. If every member is on this host and none asked for tcp, all map
the arena and `auto` runs the collectives below over it; everything else (other
collectives, explicit `algorithm=` names, point-to-point) keeps running as schedules over
TCP, which also stays the control channel: abort notices, and the liveness of peers.

Errors keep TCP's semantics. Each rank announces in its control block which call it is in
(sequence number, kind, dtype, count, root, op, algorithm), for arena and TCP calls alike;
a rank checks its peers' announcements after the first phase of a call and whenever it
waits, so mismatched calls raise MismatchError naming both sides. A waiting rank polls
every POLL_SECONDS: the deadline (CollectiveTimeout naming the ranks it waits on), abort
notices and lost TCP connections of the peers it waits on (TransportError).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Sequence
from functools import lru_cache, partial

import numpy as np

from .. import _config
from .._dtypes import BYTE, DType
from .._errors import CollectiveError, CollectiveTimeout, TransportError, UsageError
from .._reduce_ops import Kernel, ReduceOp
from ..schedule import build as build_schedule
from ..shm import _hostid
from ..shm import arena as _arena
from ..shm import collectives as _coll
from ..shm import native as _shm_native
from ..shm import shared as _shared
from ..shm.arena import Arena, Segment
from ..transport import _wire
from ..transport._base import Transport
from ..transport._calls import describe_peer, judge_announcement, mismatch_error
from ..transport._wire import ALGO_CODE, Header
from ..tuning import params as _tuning
from ._base import BaseRunner, Call, Members, Need, Spec
from .executor import ScratchPool, run_schedule

ALGORITHM = "shm"
SETUP_ALGORITHM = "shm-setup"  # the name the set-up exchange carries in its frame headers
COLLECTIVES = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"}
)

_MODES = {"auto": 0, "tcp": 1, "shm": 2}
_RECORD = 160  # bytes each rank contributes to the set-up exchange
_NAME_AT, _NAME_END = 64, 128
_CPUS_AT, _CPUS_LEN = 32, 32  # this rank's CPU affinity, a bitmask of CPUs 0-255
# Single copy's offer: this rank's pid, the address in its memory of 8 random bytes (the
# nonce, beside them) a peer reads across processes to prove it can (shm/native.py
# probe_peer), and whether it offers at all.
_SC_PID, _SC_ADDR, _SC_NONCE, _SC_OFFER = 128, 136, 144, 152


def _cpu_mask() -> np.ndarray:
    """This rank's affinity as a bitmask; all zeros if it includes CPUs beyond 255."""
    cpus = _arena.affinity()
    mask = np.zeros(_CPUS_LEN * 8, np.uint8)
    if max(cpus, default=0) >= _CPUS_LEN * 8:
        return np.packbits(mask)
    mask[list(cpus)] = 1
    return np.packbits(mask)


def transport_mode() -> str:
    return str(_config.get("PYCOLLECTIVE_TRANSPORT"))


class LocalGroup:
    """A group whose members all share this host, and its arena (None for one rank)."""

    def __init__(
        self,
        arena: Arena | None,
        ranks: Sequence[int],
        group_id: int,
        transport: Transport | None,
    ) -> None:
        self.arena = arena
        self.ranks = tuple(ranks)
        self.group_id = group_id
        self.transport = transport
        self.me = arena.rank if arena is not None else 0
        self.peer_maps = _shared.PeerMaps()
        # every rank's pid when all agreed at set-up to all_reduce by single copy
        self.single_copy_pids: list[int] | None = None

    # ------------------------------------------------------------------ announcements

    def announce(self, header: Header) -> None:
        """Say which call this rank is in; done for TCP-run calls too."""
        if self.arena is not None:
            h = header
            self.arena.announce(h.seq, h.kind, h.dtype, h.count, h.root, h.op, h.algo)

    def _theirs(self, q: int, like: Header, ann: tuple | None = None) -> Header | None:
        if ann is None:
            ann = self.arena.announced(q)  # type: ignore[union-attr]
        if ann is None:
            return None
        seq, kind, dtype, count, root, op, algo = ann
        return Header(_wire.DATA, kind, dtype, op, algo, like.group, seq, 0, root, count, 0)

    def _check_peer(self, q: int, mine: Header, target: int) -> None:
        """Raise MismatchError if peer q is in a different call than ours. Peers announce
        before entering a phase and may move on right after it, so what q announced is
        judged together with where its counter is (read after the announcement)."""
        arena = self.arena
        ann = arena.announced(q)  # type: ignore[union-attr]
        arrived = arena.epoch_of(q) >= target  # type: ignore[union-attr]  # read after `ann`
        if ann is None or ann == _announcement(mine):
            return  # nothing yet, or the common case: the same call
        theirs = self._theirs(q, mine, ann)  # from `ann`: a fresh read could be newer
        if theirs is None:
            return
        diffs = judge_announcement(mine, theirs, arrived)
        if diffs:
            raise mismatch_error(self.ranks[self.me], mine, self.ranks[q], theirs, diffs)

    def _last_doing(self, q: int, mine: Header) -> str:
        """What peer q was last seen doing, in the words TCP uses for its frames."""
        theirs = self._theirs(q, mine)
        in_call = theirs is not None and theirs.seq == mine.seq
        return describe_peer(self.ranks[q], theirs, now_in=in_call)

    # ------------------------------------------------------------------ running

    def run(
        self,
        collective: str,
        arrays: dict[str, np.ndarray],
        dtype: DType,
        kernel: Kernel | None,
        header: Header,
        deadline: float,
        label: str,
        divisor: int = 0,
    ) -> None:
        """One arena call. `divisor` > 1 fuses AVG's division into the reduction (the
        hierarchy's steps on a host pass none: their AVG is a partial sum)."""
        arena = self.arena
        if arena is None:
            _run_alone(collective, arrays)
            return
        data = arrays.get("data")
        shared = (
            _shared.describe(data)
            if data is not None and collective in ("all_reduce", "reduce")
            else _shared.NOT_SHARED
        )
        h = header
        arena.announce(h.seq, h.kind, h.dtype, h.count, h.root, h.op, h.algo, shared)
        poll = self._poller(header, deadline, label)

        def check(target: int) -> None:
            for q in arena.peers:
                self._check_peer(q, header, target)

        sync = _coll.Sync(arena, poll, check)
        root = header.root
        red = _reducer(header.op, dtype, divisor) if kernel is not None else None
        if collective in ("all_reduce", "reduce"):
            # Worth asking the peers about their buffers only if mine is shared.
            shares = shared != _shared.NOT_SHARED
            views = partial(self._peer_views, data, label) if shares else None  # type: ignore[arg-type]
            if collective == "all_reduce":
                _coll.all_reduce(arena, data, red, sync, views)  # type: ignore[arg-type]
            else:
                _coll.reduce(arena, data, red, sync, root, views)  # type: ignore[arg-type]
        elif collective == "broadcast":
            _coll.broadcast(arena, arrays["data"], sync, root)
        elif collective == "all_gather":
            _coll.all_gather(arena, arrays["input"], arrays["output"], sync)
        elif collective == "reduce_scatter":
            out = arrays["output"]
            _coll.reduce_scatter(arena, arrays["input"], out, red, sync)  # type: ignore[arg-type]
        elif collective == "barrier":
            _coll.barrier(arena, sync)
        else:  # pragma: no cover - callers check COLLECTIVES
            raise UsageError(f"{collective} has no shared-memory algorithm")

    def _peer_views(self, data: np.ndarray, label: str) -> list[np.ndarray] | None:
        """Every rank's buffer of this call, if every rank announced a shared one (the same
        answer on every rank: asked after the call's first wait); else None."""
        arena = self.arena
        assert arena is not None  # noqa: S101 - only called with an arena
        described = [arena.shared_buffer(q) for q in range(arena.size)]
        if any(d[1] == 0 for d in described):
            return None
        views = []
        for q, (pid, fd1, ino, off, length) in enumerate(described):
            if q == arena.rank:
                views.append(data)
                continue
            try:
                views.append(self.peer_maps.view(pid, fd1, ino, off, length, data.dtype, data.size))
            except OSError as exc:
                raise TransportError(
                    f"rank {self.ranks[self.me]} cannot map rank {self.ranks[q]}'s shared "
                    f"buffer for {label} ({exc}); use ordinary arrays or "
                    "PYCOLLECTIVE_TRANSPORT=tcp"
                ) from exc
        return views

    def raise_known_cause(self, header: Header, culprit: int) -> None:
        """Raise what made this call fail, if this rank can tell: a peer's abort notice
        for it (or an earlier call), or the loss of a member other than `culprit`. A
        single copy that found `culprit`'s process gone (ESRCH) is most often the end of
        the story, not its start: `culprit` raised for another member's loss, told us,
        and exited while we were reading its buffer. Its notice was sent before it
        exited, so it is already in our socket."""
        transport = self.transport
        if transport is None:
            return
        transport.check_group(self.group_id, header.seq)
        lost = transport.lost_peers()
        me = self.ranks[self.me]
        for g in self.ranks:
            if g != culprit and g in lost:
                raise TransportError(f"rank {me} lost rank {g}: {lost[g]}", peer=g)

    def _poller(self, header: Header, deadline: float, label: str, check_calls: bool = True):
        arena = self.arena
        assert arena is not None  # noqa: S101 - only called with an arena
        transport = self.transport
        me = self.ranks[self.me]

        def poll(target: int) -> None:
            lagging = arena.lagging(target)
            if check_calls:
                for q in lagging:
                    self._check_peer(q, header, target)
            if transport is not None:
                transport.check_group(self.group_id, header.seq, header)
                lost = transport.lost_peers()
                if lost and any(self.ranks[q] in lost for q in lagging):
                    # A peer may have arrived since `lagging` was read, then finished and
                    # exited (a job's last barrier): only one that still lags now that its
                    # loss is seen is lost to this call.
                    for q in arena.lagging(target):
                        g = self.ranks[q]
                        if g in lost:
                            raise TransportError(f"rank {me} lost rank {g}: {lost[g]}", peer=g)
            if time.monotonic() >= deadline and lagging:
                waiting = [self.ranks[q] for q in lagging]
                doing = "; ".join(self._last_doing(q, header) for q in lagging)
                raise CollectiveTimeout(
                    f"rank {me}: {label or 'operation'} timed out waiting for rank(s) {waiting}"
                    f" ({doing})",
                    op=label or None,
                    waiting_on=waiting,
                )

        return poll


def _announcement(h: Header) -> tuple[int, int, int, int, int, int, int]:
    return (h.seq, h.kind, h.dtype, h.count, h.root, h.op, h.algo)


@lru_cache(maxsize=256)
def _reducer(op: int, dtype: DType, divisor: int) -> _coll.Reducer:
    return _coll.reducer(ReduceOp(op), dtype, divisor)


_AVG = int(ReduceOp.AVG)


def _run_alone(collective: str, arrays: dict[str, np.ndarray]) -> None:
    if collective in ("all_gather", "reduce_scatter"):
        arrays["output"][:] = arrays["input"]


# ---------------------------------------------------------------------- set-up


def setup(
    ranks: Sequence[int],
    me: int,
    group_id: int,
    transport: Transport | None,
    algo_code: int,
    deadline: float,
    pool: ScratchPool,
) -> LocalGroup | None:
    """Run by every member before a group's first collective (in the engine). Returns the
    LocalGroup when the arena serves this group, else None (TCP only).

    The exchange runs under a group id of its own, so it takes no sequence number from
    the group (flight-recorder numbering stays that of the user's calls). If it fails here,
    peers still in it are told under that id as well as the group's (ProcessGroup.fail)."""
    mode = transport_mode()
    header = setup_header(group_id, algo_code)
    try:
        return _setup(ranks, me, group_id, transport, header, deadline, pool, mode)
    except CollectiveError as exc:
        if transport is not None:
            peers = [g for g in ranks if g != ranks[me]]
            transport.abort(peers, header.group, exc, 0)
        raise


def _setup(
    ranks: Sequence[int],
    me: int,
    group_id: int,
    transport: Transport | None,
    header: Header,
    deadline: float,
    pool: ScratchPool,
    mode: str,
) -> LocalGroup | None:
    p = len(ranks)
    if p == 1 or transport is None:
        return LocalGroup(None, ranks, group_id, transport) if mode != "tcp" else None
    segment: Segment | None = None
    try:
        record = np.zeros(_RECORD, np.uint8)
        record[:16] = np.frombuffer(_hostid.host_id(), np.uint8)
        record[16] = _MODES[mode]
        record[_CPUS_AT : _CPUS_AT + _CPUS_LEN] = _cpu_mask()
        nonce = np.frombuffer(os.urandom(8), np.uint8).copy()  # alive until set-up ends
        if _shm_native.single_copy_wanted():
            record[_SC_PID : _SC_PID + 8] = _int64_bytes(os.getpid())
            record[_SC_ADDR : _SC_ADDR + 8] = _int64_bytes(nonce.ctypes.data)
            record[_SC_NONCE : _SC_NONCE + 8] = nonce
            record[_SC_OFFER] = 1
        cores = _tuning.cores()
        slot_bytes = _arena.slot_bytes_for(p, cores)
        if me == 0 and mode != "tcp":
            segment, note = _create(p, slot_bytes)
            if segment is not None:
                record[17] = 1
                record[24:32] = np.frombuffer(np.int64(slot_bytes).tobytes(), np.uint8)
                arena = Arena(segment, p, 0, slot_bytes, cores, ranks)
                arena.chunk_bytes = _arena.chunk_bytes_for(_shm_native.enabled(_wire.KIND_CODE))
                arena.init_header()
            text = note.encode()[: _NAME_END - _NAME_AT]
            record[_NAME_AT : _NAME_AT + len(text)] = np.frombuffer(text, np.uint8)
        everyone = np.zeros(p * _RECORD, np.uint8)
        plan = build_schedule("all_gather", "ring", me, p, _RECORD)
        run_schedule(
            plan,
            {"input": record, "output": everyone},
            BYTE,
            None,
            transport,
            ranks,
            header,
            deadline,
            pool,
            "shm-setup",
        )
        recs = everyone.reshape(p, _RECORD)
        same_host = all(bytes(recs[q, :16]) == bytes(recs[0, :16]) for q in range(p))
        modes = {int(recs[q, 16]) for q in range(p)}
        created = bool(recs[0, 17])
        use = same_host and _MODES["tcp"] not in modes and created
        if not use:
            if mode == "shm":
                if not same_host:
                    why = "not every rank is on this host"
                elif _MODES["tcp"] in modes:
                    why = "a rank asked for PYCOLLECTIVE_TRANSPORT=tcp"
                else:
                    why = bytes(recs[0, _NAME_AT:_NAME_END]).rstrip(b"\0").decode(errors="replace")
                raise UsageError(
                    f"PYCOLLECTIVE_TRANSPORT=shm, but the group {list(ranks)} cannot use "
                    f"shared memory: {why}"
                )
            return None
        if me != 0:
            name, slot_bytes = _arena_of(recs[0], ranks, me)
            try:
                segment = Segment.attach(name, _arena.layout(p, slot_bytes)[2])
                arena = Arena(segment, p, me, slot_bytes, cores, ranks)
                arena.check_header()
            except (OSError, ValueError) as exc:
                raise TransportError(
                    f"rank {ranks[me]} cannot map the group's shared-memory arena ({exc}); "
                    "set PYCOLLECTIVE_TRANSPORT=tcp to run without it"
                ) from exc
        else:
            arena.check_header()
        # The group's cores: the union of every member's affinity (a launcher may pin each
        # rank to a core of its own: then no rank is short of one).
        union = np.bitwise_or.reduce(recs[:, _CPUS_AT : _CPUS_AT + _CPUS_LEN], axis=0)
        if union.any():
            arena.set_cores(int(np.unpackbits(union).sum()))
        group = LocalGroup(arena, ranks, group_id, transport)
        reached = _probe_peers(recs, me)
        arena.ctrl[me * _arena.WORDS + _arena.SC_ERR] = int(reached)  # read after the phase
        # Every member has mapped it once all pass this phase: then the name can go.
        # No call checks here: the exchange above already agreed on the call, and a peer
        # that passes this phase may at once announce the group's first call, whose
        # sequence number (0) is the set-up's too.
        poll = LocalGroup(arena, ranks, header.group, transport)._poller(
            header, deadline, "shm-setup", check_calls=False
        )
        arena.wait_all(arena.bump(), poll)
        if all(arena.ctrl[q * _arena.WORDS + _arena.SC_ERR] == 1 for q in range(p)):
            group.single_copy_pids = [_int64_at(recs[q], _SC_PID) for q in range(p)]
        return group
    finally:
        if segment is not None:
            segment.unlink()


def _int64_bytes(value: int) -> np.ndarray:
    return np.frombuffer(np.int64(value).tobytes(), np.uint8)


def _int64_at(record: np.ndarray, at: int) -> int:
    return int(np.frombuffer(bytes(record[at : at + 8]), np.int64)[0])


def _probe_peers(recs: np.ndarray, me: int) -> bool:
    """Whether every rank offered single copy and this one can reach every peer's memory
    (its nonce read back from its pid at its address: the peer that sent them, reachable
    under the system's rules). Peers' records are data: probe_peer bounds pid and address.

    Every pid must be distinct and no peer's this rank's own: a peer replaying this rank's
    own record (or another member's) would pass the probe, since this rank may always read
    itself, and then steer our reads and writes into our own memory (or that member's)
    at addresses its words name, past Yama's rule that siblings may not touch each other."""
    if not all(recs[q, _SC_OFFER] == 1 for q in range(len(recs))):
        return False
    pids = [_int64_at(recs[q], _SC_PID) for q in range(len(recs))]
    if pids[me] != os.getpid() or len(set(pids)) != len(pids):
        return False
    return all(
        _shm_native.probe_peer(
            _int64_at(recs[q], _SC_PID),
            _int64_at(recs[q], _SC_ADDR) & ((1 << 64) - 1),
            bytes(recs[q, _SC_NONCE : _SC_NONCE + 8]),
        )
        for q in range(len(recs))
        if q != me
    )


def _arena_of(record: np.ndarray, ranks: Sequence[int], me: int) -> tuple[str, int]:
    """The arena name and slot size in rank 0's set-up record: bytes from a peer, so
    checked to be exactly what the library makes (a name of Segment.create's pattern, no
    path in it; a slot size slot_bytes_for could choose) before anything is opened."""
    raw = bytes(record[_NAME_AT:_NAME_END]).rstrip(b"\0")
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        name = ""
    if not _arena.is_segment_name(name):
        raise TransportError(
            f"rank {ranks[me]}: rank {ranks[0]}'s set-up record holds no arena name the "
            f"library makes ({raw[:80]!r}); set PYCOLLECTIVE_TRANSPORT=tcp to run without "
            "shared memory",
            peer=ranks[0],
        )
    slot_bytes = int(np.frombuffer(bytes(record[24:32]), np.int64)[0])
    if not _arena.check_slot_bytes(slot_bytes):
        raise TransportError(
            f"rank {ranks[me]}: rank {ranks[0]}'s set-up record holds a slot size the library "
            f"never makes ({slot_bytes} bytes; a multiple of 4096 up to "
            f"{_arena.MAX_SLOT_BYTES}); set PYCOLLECTIVE_TRANSPORT=tcp to run without shared "
            "memory",
            peer=ranks[0],
        )
    return name, slot_bytes


def _create(p: int, slot_bytes: int) -> tuple[Segment | None, str]:
    """Rank 0's arena, and its name (or why there is none) for the others."""
    if p > _arena.MAX_RANKS:
        return None, f"groups above {_arena.MAX_RANKS} ranks use TCP"
    if not _arena.available():
        return None, f"{_arena.SHM_DIR} is not writable"
    try:
        segment = Segment.create(_arena.layout(p, slot_bytes)[2])
    except OSError as exc:
        return None, f"cannot create an arena: {exc}"[: _NAME_END - _NAME_AT]
    return segment, segment.name


def setup_header(group_id: int, algo_code: int) -> Header:
    """The frame header of the set-up exchange: under an id derived from the group's."""
    setup_id = zlib.crc32(b"shm-setup/%d" % group_id) or 1
    kind = _wire.KIND_CODE["all_gather"]
    return Header(_wire.DATA, kind, BYTE.code, 0, algo_code, setup_id, 0, 0, 0, _RECORD, 0)


class ArenaRunner(BaseRunner):
    """The runner of the arena's collectives ("shm"), for groups whose members all share
    this host; `auto` takes it for every collective it has. It also tells the arena which
    call this rank is in when another runner runs it (`note`), so a peer waiting in the
    arena sees a mismatched call at once."""

    averages = True  # AVG's division is part of its reduction (run_collective skips it)
    polls = True  # it checks the transport whenever a call waits (run_collective may not)

    def __init__(self, members: Members, group: LocalGroup) -> None:
        self.members = members
        self.local_group = group  # the members on this host and their arena

    @classmethod
    def set_up(cls, members: Members, need: Need) -> ArenaRunner | None:
        group = setup(
            members.ranks,
            members.me,
            members.group_id,
            members.transport,
            ALGO_CODE[SETUP_ALGORITHM],
            time.monotonic() + members.timeout,
            members.pool,
        )
        return None if group is None else cls(members, group)

    @staticmethod
    def names(collective: str) -> tuple[str, ...]:
        return (ALGORITHM,) if collective in COLLECTIVES else ()

    def offers(self, collective: str) -> tuple[str, ...]:
        return self.names(collective)

    def choose(self, spec: Spec) -> str | None:
        return ALGORITHM if spec.collective in COLLECTIVES else None

    def note(self, call: Call) -> None:
        self.local_group.announce(call.header)

    def run(self, call: Call) -> None:
        spec = call.spec
        self.local_group.run(
            spec.collective,
            call.arrays,
            spec.dtype,
            call.kernel,
            call.header,
            call.deadline,
            call.label,
            self.members.size if spec.op == _AVG else 0,  # AVG's division, fused
        )
