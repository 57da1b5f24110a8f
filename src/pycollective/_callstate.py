"""The state every path of a call reads and writes: a process group's (its sequence
number, whether it failed, when it last read the transport) and its engine's (whether a
job runs and whose, whether it stopped, what is queued and deferred).

It is one record, not attributes of the group and the engine, because the compiled
per-call path (csrc/callpath.c) reads and writes it too: with the extension it is C-owned
(`_native.GroupState`, `_native.EngineState`), so C reaches every field by offset, and the
Python path uses the very same objects (as NCCL's paths all read one ncclComm). The
classes below are the definition of the fields, and the Python twins without the
extension; an extension whose types differ is refused at import (shm/native.py says so),
so a field renamed on one side only cannot turn the compiled path off unnoticed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

try:
    from . import _native
except ImportError:  # not built: the Python twins below
    _native = None  # type: ignore[assignment]


class GroupState:
    """A process group's state (the Python twin of _native.GroupState)."""

    __slots__ = ("seq", "failed", "polled", "checked_at")

    def __init__(self) -> None:
        self.seq = 0  # the next collective's sequence number
        self.failed: BaseException | None = None  # what made the group unusable
        self.polled = False  # the last call ran on a runner that polls the transport itself
        self.checked_at = -math.inf  # when this rank last read its transport for notices


class EngineState:
    """An engine's state (the Python twin of _native.EngineState)."""

    __slots__ = ("running", "stopped", "owner", "queue", "deferred", "lock")

    def __init__(self, lock: Any, queue: deque, deferred: list) -> None:
        self.running = False  # a job runs
        self.stopped = False  # new work is refused
        self.owner: int | None = None  # the thread running the job
        self.queue = queue  # asynchronous jobs issued and not done
        self.deferred = deferred  # point-to-point operations deferred
        self.lock = lock  # held to start a job


def fields(cls: type) -> set[str]:
    """The fields of a state type: its __slots__, or the members of the C type."""
    slots = getattr(cls, "__slots__", None)
    if slots is not None:
        return set(slots)
    return {n for n, v in vars(cls).items() if type(v).__name__ == "member_descriptor"}


def differences(ext: Any) -> list[str]:
    """How an extension's state types differ from the twins here (their definition)."""
    out = []
    for twin in (GroupState, EngineState):
        compiled = getattr(ext, twin.__name__, None)
        if compiled is None:
            out.append(f"{twin.__name__}: missing in C")
            continue
        mine, theirs = fields(twin), fields(compiled)
        if mine != theirs:
            out.append(
                f"{twin.__name__}: only in C {sorted(theirs - mine)}, "
                f"only in Python {sorted(mine - theirs)}"
            )
    return out


# An extension whose types differ (built from other sources) is not used: shm/native.py
# checks the same differences, says so once and runs the Python arena.
_COMPILED = _native is not None and not differences(_native)
_Group: Any = _native.GroupState if _COMPILED else GroupState
_Engine: Any = _native.EngineState if _COMPILED else EngineState


def group_state() -> GroupState:
    """A new group's state: C-owned when the extension is built."""
    return _Group()


def engine_state(lock: Any, queue: deque, deferred: list) -> EngineState:
    """A new engine's state over its lock, job queue and deferred list."""
    return _Engine(lock, queue, deferred)
