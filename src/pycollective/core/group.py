"""Process groups: who takes part, in which order, and how one collective is run for them.

A ProcessGroup is a subset of a World's ranks (the world itself included) with its own id
and sequence counter; every frame it sends carries both, so groups never confuse each
other's messages. Each call is one funnel (run_collective): the call's header, label and
flight-recorder entry, then the first runner that takes it (runners/) runs it in the
engine, and a failure is reported to every peer. The group never names a runner.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from .. import _callstate, _config, _log, runners
from .._buffers import TensorViews
from .._dtypes import DType
from .._errors import CollectiveError, CollectiveTimeout, UsageError
from .._reduce_ops import Kernel, ReduceOp, finish_average, kernel
from ..observe import flight as _flight
from ..observe.flight import Entry
from ..observe.timeline import WAIT as _WAIT
from ..runners import BaseRunner, Call, CompiledRunner, Members, Runner, Spec
from ..transport import _wire
from ..transport._wire import ALGO_CODE, Header
from .call import CallKey, CollectiveCall
from .work import Work
from .world import World

log = logging.getLogger("pycollective")

_new_header = tuple.__new__  # Header from a tuple, without NamedTuple's argument handling
# How long after a check of the transport a call on a runner that polls it while waiting
# may skip the check (run_collective).
_RECHECK_SECONDS = 0.001


class ProcessGroup:
    """A set of global ranks that run collectives together (torch's ProcessGroup)."""

    def __init__(
        self,
        world: World,
        ranks: Sequence[int],
        group_id: int,
        name: str,
        timeout: float | None = None,
    ) -> None:
        self.world = world
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.group_id = group_id
        self.group_name = name
        self.timeout = world.timeout if timeout is None else timeout
        self._rank = self.ranks.index(world.rank) if world.rank in self.ranks else -1
        # The sequence counter, the failure that made the group unusable (None: usable), and
        # when this rank last read its transport for abort notices and stray frames
        # (check_group) and whether the call since ran on a runner that polls it itself: one
        # record the compiled per-call path shares (_callstate.py).
        self.state = _callstate.group_state()
        # Object collectives run so far (api/objects.py): their payloads' MACs name the
        # call, so a payload of one cannot pass for another's.
        self.object_calls = 0
        self.object_pairs: dict[int, int] = {}  # the same, point to point, by peer
        self._peers = tuple(r for r in self.ranks if r != world.rank)
        # The runners that serve this group (runners/), set up at its first collective,
        # and what each distinct call needs, worked out at its first occurrence.
        self._runners: list[Runner] | None = None
        self._prepared: dict[tuple, _Prepared] = {}  # by CallKey (or its plain tuple)
        self._noted: set = set()  # the calls PYCOLLECTIVE_DEBUG=INFO has named (_log.py)
        # The compiled per-call path of repeated calls (a runner's `fast_path`, made at the
        # first call it can repeat; see _offer_fast), and the runner that made it. The API
        # functions try it first; it declines (False) whatever it does not know.
        self.fast: Any = None
        self._fast_runner: Runner | None = None
        # Views of the torch tensors of synchronous calls, so that a repeated one reaches
        # `fast` (which takes buffers): the API's functions and the torch backend's
        # methods find them here (_buffers.TensorViews).
        self.tensor_views = TensorViews()

    # torch spells these as methods
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self.ranks)

    @property
    def is_member(self) -> bool:
        return self._rank >= 0

    def group_rank(self, global_rank: int, what: str = "rank") -> int:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise UsageError(
                f"{what} {global_rank} is not a member of this group (ranks {list(self.ranks)})"
            ) from None

    @property
    def _seq(self) -> int:
        """The next collective's sequence number (state.seq)."""
        return self.state.seq

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.group_name} ranks={list(self.ranks)} rank={self._rank}>"

    # ------------------------------------------------------------------ running collectives

    def check_usable(self) -> None:
        if self.world.closed:
            raise UsageError("the process group was destroyed; call init_process_group again")
        failed = self.state.failed
        if failed is not None:
            raise CollectiveError(
                f"this group is unusable after an earlier failure: {failed}"
            ) from failed

    @property
    def members(self) -> Members:
        """What a runner is told about this group."""
        return Members(self.ranks, self._rank, self.group_id, self.timeout, self.world)

    def runner(self, kind: type) -> Runner | None:
        """This group's runner of a kind (runners.REGISTRY), or the one standing in for it
        (`replaces`: a compiled runner for the one it builds on); None if it has none (yet: they
        are set up at the group's first collective)."""
        return next(
            (
                r
                for r in self._runners or ()
                if type(r) is kind or getattr(r, "replaces", None) is kind
            ),
            None,
        )

    def algorithms(self, collective: str) -> list[str]:
        """The algorithm names this group lists for `collective`, "auto" first."""
        return ["auto", *runners.listed(collective, self._runners)]

    def choose_algorithm(
        self, collective: str, algorithm: str | None, count: int, dtype: DType, root: int
    ) -> str:
        """The algorithm this group runs for such a call (set up first if need be)."""
        if self._runners is None:
            self._set_up_runners()
        spec = Spec(collective, count, dtype, 0, root)
        return self._pick(spec, _config.algorithm_choice(collective, algorithm))[1]

    def _pick(self, spec: Spec, chosen: str) -> tuple[Runner, str]:
        """The runner and algorithm for `spec`: under "auto" the first runner that chooses
        one, else the first that accepts the name."""
        runners_ = self._runners or []
        if chosen == "auto":
            for r in runners_:
                algo = r.choose(spec)
                if algo is not None:
                    return r, algo
        else:
            for r in runners_:
                if r.accepts(spec.collective, chosen):
                    return r, chosen
        names = self.algorithms(spec.collective)
        raise UsageError(
            f"unknown algorithm {chosen!r} for {spec.collective}; choose one of {names}"
        )

    def _prepare(self, key: CallKey) -> _Prepared:
        """Work out, once, what every call of `key`'s kind needs."""
        op = key.op
        spec = Spec(
            key.collective,
            key.count,
            key.dtype,
            int(op) if op is not None else 0,
            key.root,
            key.send_counts,
            key.recv_counts,
        )
        runner, algo = self._pick(spec, _config.algorithm_choice(spec.collective, key.algorithm))
        prepared = _Prepared(
            spec,
            runner,
            algo,
            ALGO_CODE[algo],
            kernel(op, spec.dtype) if op is not None else None,
            runner.prepare(spec, algo),
            tuple(r for r in self._runners or () if r is not runner and _notes(r)),
        )
        # The header's fields but the sequence number and tag, in Header's order.
        prepared.head = (
            _wire.DATA, _wire.KIND_CODE[spec.collective], spec.dtype.code, spec.op,
            prepared.algo_code, self.group_id,
        )  # fmt: skip
        count = spec.count if key.header_count is None else key.header_count
        prepared.tail = (spec.root, count, 0)
        if len(self._prepared) >= _MAX_PREPARED:
            self._prepared.clear()  # a program of ever-new sizes: start over, stay bounded
        self._prepared[key] = prepared
        return prepared

    def run_collective(self, call: CollectiveCall) -> Work | None:
        """Run one collective on this rank (core/call.py): choose a runner, run it, finish
        (AVG, copies out). Arguments must already be validated: from here on a failure is
        a failure of the group, reported to every peer. After a call with a `fast_key`
        succeeds, the compiled path (`fast`) learns its signature."""
        st = self.state
        if st.failed is not None or self.world.closed:
            self.check_usable()
        if self._runners is None:
            self._set_up_runners()
        # The signature as a plain tuple (core/call.py): it finds what _prepare filed
        # under the CallKey with the same fields.
        prepared = self._prepared.get(call[1:10])  # call.py's KEY, a slice mypy can type
        if prepared is None:
            prepared = self._prepare(CallKey._make(call[1:10]))
        arrays, after, collective, count, dtype = (
            call.arrays,
            call.after,
            call.collective,
            call.count,
            call.dtype,
        )
        seq = st.seq
        st.seq = seq + 1
        header = _new_header(Header, prepared.head + (seq, 0) + prepared.tail)
        if _log.LOGGER.isEnabledFor(logging.DEBUG):  # PYCOLLECTIVE_DEBUG=DETAIL
            algo = prepared.algorithm
            label = f"{collective}#{seq}({algo}, {count} x {dtype.name})"
            _log.note_call(self._noted, self.group_name, self._rank, self.size(), collective,
                           call.algorithm, algo, label, count * dtype.itemsize)  # fmt: skip
        world = self.world
        flight = world.flight
        entry = flight.record(  # type: ignore[union-attr]
            self.group_id, self.group_name, seq, collective, count, dtype, prepared.algorithm,
            call.op, call.root,
        )  # fmt: skip

        def job() -> None:
            if st.failed is not None or world.closed:
                self.check_usable()
            now = entry.start()
            deadline = now + self.timeout
            call = Call(
                prepared.spec, prepared.algorithm, arrays, prepared.kernel, header, deadline,
                prepared.plan,
            )  # fmt: skip
            try:
                transport = world.transport
                if transport is not None and self._peers:
                    # An abort notice that came since the last call fails this one now,
                    # even if none of its own steps would touch the rank at fault. A runner
                    # that checks the transport itself whenever it waits (`polls`) lets the
                    # group skip this for a millisecond after the last check: a notice
                    # then shows at the call's first wait or within the millisecond.
                    if (
                        not prepared.polls
                        or not st.polled
                        or now - st.checked_at >= _RECHECK_SECONDS
                    ):
                        transport.check_group(self.group_id, seq, header)
                        st.checked_at = now
                    st.polled = prepared.polls
                for other in prepared.noted:
                    other.note(call)
                prepared.runner.run(call)
            except CollectiveError as exc:
                self._call_failed(exc, seq, entry, call)
                raise
            if after is not None and not (prepared.averages and type(after) is Average):
                after()
            entry.end()

        if call.async_op:
            label = f"{collective}#{seq}({prepared.algorithm}, {count} x {dtype.name})"
            return world.engine.submit(job, Work(label, call.result))
        world.engine.run(job)
        fast_key = call.fast_key
        if fast_key is not None and prepared.fast:
            self._offer_fast(prepared, fast_key, entry, arrays, after)
        return None

    def _call_failed(self, exc: CollectiveError, seq: int, entry: Any, call: Call) -> None:
        """A call failed on this rank: record it, fail the group (telling the peers) and,
        the first time, dump the flight recorder. The caller raises `exc`."""
        if isinstance(exc, CollectiveTimeout):
            _explain_timeout(exc, seq, self.timeout)
        entry.failed(exc)
        first = self.state.failed is None
        self.fail(exc, seq)
        if first:  # the error path may do I/O: leave the ring where diagnose reads it
            path = self.world.flight.dump(f"{type(exc).__name__} in {call.label}")  # type: ignore[union-attr]
            if path and isinstance(exc, CollectiveTimeout):
                exc.args = (f"{exc} (flight recorder: {path})",)

    # ------------------------------------------------------------------ the compiled path

    def _offer_fast(
        self, prepared: _Prepared, fast_key: tuple, entry: Any, arrays: dict, after: Any
    ) -> None:
        """After a synchronous call ran to completion: let its runner's compiled path
        repeat it (`fast`), if the runner has one and nothing about the call needs the
        Python path each time (another runner noting calls, a timeline, per-call logging,
        a step after the call)."""
        runner = cast(CompiledRunner, prepared.runner)  # prepared.fast: it has fast_path
        if self._fast_runner is not None and self._fast_runner is not runner:
            prepared.fast = False
            return
        world = self.world
        flight = world.flight
        if (
            prepared.noted
            or not self._peers
            or world.transport is None
            or (after is not None and not (prepared.averages and type(after) is Average))
            or flight is None
            or flight.timeline is not None
            or _WAIT.on
            or _log.LOGGER.isEnabledFor(logging.DEBUG)
        ):
            prepared.fast = False
            return
        plan = runner.compiled(prepared.plan, arrays)
        if plan is None:
            prepared.fast = False
            return
        if self.fast is None:
            self.fast = runner.fast_path(
                self, world.engine, flight, Entry, self._finish_fast, _RECHECK_SECONDS
            )  # it reads and writes self.state and world.engine.state
            if self.fast is None:
                prepared.fast = False
                return
            self._fast_runner = runner
        if flight.enabled and type(entry) is not Entry:
            return
        obj, key = fast_key
        if not self.fast.add(obj, key, plan, prepared, entry):
            prepared.fast = False

    def _finish_fast(
        self, prepared: _Prepared, seq: int, entry: Any, status: int, started: float
    ) -> None:
        """The rest of a call the compiled path started that needs Python (a wait past its
        budget, a peer whose announcement differs): the engine is this thread's (Engine.run's
        state) until this returns. Fails as run_collective's job does."""
        try:
            if entry is None:
                entry = _flight.OFF
            header = _new_header(Header, prepared.head + (seq, 0) + prepared.tail)
            call = Call(
                prepared.spec, prepared.algorithm, {}, prepared.kernel, header,
                started + self.timeout, prepared.plan,
            )  # fmt: skip
            try:
                cast(CompiledRunner, prepared.runner).resume(call, status)
            except CollectiveError as exc:
                self._call_failed(exc, seq, entry, call)
                raise
            entry.end()
        finally:
            self.world.engine.end_job()

    def _set_up_runners(self) -> None:
        """Before the first collective: set up every runner that can serve the group (the
        arena maps shared memory when every member is on this host, the hierarchy learns
        which member is on which host; runners/)."""
        world = self.world
        seq = self.state.seq

        def job() -> None:
            self.check_usable()
            if self._runners is not None:
                return  # another thread's first call got here first
            try:
                self._runners = runners.set_up(self.members)
            except CollectiveError as exc:
                self.fail(exc, seq)
                raise

        world.engine.run(job)

    def fail(self, exc: CollectiveError, seq: int = 0) -> None:
        """Mark the group unusable and tell its other members why (best effort). `seq` is
        the collective that failed: members still in an earlier one may finish it."""
        st = self.state
        if st.failed is None:
            st.failed = exc
            transport = self.world.transport
            if transport is not None and not self.world.closed:
                transport.abort(self._peers, self.group_id, exc, seq)


class Average:
    """AVG's last step, `finish_average` of the call's result: what run_collective calls
    after the call, unless its runner divided already (a runner with `averages`)."""

    __slots__ = ("arr", "dtype", "divisor")

    def __init__(self, arr: np.ndarray, dtype: DType, divisor: int) -> None:
        self.arr, self.dtype, self.divisor = arr, dtype, divisor

    def __call__(self) -> None:
        finish_average(self.arr, self.dtype, self.divisor)


def average_after(
    arr: np.ndarray, dtype: DType, op: ReduceOp | None, divisor: int
) -> Average | None:
    return Average(arr, dtype, divisor) if op is ReduceOp.AVG else None


def group_id_for(ranks: Sequence[int], nth: int) -> int:
    """A group id every member computes alike: from the ranks and how many groups with
    those same ranks were made before."""
    text = f"{','.join(map(str, ranks))}#{nth}".encode()
    return zlib.crc32(text) or 1


_MAX_PREPARED = 4096  # distinct calls remembered per group


class _Prepared:
    """What every call of one kind (collective, algorithm, count, dtype, op, root, ...)
    needs, worked out once: its spec, runner and algorithm, the reduction kernel, the
    runner's plan, the group's other runners that note each call (runners/_base.py), and
    the frame header but its sequence number (`head`, `tail`)."""

    __slots__ = (
        "spec", "runner", "algorithm", "algo_code", "kernel", "plan", "noted", "polls",
        "averages", "head", "tail", "fast",
    )  # fmt: skip

    def __init__(
        self,
        spec: Spec,
        runner: Runner,
        algorithm: str,
        algo_code: int,
        kernel: Kernel | None,
        plan: Any,
        noted: tuple[Runner, ...],
    ) -> None:
        self.spec = spec
        self.polls = bool(getattr(runner, "polls", False))
        # the runner divides AVG's result itself (fused into its reduction)
        self.averages = bool(getattr(runner, "averages", False))
        self.head: tuple = ()
        self.tail: tuple = ()
        # whether the group's compiled path may learn this call (False once it was refused)
        self.fast = hasattr(runner, "fast_path")
        self.runner = runner
        self.algorithm = algorithm
        self.algo_code = algo_code
        self.kernel = kernel
        self.plan = plan
        self.noted = noted


def _notes(runner: Runner) -> bool:
    """Whether a runner does anything in `note` (most do not: skip the call)."""
    note: object = type(runner).note
    return note is not BaseRunner.note


def _explain_timeout(exc: CollectiveTimeout, seq: int, timeout: float) -> None:
    """Say which call timed out, after how long, and how to change it."""
    if exc.seq is None:
        exc.seq = seq
    _config.with_timeout_hint(exc, timeout)
