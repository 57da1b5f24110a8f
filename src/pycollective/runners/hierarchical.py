"""Hierarchical all-reduce for groups whose ranks sit on several hosts, several per host.

Three steps, all under the group's own id and sequence number (so an abort notice for the
group reaches a rank in any step, and every frame carries the group's call for mismatch
checks); each step's message tags get a phase offset of their own:

  1. reduce-scatter among the ranks of each host (the host's shared-memory arena when it
     has one, else TCP): local rank j ends with block j of the host's partial result;
  2. all-reduce of block j across hosts, among the ranks whose local index is j (TCP,
     the flat algorithm `auto` would pick for that many ranks and that block);
  3. all-gather of the blocks inside each host.

Only the cross-host step touches the network: every rank sends 2 (H-1)/H of n/L bytes
there (H hosts, L ranks per host), so a host's link carries 2 (H-1)/H n bytes in all, as
for one flat ring, in 2 (H-1) + 2 (L-1) rounds instead of 2 (HL-1).

The steps run one after another, not pipelined by segments: on one machine's cores
(namespace hosts) nothing is idle to overlap them into, and between real hosts a pipeline
needs the in-host steps' waits to watch the transport from a second thread (measured and
left open: docs/multihost.md, "Pipelining the hierarchy's steps").

Hosts with unequal rank counts cannot pair blocks by local index; they run the leader
variant instead: reduce to each host's first rank, all-reduce of the whole buffer among
those leaders, broadcast inside each host (n bytes per host link each way, as above, but
one rank per host does the network step and the reduction of its host).

Which rank is on which host: every rank's 16-byte host identity (shm/_hostid.py),
exchanged once at the group's first collective (skipped when the group already shares one
arena); every rank derives the same layout from it, so all make the same choices.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .._dtypes import BYTE, DType
from .._errors import CollectiveError
from .._reduce_ops import Kernel
from ..schedule import build as build_schedule
from ..schedule import cost as _cost
from ..shm import _hostid
from ..transport import _wire
from ..transport._base import Transport
from ..transport._wire import ALGO_CODE, Header
from ..tuning.params import Tuning
from . import arena as _shm
from ._base import BaseRunner, Call, Members, Need, Spec
from .executor import Plan, ScratchPool, make_plan, run_schedule
from .native import CompiledSteps

log = logging.getLogger("pycollective")

ALGORITHM = "hierarchical"
SETUP_ALGORITHM = "hierarchical-hosts"  # the host-identity exchange's frame headers
_ID_BYTES = 16
_PHASE_SHIFT = 28  # tag = phase << 28 | round << 10 | message index (tags are 32 bits)


@dataclass(frozen=True)
class Layout:
    """Which group ranks share a host: hosts in order of their lowest rank, each a tuple
    of group ranks in increasing order (a rank's position there is its local index)."""

    hosts: tuple[tuple[int, ...], ...]

    @classmethod
    def from_host_ids(cls, ids: Sequence[bytes]) -> Layout:
        groups: dict[bytes, list[int]] = {}
        for rank, hid in enumerate(ids):
            groups.setdefault(bytes(hid), []).append(rank)
        return cls(tuple(tuple(g) for g in groups.values()))

    @property
    def size(self) -> int:
        return sum(len(h) for h in self.hosts)

    @property
    def even(self) -> bool:
        return len({len(h) for h in self.hosts}) == 1

    @property
    def ranks_per_host(self) -> int:
        """L for even layouts (0 otherwise)."""
        return len(self.hosts[0]) if self.even else 0

    def host_of(self, rank: int) -> int:
        return next(i for i, h in enumerate(self.hosts) if rank in h)

    def prefers_hierarchy(self) -> bool:
        """Auto's rule: more than one host, and more than one rank on some host."""
        return len(self.hosts) > 1 and max(len(h) for h in self.hosts) > 1

    def describe(self) -> str:
        counts = [len(h) for h in self.hosts]
        if self.even:
            return f"{len(counts)} host(s) x {counts[0]} rank(s)"
        return f"{len(counts)} hosts with {counts} ranks"


@dataclass(frozen=True)
class _Call:
    """What every step of one call passes on to the executor or the arena."""

    dtype: DType
    kernel: Kernel | None
    header: Header
    deadline: float
    label: str
    transport: Transport | None
    pool: ScratchPool


class Hierarchy:
    """One group's layout and, for its host's ranks, the arena of the intra-host steps."""

    def __init__(
        self,
        layout: Layout,
        me: int,
        global_ranks: Sequence[int],
        arena: _shm.LocalGroup | None,
        tuning: Tuning | None = None,
    ) -> None:
        self.layout = layout
        self.me = me
        self.global_ranks = tuple(global_ranks)
        host = layout.hosts[layout.host_of(me)]
        self._host = layout.host_of(me)
        self.local = host.index(me)
        self.intra = host  # group ranks of my host
        # Group ranks with my local index, one per host (uneven layouts: the leaders).
        index = self.local if layout.even else 0
        self.cross = tuple(h[index] for h in layout.hosts)
        self.arena = arena
        # A host arena made for the hierarchy alone (several hosts) runs its steps compiled
        # when the extension can; the group's own arena (one host) stays its runner's.
        self.compiled = (
            CompiledSteps(arena)
            if arena is not None and len(layout.hosts) > 1 and CompiledSteps.available(arena)
            else None
        )
        self.tuning = tuning or Tuning()  # prices the cross-host step's flat algorithm
        self.scratch = ScratchPool()  # not the world's: run_schedule takes that one

    def run(
        self,
        arrays: dict[str, np.ndarray],
        dtype: DType,
        kernel: Kernel | None,
        header: Header,
        deadline: float,
        label: str,
        transport: Transport | None,
        pool: ScratchPool,
    ) -> None:
        """This rank's part of one all_reduce (arrays["data"], in place). AVG arrives as a
        sum: the caller divides afterwards, as for every other algorithm."""
        data = arrays["data"]
        n = data.size
        if n == 0 or self.layout.size == 1:
            return
        call = _Call(dtype, kernel, header, deadline, label, transport, pool)
        if not self.layout.even:
            self._run_leaders(data, call)
            return
        L, H = len(self.intra), len(self.cross)
        if L == 1:
            self._cross(data, call)
            return
        b = -(-n // L)
        region = self.scratch.take((L * b + b) * dtype.itemsize).view(dtype.numpy)
        blk = region[:b]
        if n == L * b:
            work = data
        else:  # pad to L equal blocks; the padding is reduced but never copied out
            work = region[b:]
            work[:n] = data
            work[n:] = 0
        self._intra("reduce_scatter", {"input": work, "output": blk}, b, 0, call)
        if H > 1:
            self._cross(blk, call)
        self._intra("all_gather", {"input": blk, "output": work}, b, 2, call)
        if work is not data:
            data[:] = work[:n]

    def _run_leaders(self, data: np.ndarray, call: _Call) -> None:
        """Uneven hosts: reduce to local rank 0, all-reduce among those, broadcast.
        header.root is 0 for all_reduce, so the arena takes local rank 0 as root too."""
        if len(self.intra) > 1:
            self._intra("reduce", {"data": data}, data.size, 0, call, "tree")
        if self.local == 0:
            self._cross(data, call)
        if len(self.intra) > 1:
            self._intra("broadcast", {"data": data}, data.size, 2, call, "tree")

    def _cross(self, data: np.ndarray, call: _Call) -> None:
        """All-reduce of `data` among self.cross (one rank per host), over TCP."""
        H = len(self.cross)
        algo = flat_algorithm(H, data.size, call.dtype.itemsize, self.tuning.params("tcp"))
        plan = _plan("all_reduce", algo, self.local_host, H, data.size, 1)
        ranks = tuple(self.global_ranks[r] for r in self.cross)
        assert call.transport is not None  # a group across hosts has one
        run_schedule(
            plan, {"data": data}, call.dtype, call.kernel, call.transport, ranks,
            call.header, call.deadline, call.pool, call.label,
        )  # fmt: skip

    def _intra(
        self,
        collective: str,
        arrays: dict[str, np.ndarray],
        count: int,
        phase: int,
        call: _Call,
        algorithm: str = "ring",
    ) -> None:
        """One in-host step: over the host's arena if it has one (compiled if it can), else
        a TCP schedule."""
        if self.compiled is not None:
            self.compiled.run(
                collective, arrays, call.kernel, call.header, call.deadline, call.label
            )
            return
        if self.arena is not None:
            self.arena.run(
                collective, arrays, call.dtype, call.kernel, call.header, call.deadline,
                call.label,
            )  # fmt: skip
            return
        plan = _plan(collective, algorithm, self.local, len(self.intra), count, phase)
        ranks = tuple(self.global_ranks[r] for r in self.intra)
        assert call.transport is not None  # a group with peers has one
        run_schedule(
            plan, arrays, call.dtype, call.kernel, call.transport, ranks, call.header,
            call.deadline, call.pool, call.label,
        )  # fmt: skip

    @property
    def local_host(self) -> int:
        """My rank in the cross-host group: my host's index."""
        return self._host


def flat_algorithm(size: int, count: int, itemsize: int, params: _cost.CostParams) -> str:
    """The flat all-reduce `auto` would run over TCP for `size` ranks (every rank computes
    the same: same inputs, and the parameters the job agreed on)."""
    cls = 0 if count <= 0 else 1 << (count - 1).bit_length()
    return _cheapest(size, cls, itemsize, params)


@lru_cache(maxsize=1024)
def _cheapest(size: int, count: int, itemsize: int, params: _cost.CostParams) -> str:
    return _cost.select("all_reduce", size, count, itemsize, params)


@lru_cache(maxsize=1024)
def _plan(collective: str, algorithm: str, rank: int, size: int, count: int, phase: int) -> Plan:
    """One step's plan, its tags moved into the phase's own range so that two steps
    between the same peers under the same sequence number never match each other."""
    plan = make_plan(build_schedule(collective, algorithm, rank, size, count))
    off = phase << _PHASE_SHIFT
    if not off:
        return plan
    rounds = tuple(
        replace(
            rnd,
            sends=tuple(replace(s, tag=s.tag | off) for s in rnd.sends),
            recvs=tuple(replace(r, tag=r.tag | off) for r in rnd.recvs),
        )
        for rnd in plan.rounds
    )
    return Plan(rounds, plan.scratch, plan.temp_elems)


# ---------------------------------------------------------------------- set-up


def setup(
    ranks: Sequence[int],
    me: int,
    group_id: int,
    transport: Transport | None,
    group_arena: _shm.LocalGroup | None,
    algo_code: int,
    shm_algo_code: int,
    deadline: float,
    pool: ScratchPool,
    tuning: Tuning | None = None,
) -> Hierarchy | None:
    """Run by every member at a group's first collective, after the shared-memory set-up
    (`group_arena` is its result). None for a group of one rank."""
    p = len(ranks)
    if p == 1 or transport is None:
        return None
    if group_arena is not None:  # one host, already known: no exchange
        return Hierarchy(Layout((tuple(range(p)),)), me, ranks, group_arena, tuning)
    header = _header(zlib.crc32(b"hierarchy-hosts/%d" % group_id) or 1, algo_code)
    try:
        layout = _exchange(ranks, me, transport, header, deadline, pool)
    except CollectiveError as exc:
        transport.abort([g for g in ranks if g != ranks[me]], header.group, exc, 0)
        raise
    arena = None
    host = layout.hosts[layout.host_of(me)]
    if len(layout.hosts) > 1 and len(host) > 1:
        # The host's ranks get an arena of their own for steps 1 and 3, mapped now (at the
        # first collective, whatever it is) so that a failure here surfaces like any
        # other set-up failure. Its polls watch the group's id for abort notices.
        sub_id = zlib.crc32(b"hierarchy-host/%d/%d" % (group_id, host[0])) or 1
        arena = _shm.setup(
            [ranks[r] for r in host],
            host.index(me),
            sub_id,
            transport,
            shm_algo_code,
            deadline,
            pool,
        )
        if arena is not None:
            arena.group_id = group_id
    hier = Hierarchy(layout, me, ranks, arena, tuning)
    log.debug(
        "group %d: %s, intra-host steps over %s",
        group_id,
        layout.describe(),
        "shared memory" if arena is not None else "TCP",
    )
    return hier


def _exchange(
    ranks: Sequence[int],
    me: int,
    transport: Transport,
    header: Header,
    deadline: float,
    pool: ScratchPool,
) -> Layout:
    p = len(ranks)
    mine = np.frombuffer(_hostid.host_id(), np.uint8).copy()
    everyone = np.zeros(p * _ID_BYTES, np.uint8)
    plan = build_schedule("all_gather", "bruck", me, p, _ID_BYTES)
    run_schedule(
        plan,
        {"input": mine, "output": everyone},
        BYTE,
        None,
        transport,
        ranks,
        header,
        deadline,
        pool,
        "hierarchy-hosts",
    )
    ids = [bytes(everyone[q * _ID_BYTES : (q + 1) * _ID_BYTES]) for q in range(p)]
    return Layout.from_host_ids(ids)


def _header(group: int, algo_code: int) -> Header:
    kind = _wire.KIND_CODE["all_gather"]
    return Header(_wire.DATA, kind, BYTE.code, 0, algo_code, group, 0, 0, 0, _ID_BYTES, 0)


class HierarchicalRunner(BaseRunner):
    """The runner of "hierarchical" all_reduce. `auto` takes it when the group spans hosts
    with several ranks on some host; `algorithm="hierarchical"` is accepted on any group
    (one host: the in-host steps alone), but listed only where the group spans hosts."""

    def __init__(self, members: Members, hierarchy: Hierarchy | None) -> None:
        self.members = members
        self.hierarchy = hierarchy  # None for a group of one rank: nothing to do

    @classmethod
    def set_up(cls, members: Members, need: Need) -> HierarchicalRunner:
        arena = need(_shm.ArenaRunner)
        hierarchy = setup(
            members.ranks,
            members.me,
            members.group_id,
            members.transport,
            arena.local_group if isinstance(arena, _shm.ArenaRunner) else None,
            ALGO_CODE[SETUP_ALGORITHM],
            ALGO_CODE[_shm.SETUP_ALGORITHM],
            time.monotonic() + members.timeout,
            members.pool,
            members.tuning,
        )
        return cls(members, hierarchy)

    @staticmethod
    def names(collective: str) -> tuple[str, ...]:
        return (ALGORITHM,) if collective == "all_reduce" else ()

    def offers(self, collective: str) -> tuple[str, ...]:
        h = self.hierarchy
        if collective == "all_reduce" and h is not None and len(h.layout.hosts) > 1:
            return (ALGORITHM,)
        return ()

    def accepts(self, collective: str, algorithm: str) -> bool:
        return collective == "all_reduce" and algorithm == ALGORITHM

    def choose(self, spec: Spec) -> str | None:
        h = self.hierarchy
        if spec.collective == "all_reduce" and h is not None and h.layout.prefers_hierarchy():
            return ALGORITHM
        return None

    def run(self, call: Call) -> None:
        if self.hierarchy is not None:
            m = self.members
            self.hierarchy.run(
                call.arrays,
                call.spec.dtype,
                call.kernel,
                call.header,
                call.deadline,
                call.label,
                m.transport,
                m.pool,
            )
