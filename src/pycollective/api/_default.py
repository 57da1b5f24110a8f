"""The process's default group: torch.distributed's API is module-level, so one default
group per process is unavoidable. It is registered here and nowhere else (DEFAULT, the
package's one registry of groups); api/groups.py sets and clears it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .._errors import UsageError
from ..core.group import ProcessGroup
from ..core.world import World


@dataclass
class DefaultGroup:
    """The World that init_process_group made, its group of every rank, and how many
    Worlds this process has made (each gets its own rendezvous keys)."""

    world: World | None = None
    group: ProcessGroup | None = None
    generation: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)


DEFAULT = DefaultGroup()


def resolve_group(group: ProcessGroup | None) -> ProcessGroup:
    if group is None:
        if DEFAULT.group is None:
            raise UsageError(
                "the default process group is not initialized: call init_process_group() first"
            )
        return DEFAULT.group
    if not isinstance(group, ProcessGroup):
        raise UsageError(f"group must be a ProcessGroup made by new_group(), got {group!r}")
    if group.world.closed:
        raise UsageError("this group belongs to a process group that was destroyed")
    return group
