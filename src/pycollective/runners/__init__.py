"""How one call runs. A group holds one runner of each kind that can serve it (set up at
its first collective); for each call the first in REGISTRY order that takes it runs it
(_base.py has the protocol). The order is the preference of `auto`: the shared-memory
arena where every member shares this host (compiled, native.py, unless PYCOLLECTIVE_NATIVE=0
or the extension is missing; else in Python), the hierarchy where the group spans hosts with
several ranks on one, else the cost model's cheapest schedule over the transport.
"""

from __future__ import annotations

from ._base import BaseRunner, Call, CompiledRunner, Members, Need, Runner, Spec
from .arena import ArenaRunner
from .hierarchical import HierarchicalRunner
from .native import NativeArenaRunner
from .scheduled import ScheduledRunner

# The registry: every kind of runner, most preferred first (a documented, immutable table;
# a new way to run calls is one more entry here).
REGISTRY: tuple[type, ...] = (
    NativeArenaRunner,
    ArenaRunner,
    HierarchicalRunner,
    ScheduledRunner,
)


def set_up(members: Members) -> list[Runner]:
    """Every runner of REGISTRY that can serve the group, in order. Run by every member at
    the group's first collective: runners may exchange messages while setting up, so every
    rank sets them up alike (a runner that needs another asks for it, `need`, and that one
    is set up first)."""
    made: dict[type, Runner | None] = {}

    def need(kind: type) -> Runner | None:
        if kind not in made:
            made[kind] = kind.set_up(members, need)  # type: ignore[attr-defined]
        return made[kind]

    for kind in REGISTRY:
        need(kind)
    # A runner may stand in for another it builds on (`replaces`: the compiled arena for
    # the Python one): the group then holds only the stand-in.
    replaced = {getattr(r, "replaces", None) for r in made.values() if r is not None}
    return [r for k in REGISTRY if (r := made[k]) is not None and k not in replaced]


def known(collective: str) -> list[str]:
    """Every algorithm name some runner may run for `collective` ("auto" first): what an
    algorithm setting is checked against before any group exists."""
    names = ["auto"]
    for kind in REGISTRY:
        names += [n for n in kind.names(collective) if n not in names]  # type: ignore[attr-defined]
    return names


def listed(collective: str, runners: list[Runner] | None) -> list[str]:
    """The algorithm names `pycollective.algorithms` lists for a group: what its runners
    offer, or, before its first collective (nothing set up yet), the schedules' names."""
    if runners is None:
        return list(ScheduledRunner.names(collective))
    names: list[str] = []
    for r in runners:
        names += [n for n in r.offers(collective) if n not in names]
    order = list(ScheduledRunner.names(collective))  # schedules first, as always listed
    return [n for n in order if n in names] + [n for n in names if n not in order]


__all__ = [
    "REGISTRY",
    "ArenaRunner",
    "BaseRunner",
    "Call",
    "CompiledRunner",
    "HierarchicalRunner",
    "Members",
    "NativeArenaRunner",
    "Need",
    "Runner",
    "ScheduledRunner",
    "Spec",
    "known",
    "listed",
    "set_up",
]
