"""The compiled arena as a runner: the arena's collectives run by pycollective._native.

It is registered ahead of the Python ArenaRunner and builds on it (`need`): the segment,
the set-up exchange, the announcements and the error semantics (deadline, dead peers,
abort notices, mismatches) are the Python runner's LocalGroup's; what runs compiled is
the call itself (shm/native.py, csrc/arena.c): announce, copy in, phases, fused
reductions in rank order, copy out. Both compute the same bits with the same phases and
buffers, so the two runners are interchangeable rank by rank; `PYCOLLECTIVE_NATIVE=0` or
a missing extension (one warning) leaves the Python runner in its place.

The per-call path is short: what a call signature needs (the compiled Plan, which arrays
it reads and writes) is prepared once, and the Python objects only the slow paths use (the
poller, the mismatch check, the peers' shared buffers) are made only when a call waits
longer than the budget, or a peer's announcement differs, or buffers may be shared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._reduce_ops import ReduceOp
from ..observe.flight import COMPLETED, RUNNING
from ..observe.timeline import WAIT as _WAIT
from ..shm import collectives as _coll
from ..shm import native as _shm_native
from ..shm import shared as _shared
from ..transport import _wire
from ._base import BaseRunner, Call, Members, Need, Spec
from .arena import ALGORITHM, COLLECTIVES, ArenaRunner, LocalGroup

_AVG = int(ReduceOp.AVG)
_IN_OUT = {  # which of a call's arrays the compiled collective reads and writes
    "all_reduce": (None, "data"),
    "reduce": (None, "data"),
    "broadcast": (None, "data"),
    "all_gather": ("input", "output"),
    "reduce_scatter": ("input", "output"),
    "barrier": (None, None),
}


class _Prepared:
    """One call signature, prepared: the compiled Plan (made at the first call, from its
    header: the announcement words), the names of its arrays, whether it may share."""

    __slots__ = ("collective", "plan", "inp", "out", "shareable")

    def __init__(self, collective: str) -> None:
        self.collective = collective
        self.plan: Any = None
        self.inp, self.out = _IN_OUT[collective]
        self.shareable = collective in ("all_reduce", "reduce")


class NativeArenaRunner(BaseRunner):
    """The arena's collectives ("shm"), compiled. See the module's docstring."""

    replaces = ArenaRunner  # the group holds this one instead (runners.set_up)
    polls = True  # it checks the transport whenever a call waits (the group may skip it)
    averages = True  # AVG's division is fused into its reduction (the group skips it)

    def __init__(self, members: Members, python: ArenaRunner) -> None:
        self.members = members
        self.python = python
        self.local_group: LocalGroup = python.local_group  # what the hierarchy and tests read
        arena = self.local_group.arena
        assert arena is not None  # noqa: S101 - set_up checks
        # the group's chunk (rank 0's choice, in the arena's header): ranks must agree
        self.native = _shm_native.NativeArena(arena, _coll.SMALL_BYTES, arena.chunk_bytes)
        self.single_copy = single_copy(self.native, self.local_group)

    @classmethod
    def set_up(cls, members: Members, need: Need) -> NativeArenaRunner | None:
        if members.size == 1 or not _shm_native.enabled(_wire.KIND_CODE):
            return None
        python = need(ArenaRunner)
        if not isinstance(python, ArenaRunner) or python.local_group.arena is None:
            return None
        return cls(members, python)

    @staticmethod
    def names(collective: str) -> tuple[str, ...]:
        return ArenaRunner.names(collective)

    def offers(self, collective: str) -> tuple[str, ...]:
        return self.names(collective)

    def choose(self, spec: Spec) -> str | None:
        return ALGORITHM if spec.collective in COLLECTIVES else None

    def prepare(self, spec: Spec, algorithm: str) -> _Prepared:
        return _Prepared(spec.collective)

    def note(self, call: Call) -> None:
        self.local_group.announce(call.header)

    def run(self, call: Call) -> None:
        prep: _Prepared = call.plan
        h = call.header
        plan = prep.plan
        if plan is None:
            rooted = call.spec.collective in ("reduce", "broadcast")
            plan = prep.plan = self.native.plan(
                h.kind,
                h.dtype,
                h.op if call.kernel is not None else 0,
                h.root if rooted else -1,
                self.members.size if h.op == _AVG and call.kernel is not None else 0,
                (h.kind, h.dtype, h.count, h.root, h.op, h.algo),
            )
        arrays = call.arrays
        inp = arrays[prep.inp] if prep.inp else None
        out = arrays[prep.out] if prep.out else None
        share = None
        if prep.shareable:
            described = _shared.describe(out)  # type: ignore[arg-type]
            if described != _shared.NOT_SHARED:
                share = described
        c = self.native.c
        if _WAIT.on:  # PYCOLLECTIVE_TIMELINE: the time spent waiting for peers
            w0 = c.wait_ns
            try:
                self._run(c, plan, inp, out, call, share)
            finally:
                _WAIT.total += (c.wait_ns - w0) * 1e-9
        else:
            self._run(c, plan, inp, out, call, share)

    # The group's compiled path of repeated calls (core/group.py `fast`): the collectives it
    # repeats, at most this large (larger calls may share buffers: their Python path maps
    # the peers' ones), except all_reduce, broadcast, all_gather and reduce_scatter where
    # single copy is on, of any size (C takes single copy or the pipeline by size: all_reduce
    # above 4 MiB, broadcast up to 16 MiB): the path declines a call
    # whose buffer may be shared memory (csrc/callpath.c maybe_mapped). It saves the Python
    # path's few microseconds a call (1 MiB: 92 against 94 us, docs/shm.md).
    SINGLE_COPY = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
    FAST = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier")
    FAST_BYTES = _coll.SMALL_BYTES

    def compiled(self, prep: _Prepared, arrays: dict[str, np.ndarray]) -> Any:
        """The compiled Plan that repeats a call of this signature that just ran, or None
        if the compiled path does not take it."""
        plan = prep.plan
        if plan is None or _WAIT.on:
            return None
        out = arrays.get(prep.out) if prep.out else None
        if out is not None:
            large = out.nbytes > self.FAST_BYTES
            if large and not (self.single_copy and prep.collective in self.SINGLE_COPY):
                return None
            if prep.shareable and _shared.describe(out) != _shared.NOT_SHARED:
                return None
        return plan if prep.collective in self.FAST else None

    def fast_path(
        self,
        group: Any,
        engine: Any,
        recorder: Any,
        entry_type: type,
        finish: Any,
        recheck_seconds: float,
    ) -> Any:
        """The group's compiled path (_native.CallPath) over this runner's arena: it reads
        and advances the group's state (failed, polled, checked_at, seq) and holds the
        engine's (its lock, idle), both C-owned records (_callstate.py), and hands a call
        that needs Python to `finish(prepared, seq, entry, status, started)`; it skips
        calls when the group last read the transport `recheck_seconds` ago or longer (the
        group's own rule)."""
        return self.native.call_path(
            group.state, engine.state, recorder if recorder.enabled else None, entry_type,
            finish, RUNNING, COMPLETED, recheck_seconds,
        )  # fmt: skip

    def resume(self, call: Call, status: int) -> None:
        """Go on with a call the compiled path started and handed back with `status`."""
        self._finish(self.native.c, status, None, call)

    def _run(
        self,
        c: Any,
        plan: Any,
        inp: np.ndarray | None,
        out: np.ndarray | None,
        call: Call,
        share: tuple[int, int, int, int] | None,
    ) -> None:
        rc = c.run(plan, inp, out, call.header.seq, _shm_native.BUDGET_NS, share)
        if rc:  # it waited past the budget, or needs a judgement: the slow path
            self._finish(c, rc, out, call)

    def _finish(self, c: Any, rc: int, out: np.ndarray | None, call: Call) -> None:
        finish_call(
            c, rc, self.local_group, call.header, call.deadline, call.label,
            call.spec.collective, out,
        )  # fmt: skip


# all_reduce goes by single copy only from this size. Below it the arena's pipeline is
# faster since its copies skip memcpy's skewed case (csrc/copy.c): there each rank copies
# only its own share in and the result out, where single copy reads every peer's share
# across processes and writes the reduced share back into each. p=2 pinned, alternating,
# pipeline against single copy (AMD EPYC, 32 MiB L3): 1 MiB 91 / 151 us, 4 MiB 302 / 445
# us, 16 MiB 2.17 / 2.32 ms, 32 MiB 5.66 / 4.86 ms. Above 4 MiB the pipeline's phase per
# chunk makes it the one a rank off its core holds back: in the job, run by run, 8 MiB
# took 1.22-2.51 ms by the pipeline and 1.19-1.47 ms by single copy, whose pieces go to
# whichever rank runs (docs/shm.md).
ALL_REDUCE_SINGLE_COPY_BYTES = (4 << 20) + 1


def single_copy(native: _shm_native.NativeArena, group: LocalGroup) -> bool:
    """Turn single copy on in `native` if every rank of `group` offered it at set-up and
    reaches every other (LocalGroup.single_copy_pids); whether it did."""
    pids = group.single_copy_pids
    if pids is not None:
        native.c.set_single_copy(
            _coll.SMALL_BYTES + 1, _shm_native.SINGLE_COPY_PIECE_BYTES, pids,
            ALL_REDUCE_SINGLE_COPY_BYTES,
        )  # fmt: skip
    return pids is not None


def finish_call(
    c: Any,
    rc: int,
    group: LocalGroup,
    header: Any,
    deadline: float,
    label: str,
    collective: str,
    out: np.ndarray | None,
) -> None:
    """Drive a compiled arena call that returned `rc` (not done) to its end, with the
    Python arena's polls and checks (deadline, dead peer, abort notices, a peer's
    differing announcement), raising as the Python arena would."""
    poll = group._poller(header, deadline, label)
    while rc:
        if rc == _shm_native.FAILED:  # every rank of the call raises: see single_copy_error
            code, q = c.failure
            group.raise_known_cause(header, group.ranks[q])
            raise _shm_native.single_copy_error((code, q), group.ranks[q], collective)
        if rc == _shm_native.PENDING:
            poll(c.target)
        elif rc == _shm_native.CHECK:
            group._check_peer(c.peer, header, c.target)
        else:
            c.set_views(group._peer_views(out, label))  # type: ignore[arg-type]
        rc = c.resume(_shm_native.BUDGET_NS)


class CompiledSteps:
    """A LocalGroup's calls run by the compiled arena (the hierarchy's steps inside one
    host: runners/hierarchical.py), with its polls and checks when a call waits. The
    group's arena must be this object's alone from here on: the compiled arena keeps its
    own place in the arena's buffers."""

    def __init__(self, group: LocalGroup) -> None:
        arena = group.arena
        assert arena is not None  # noqa: S101 - callers check
        self.group = group
        self.native = _shm_native.NativeArena(arena, _coll.SMALL_BYTES, arena.chunk_bytes)
        self.single_copy = single_copy(self.native, group)  # (its all-gather step)

    @staticmethod
    def available(group: LocalGroup | None) -> bool:
        """Whether the compiled arena can serve `group` (built, matching, wanted)."""
        return (
            group is not None and group.arena is not None and _shm_native.enabled(_wire.KIND_CODE)
        )

    def run(
        self,
        collective: str,
        arrays: dict[str, np.ndarray],
        kernel: Any,
        header: Any,
        deadline: float,
        label: str,
    ) -> None:
        """One call, as LocalGroup.run takes it (`arrays`: "data", or "input" and
        "output"); AVG is summed (no divisor), as the hierarchy's steps want it."""
        h = header
        rooted = collective in ("reduce", "broadcast")
        plan = self.native.plan(
            _wire.KIND_CODE[collective],
            h.dtype,
            h.op if kernel is not None else 0,
            h.root if rooted else -1,
            0,
            (h.kind, h.dtype, h.count, h.root, h.op, h.algo),
        )
        inp = arrays.get("input")
        out = arrays["output"] if inp is not None else arrays["data"]
        c = self.native.c
        rc = c.run(plan, inp, out, h.seq, _shm_native.BUDGET_NS, None)
        if rc:
            finish_call(c, rc, self.group, h, deadline, label, collective, out)
