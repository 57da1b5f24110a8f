"""Process groups: who takes part, in which order, and how a collective is run for them.

A World is what init_process_group builds once per process: the transport to every other
rank, the store, the engine that orders operations, and scratch memory. A ProcessGroup is a
subset of the world's ranks (the world itself included) with its own id and sequence
counter; every frame it sends carries both, so groups never confuse each other's messages.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from .. import _log, schedule
from .._dtypes import DType
from .._errors import CollectiveError, CollectiveTimeout, UsageError
from .._reduce_ops import ReduceOp, finish_average, kernel
from ..runners import arena as _shm
from ..runners import hierarchical as _hier
from ..runners.executor import Plan, make_plan, run_schedule
from ..transport import _wire
from ..transport._wire import ALGO_CODE, Header
from ..tuning import params as _tuning
from .work import Work
from .world import World

log = logging.getLogger("pycollective")


@lru_cache(maxsize=4096)
def _cached_schedule(
    collective: str,
    algorithm: str,
    rank: int,
    size: int,
    count: int,
    root: int,
    segment: int,
    send_counts: tuple[int, ...] | None,
    recv_counts: tuple[int, ...] | None,
) -> Plan:
    """This rank's schedule, digested for the executor; built once per distinct call."""
    return make_plan(
        schedule.build(
            collective,
            algorithm,
            rank,
            size,
            count,
            root=root,
            segment=segment,
            send_counts=send_counts,
            recv_counts=recv_counts,
        )
    )


def _size_class(count: int) -> int:
    """Counts are priced at the next power of two, so auto's choice is cached per octave
    instead of recomputed for every new size (pricing builds every rank's schedule)."""
    return 0 if count <= 0 else 1 << (count - 1).bit_length()


def _auto_choice(transport: str, collective: str, size: int, count: int, itemsize: int) -> str:
    # The job's parameters (rank 0's: the same on every rank), with the group's CPU share.
    params = _tuning.group_params(transport, size)
    return _select(params, collective, size, count, itemsize)


@lru_cache(maxsize=2048)
def _select(
    params: schedule.cost.CostParams, collective: str, size: int, count: int, itemsize: int
) -> str:
    segment = max(1, _tuning.CHAIN_SEGMENT_BYTES // itemsize)
    # Costs do not depend on the root (schedules are built relative to it): price root 0.
    return schedule.cost.select(collective, size, count, itemsize, params, segment=segment)


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
        self._seq = 0
        self._failed: CollectiveError | None = None
        self._peers = tuple(r for r in self.ranks if r != world.rank)
        # Set at the group's first collective: the shared-memory arena when every member
        # is on this host (shm/local.py), else None.
        self.shm: _shm.LocalGroup | None = None
        self._shm_known = False
        # Also set then: which member is on which host (_hierarchy.py); None for one rank.
        self.hierarchy: _hier.Hierarchy | None = None
        self._noted: set = set()  # the calls PYCOLLECTIVE_DEBUG=INFO has named (_log.py)

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

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.group_name} ranks={list(self.ranks)} rank={self._rank}>"

    # ------------------------------------------------------------------ running collectives

    def check_usable(self) -> None:
        if self.world.closed:
            raise UsageError("the process group was destroyed; call init_process_group again")
        if self._failed is not None:
            raise CollectiveError(
                f"this group is unusable after an earlier failure: {self._failed}"
            ) from self._failed

    def choose_algorithm(
        self, collective: str, algorithm: str | None, count: int, dtype: DType, root: int
    ) -> str:
        names = schedule.ALGORITHMS[collective]
        local = self.shm is not None and collective in _shm.COLLECTIVES
        if local:
            names = (*names, _shm.ALGORITHM)
        if collective == "all_reduce":
            names = (*names, _hier.ALGORITHM)
        chosen = (
            algorithm or os.environ.get(f"PYCOLLECTIVE_{collective.upper()}_ALGORITHM") or "auto"
        )
        if chosen == "auto":
            if local:
                return _shm.ALGORITHM
            if collective == "all_reduce" and self.hierarchy is not None:
                if self.hierarchy.layout.prefers_hierarchy():
                    return _hier.ALGORITHM
            if len(names) == 1:
                return names[0]
            best = _auto_choice(
                self.world.transport_name,
                collective,
                self.size(),
                _size_class(count),
                dtype.itemsize,
            )
            log.debug(
                "auto chose %s for %s of %d x %s on %d ranks",
                best,
                collective,
                count,
                dtype.name,
                self.size(),
            )
            return best
        if chosen not in names:
            raise UsageError(
                f"unknown algorithm {chosen!r} for {collective}; choose one of {['auto', *names]}"
            )
        return chosen

    def run_collective(
        self,
        collective: str,
        *,
        arrays: dict[str, np.ndarray],
        dtype: DType,
        count: int,
        algorithm: str | None = None,
        op: ReduceOp | None = None,
        root: int = 0,
        header_count: int | None = None,
        send_counts: tuple[int, ...] | None = None,
        recv_counts: tuple[int, ...] | None = None,
        after: Callable[[], None] | None = None,
        async_op: bool = False,
        result: Any = None,
    ) -> Work | None:
        """Run one collective on this rank: choose, build, execute, finish (AVG, copies out).

        `root` is a group rank. Arguments must already be validated: from here on a failure
        is a failure of the group, reported to every peer.
        """
        self.check_usable()
        if not self._shm_known:
            self._set_up_shm()
        algo = self.choose_algorithm(collective, algorithm, count, dtype, root)
        segment = max(1, _tuning.CHAIN_SEGMENT_BYTES // dtype.itemsize)
        sched = (
            None
            if algo in (_shm.ALGORITHM, _hier.ALGORITHM)
            else _cached_schedule(
                collective,
                algo,
                self._rank,
                self.size(),
                count,
                root,
                segment,
                send_counts,
                recv_counts,
            )
        )
        seq = self._seq
        self._seq += 1
        header = Header(
            _wire.DATA,
            _wire.KIND_CODE[collective],
            dtype.code,
            int(op) if op is not None else 0,
            ALGO_CODE[algo],
            self.group_id,
            seq,
            0,
            root,
            count if header_count is None else header_count,
            0,
        )
        red_kernel = kernel(op, dtype) if op is not None else None
        label = f"{collective}#{seq}({algo}, {count} x {dtype.name})"
        if _log.LOGGER.isEnabledFor(logging.INFO):  # PYCOLLECTIVE_DEBUG=INFO|DETAIL
            _log.note_call(self._noted, self.group_name, self._rank, self.size(), collective,
                           algorithm, algo, label, count * dtype.itemsize)  # fmt: skip
        world = self.world
        flight = world.flight
        entry = flight.record(  # type: ignore[union-attr]
            self.group_id, self.group_name, seq, collective, count, dtype, algo, op, root
        )

        def job() -> None:
            self.check_usable()
            entry.start()
            deadline = time.monotonic() + self.timeout
            try:
                if world.transport is not None and self._peers:
                    # An abort notice that came since the last call fails this one now,
                    # even if none of its own steps would touch the rank at fault.
                    world.transport.check_group(self.group_id, seq, header)
                if algo == _hier.ALGORITHM:
                    if self.hierarchy is not None:  # None: one rank, nothing to do
                        self.hierarchy.run(
                            arrays,
                            dtype,
                            red_kernel,
                            header,
                            deadline,
                            label,
                            world.transport,
                            world.pool,
                        )
                elif sched is None:
                    self.shm.run(  # type: ignore[union-attr]
                        collective, arrays, dtype, red_kernel, header, deadline, label
                    )
                elif world.transport is not None or self.size() == 1:
                    if self.shm is not None:
                        self.shm.announce(header)  # so a peer in an arena call sees ours
                    run_schedule(
                        sched,
                        arrays,
                        dtype,
                        red_kernel,
                        world.transport,
                        self.ranks,
                        header,
                        deadline,
                        world.pool,
                        label,
                    )
            except CollectiveError as exc:
                if isinstance(exc, CollectiveTimeout) and exc.seq is None:
                    exc.seq = seq
                entry.failed(exc)
                first = self._failed is None
                self.fail(exc, seq)
                if first:  # the error path may do I/O: leave the ring where diagnose reads it
                    path = flight.dump(f"{type(exc).__name__} in {label}")  # type: ignore[union-attr]
                    if path and isinstance(exc, CollectiveTimeout):
                        exc.args = (f"{exc} (flight recorder: {path})",)
                raise
            if after is not None:
                after()
            entry.end()

        if async_op:
            return world.engine.submit(job, Work(label, result))
        world.engine.run(job)
        return None

    def _set_up_shm(self) -> None:
        """Before the first collective: find out whether every member is on this host
        and map the group's shared-memory arena if so (one exchange, shm/local.py)."""
        world = self.world
        seq = self._seq

        def job() -> None:
            self.check_usable()
            if self._shm_known:
                return  # another thread's first call got here first
            try:
                self.shm = _shm.setup(
                    self.ranks,
                    self._rank,
                    self.group_id,
                    world.transport,
                    ALGO_CODE[_shm.SETUP_ALGORITHM],
                    time.monotonic() + self.timeout,
                    world.pool,
                )
                self.hierarchy = _hier.setup(
                    self.ranks,
                    self._rank,
                    self.group_id,
                    world.transport,
                    self.shm,
                    ALGO_CODE[_hier.SETUP_ALGORITHM],
                    ALGO_CODE[_shm.SETUP_ALGORITHM],
                    time.monotonic() + self.timeout,
                    world.pool,
                )
            except CollectiveError as exc:
                self.fail(exc, seq)
                raise
            self._shm_known = True

        world.engine.run(job)

    def fail(self, exc: CollectiveError, seq: int = 0) -> None:
        """Mark the group unusable and tell its other members why (best effort). `seq` is
        the collective that failed: members still in an earlier one may finish it."""
        if self._failed is None:
            self._failed = exc
            transport = self.world.transport
            if transport is not None and not self.world.closed:
                transport.abort(self._peers, self.group_id, exc, seq)


def average_after(
    arr: np.ndarray, dtype: DType, op: ReduceOp | None, divisor: int
) -> Callable[[], None] | None:
    if op is not ReduceOp.AVG:
        return None
    return lambda: finish_average(arr, dtype, divisor)


def group_id_for(ranks: Sequence[int], nth: int) -> int:
    """A group id every member computes alike: from the ranks and how many groups with
    those same ranks were made before."""
    text = f"{','.join(map(str, ranks))}#{nth}".encode()
    return zlib.crc32(text) or 1
