"""How one call runs: the Runner protocol, and what a runner is given (Members, Call).

A group holds one instance of each runner that can serve it, set up at its first
collective (runners/__init__.py `set_up`), in the registry's order. For every call the
group asks them in that order: with `algorithm="auto"` the first whose `choose` names an
algorithm runs it; with an explicit name, the first that `accepts` it. The group never
names a runner: a new way to run calls (a compiled arena, another transport) is one more
class in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .._dtypes import DType
from .._reduce_ops import Kernel
from ..transport._base import Transport
from ..transport._wire import Header
from ..tuning.params import Tuning
from .executor import ScratchPool


class WorldView(Protocol):
    """What runners use of the World (core/world.py) their group belongs to. Read at each
    use, never copied: a World's transport may be wrapped after set-up (count_traffic)."""

    transport: Transport | None
    pool: ScratchPool
    tuning: Tuning
    transport_name: str


@dataclass(frozen=True)
class Members:
    """The group a runner serves: its global ranks, this rank's place among them, its id
    and timeout, and the World it belongs to (transport, scratch memory, cost parameters)."""

    ranks: tuple[int, ...]
    me: int  # group rank of this process
    group_id: int
    timeout: float
    world: WorldView

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def transport(self) -> Transport | None:
        return self.world.transport

    @property
    def pool(self) -> ScratchPool:
        return self.world.pool

    @property
    def tuning(self) -> Tuning:
        return self.world.tuning

    @property
    def transport_name(self) -> str:
        """Which parameters of `tuning` price its schedules."""
        return self.world.transport_name


@dataclass(frozen=True, slots=True)
class Spec:
    """What identifies a call for choosing and planning (the same on every rank)."""

    collective: str
    count: int
    dtype: DType
    op: int  # ReduceOp value, 0 when the collective has none
    root: int  # group rank
    send_counts: tuple[int, ...] | None = None
    recv_counts: tuple[int, ...] | None = None


class Call:
    """One call as a runner runs it: its spec and chosen algorithm, this rank's arrays,
    the reduction kernel, the frame header every message carries, the deadline, whatever
    the runner prepared for this spec (`plan`), and the label errors use (made when read:
    most calls never need it)."""

    __slots__ = ("spec", "algorithm", "arrays", "kernel", "header", "deadline", "plan")

    def __init__(
        self,
        spec: Spec,
        algorithm: str,
        arrays: dict[str, np.ndarray],
        kernel: Kernel | None,
        header: Header,
        deadline: float,
        plan: Any,
    ) -> None:
        self.spec = spec
        self.algorithm = algorithm
        self.arrays = arrays
        self.kernel = kernel
        self.header = header
        self.deadline = deadline
        self.plan = plan

    @property
    def label(self) -> str:
        s = self.spec
        return f"{s.collective}#{self.header.seq}({self.algorithm}, {s.count} x {s.dtype.name})"


# Sets up (once) and returns the group's runner of a class, or None if it cannot serve the
# group: how one runner builds on another (the hierarchy asks whether the arena exists).
Need = Callable[[type], "Runner | None"]


class Runner(Protocol):
    """One way of running a group's calls."""

    @classmethod
    def set_up(cls, members: Members, need: Need) -> Runner | None:
        """Run by every member at the group's first collective, in the engine (the same
        exchanges on every rank). None: this runner cannot serve the group."""
        ...

    def offers(self, collective: str) -> tuple[str, ...]:
        """The algorithm names it lists for `collective` (pycollective.algorithms)."""
        ...

    def accepts(self, collective: str, algorithm: str) -> bool:
        """Whether it runs `algorithm=` for `collective` (its offers, and maybe more)."""
        ...

    def choose(self, spec: Spec) -> str | None:
        """The algorithm it runs for `spec` under "auto", or None to leave it to the next."""
        ...

    def prepare(self, spec: Spec, algorithm: str) -> Any:
        """Whatever `run` needs that depends only on the spec (cached by the group)."""
        ...

    def note(self, call: Call) -> None:
        """Every runner of the group sees every call before one of them runs it."""
        ...

    def run(self, call: Call) -> None:
        """This rank's part of the call; raises a CollectiveError on failure."""
        ...


class CompiledRunner(Runner, Protocol):
    """A runner with a compiled path of repeated calls (runners/native.py). The group uses
    these when a runner has `fast_path` (core/group.py `_offer_fast`)."""

    def compiled(self, plan: Any, arrays: dict[str, np.ndarray]) -> Any:
        """The compiled plan that repeats a call of this signature that just ran, or None."""
        ...

    def fast_path(
        self,
        group: Any,
        engine: Any,
        recorder: Any,
        entry_type: type,
        finish: Callable[..., None],
        recheck_seconds: float,
    ) -> Any:
        """The handle the API functions call (ProcessGroup.fast), or None."""
        ...

    def resume(self, call: Call, status: int) -> None:
        """Go on with a call the handle started and handed back (`status`)."""
        ...


class BaseRunner:
    """Defaults for the optional parts of the protocol."""

    members: Members

    def offers(self, collective: str) -> tuple[str, ...]:
        return ()

    def accepts(self, collective: str, algorithm: str) -> bool:
        return algorithm in self.offers(collective)

    def choose(self, spec: Spec) -> str | None:
        return None

    def prepare(self, spec: Spec, algorithm: str) -> Any:
        return None

    def note(self, call: Call) -> None:
        pass
