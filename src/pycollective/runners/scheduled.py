"""The runner of every algorithm in schedule/: a schedule built for this rank (once per
distinct call, then cached as a Plan) executed over the transport by executor.py. `auto`
prices every schedule of the collective with the World's cost parameters and takes the
cheapest (schedule/cost.py); it serves every group, so it comes last in the registry."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from .. import schedule
from ..schedule.cost import CostParams
from ..transport.tcp.swap import SWAP_MAX_BYTES
from ..tuning.params import CHAIN_SEGMENT_BYTES
from . import swap as _swap
from ._base import BaseRunner, Call, Members, Need, Spec
from .executor import Plan, make_plan, run_schedule

log = logging.getLogger("pycollective")


class ScheduledRunner(BaseRunner):
    """Runs the schedules of schedule/ over the group's transport."""

    def __init__(self, members: Members) -> None:
        self.members = members

    @classmethod
    def set_up(cls, members: Members, need: Need) -> ScheduledRunner:
        return cls(members)

    @staticmethod
    def names(collective: str) -> tuple[str, ...]:
        return schedule.ALGORITHMS[collective]

    def offers(self, collective: str) -> tuple[str, ...]:
        return schedule.ALGORITHMS[collective]

    def choose(self, spec: Spec) -> str:
        names = schedule.ALGORITHMS[spec.collective]
        if len(names) == 1:
            return names[0]
        m = self.members
        if (
            spec.collective == "all_reduce"
            and spec.count % 2 == 0
            and self._swaps()
            and self._swap_ring_from() <= spec.count * spec.dtype.itemsize <= SWAP_MAX_BYTES
        ):
            return "ring"
        # The job's parameters (rank 0's: the same on every rank), with the group's CPU share.
        params = m.tuning.group_params(m.transport_name, m.size)
        best = _select(
            params, spec.collective, m.size, _size_class(spec.count), spec.dtype.itemsize
        )
        log.debug(
            "auto chose %s for %s of %d x %s on %d ranks",
            best,
            spec.collective,
            spec.count,
            spec.dtype.name,
            m.size,
        )
        return best

    def prepare(self, spec: Spec, algorithm: str) -> Plan:
        m = self.members
        segment = max(1, CHAIN_SEGMENT_BYTES // spec.dtype.itemsize)
        return _cached_plan(
            spec.collective,
            algorithm,
            m.me,
            m.size,
            spec.count,
            spec.root,
            segment,
            spec.send_counts,
            spec.recv_counts,
        )

    def run(self, call: Call) -> None:
        m = self.members
        if m.transport is None and m.size > 1:  # pragma: no cover - a World always has one
            raise RuntimeError("a group of several ranks without a transport")
        run_schedule(
            call.plan,
            call.arrays,
            call.spec.dtype,
            call.kernel,
            m.transport,  # type: ignore[arg-type]  # None only for one rank: no messages
            m.ranks,
            call.header,
            call.deadline,
            m.pool,
            call.label,
        )

    # The group's path of repeated calls (core/group.py `fast`, runners/swap.py): calls
    # that are one swap with the one peer of a transport that can (TCPTransport.swap),
    # at most this large (the transport's bound: a destination this large is kept per
    # call signature).
    FAST_BYTES = SWAP_MAX_BYTES
    # From this size a two-rank all_reduce over a transport that swaps is the ring (two
    # swaps of halves: half the reduction, the second half received in place), not
    # recursive doubling (one swap of the whole), whatever the cost model's round price:
    # that is the regular path's (alpha), and a repeated swap costs a tenth of it.
    # Measured on loopback, repeated calls, ring against recursive doubling: 512 KiB
    # 234 / 234 us, 1 MiB 430 / 505 us, 2 MiB 926 / 965 us (docs/tcp.md). Across hosts
    # (namespace hosts: veth, a bridge, 1500-byte frames) the ring wins from 512 KiB: there
    # it was level with OpenMPI's ring (0.79-1.14x) where recursive doubling was 0.54-0.74x,
    # while on loopback recursive doubling stayed ahead at 512 KiB (375 against 482 us).
    SWAP_RING_BYTES = 512 << 10  # the peer on another host
    SWAP_RING_BYTES_SAME_HOST = 1 << 20  # over loopback (TCP forced on one host)

    def _swaps(self) -> bool:
        """Whether the group's calls can repeat as swaps: two ranks, and the group's peer
        the transport's only one (see TCPTransport.swap). The same on every rank."""
        m = self.members
        transport = m.transport
        return m.size == 2 and getattr(transport, "size", 0) == 2 and hasattr(transport, "swap")

    def _swap_ring_from(self) -> int:
        """The size from which a two-rank all_reduce that swaps is the ring: lower when the
        peer is on another host. The same on both ranks (TCPTransport.same_host)."""
        m = self.members
        same_host = getattr(m.transport, "same_host", None)
        peer = m.ranks[1 - m.me]
        if same_host is not None and same_host(peer):
            return self.SWAP_RING_BYTES_SAME_HOST
        return self.SWAP_RING_BYTES

    def compiled(self, plan: Plan, arrays: dict) -> _swap.SwapPlan | None:
        """What repeats a call of this signature that just ran, or None."""
        m = self.members
        if not self._swaps():
            return None
        data = arrays.get("data")
        if data is None or data.nbytes > self.FAST_BYTES:
            return None
        return _swap.swap_plan(plan, arrays, m.ranks)

    def fast_path(
        self,
        group: Any,
        engine: Any,
        recorder: Any,
        entry_type: type,
        finish: Any,
        recheck_seconds: float,
    ) -> Any:
        """The group's path of repeated calls (see runners/swap.py); it reads the
        transport itself at every call, so it needs no recheck rule."""
        return _swap.fast_path(group, engine, recorder, entry_type, finish, self.members.transport)

    def resume(self, call: Call, status: Any) -> None:
        """Go on with a call the path of repeated calls started and handed back."""
        _swap.resume(self.members.transport, call, status)


@lru_cache(maxsize=4096)
def _cached_plan(
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


@lru_cache(maxsize=2048)
def _select(params: CostParams, collective: str, size: int, count: int, itemsize: int) -> str:
    """The cheapest schedule under `params` (a pure function: cached by its arguments, so
    new parameters after a calibration simply miss)."""
    segment = max(1, CHAIN_SEGMENT_BYTES // itemsize)
    # Costs do not depend on the root (schedules are built relative to it): price root 0.
    return schedule.cost.select(collective, size, count, itemsize, params, segment=segment)
