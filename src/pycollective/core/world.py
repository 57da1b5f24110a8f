"""The World: what one init_process_group (or one torch backend) builds in a process and
every group of it shares: the transport to every other rank, the store, the engine that
orders operations, scratch memory, the flight recorder and timeline, and the cost
parameters `auto` prices with. Nothing of it is module-level state: two Worlds in one
process (the default group's and a torch backend's) never touch each other."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .._keys import JobKey
from ..observe import timeline as _timeline
from ..observe.flight import FlightRecorder
from ..runners.executor import ScratchPool
from ..transport._base import Transport
from ..transport.counting import CountingTransport
from ..tuning.params import Tuning
from .engine import Engine


@dataclass
class World:
    """Per-process state shared by every group of one init_process_group."""

    rank: int
    size: int
    transport: Transport | None
    store: Any
    timeout: float
    backend: str = "pycollective"
    transport_name: str = "tcp"
    engine: Engine = field(default_factory=Engine)
    pool: ScratchPool = field(default_factory=ScratchPool)
    group_counts: dict[tuple[int, ...], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    owns_store: bool = True
    flight: FlightRecorder | None = None  # made in __post_init__ (needs rank and size)
    tuning: Tuning = field(default_factory=Tuning)  # what `auto` prices with (tuning/)
    # The job's key (what every connection proved), for what peers send above the
    # connections: object payloads carry a MAC under a key derived from it (api/objects).
    key: JobKey | None = None

    def __post_init__(self) -> None:
        if self.flight is None:
            self.flight = FlightRecorder(
                self.rank, self.size, timeline=_timeline.from_env(self.rank, self.size)
            )
        # destroy_process_group stops the engine; a collective still waiting then is cut
        # short by interrupting the transport rather than left to its timeout.
        if self.transport is not None:
            self.engine.set_interrupt(self.transport.interrupt)


def count_traffic(world: World) -> CountingTransport | None:
    """Start counting `world`'s traffic (idempotent). None for a world of one rank."""
    transport = world.transport
    if transport is None:
        return None
    if isinstance(transport, CountingTransport):
        return transport
    counter = CountingTransport(transport)
    world.transport = counter
    return counter
