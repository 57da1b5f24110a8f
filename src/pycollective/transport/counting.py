"""Counts what one world sends and receives, for reports such as "bytes per worker per step".

The counter sits between the groups and the transport (a delegating wrapper), so it sees
exactly the frames the executor and point-to-point hand over: payload bytes plus one
header per message. Nothing in the transport changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import CollectiveError
from . import _wire
from ._base import InMessage, OutMessage, Transport


@dataclass
class TrafficSnapshot:
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    busy_seconds: float = 0.0  # wall time spent inside exchanges

    def __sub__(self, other: TrafficSnapshot) -> TrafficSnapshot:
        return TrafficSnapshot(
            self.bytes_sent - other.bytes_sent,
            self.bytes_received - other.bytes_received,
            self.messages_sent - other.messages_sent,
            self.messages_received - other.messages_received,
            self.busy_seconds - other.busy_seconds,
        )


class CountingTransport(Transport):
    """Forwards everything to `inner`, counting the bytes of every exchange."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.size = inner.size
        self._lock = threading.Lock()
        self._totals = TrafficSnapshot()

    def exchange(
        self,
        sends: Sequence[OutMessage],
        recvs: Sequence[InMessage],
        deadline: float | None,
        group: int,
        label: str = "",
    ) -> None:
        start = time.perf_counter()
        try:
            self.inner.exchange(sends, recvs, deadline, group, label)
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                t = self._totals
                t.busy_seconds += elapsed
                t.messages_sent += len(sends)
                t.bytes_sent += sum(m.payload.nbytes + _wire.SIZE for m in sends)
                t.messages_received += len(recvs)
                t.bytes_received += sum(m.dest.nbytes + _wire.SIZE for m in recvs)

    def snapshot(self) -> TrafficSnapshot:
        with self._lock:
            return TrafficSnapshot(**vars(self._totals))

    def abort(self, peers: Iterable[int], group: int, error: CollectiveError, seq: int = 0) -> None:
        self.inner.abort(peers, group, error, seq)

    def close(self) -> None:
        self.inner.close()

    def lost_peers(self) -> dict[int, str]:
        return self.inner.lost_peers()

    def check_group(self, group: int, seq: int | None = None, call: Any = None) -> None:
        self.inner.check_group(group, seq, call)

    def interrupt(self, reason: str) -> None:
        self.inner.interrupt(reason)

    def __getattr__(self, name: str) -> Any:
        # Anything else the transport offers (added later by others) passes straight through.
        return getattr(self.inner, name)
