"""The small interface every transport implements.

A transport moves framed messages between the ranks of one job. It knows nothing of
collectives: the executor hands it, for one round of a schedule, the messages to send and
the receives to complete, and `exchange` drives them all concurrently until done, an
error, or the deadline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .._errors import CollectiveError
from ._wire import Header

ANY_SOURCE = -1


@dataclass(eq=False)
class OutMessage:
    """A message to send: `header` (its nbytes is len(payload)) then the payload bytes."""

    peer: int
    header: Header
    payload: memoryview
    done: bool = False


@dataclass(eq=False)
class InMessage:
    """A receive to complete from `peer` (a global rank, or ANY_SOURCE for point-to-point).

    `expect` is the header we expect: its key selects the message, its other fields are
    checked (a difference is a MismatchError). `on_data(n)` is called as payload bytes
    land, with the number received so far, so a reduction can overlap the transfer.

    With `sink`, the payload is not written to `dest` (which then only gives its size):
    it is handed to `sink` in order, in pieces of whole multiples of `align` bytes, each
    valid only during the call. A reduction reads them from a small buffer that stays in
    cache instead of a temporary as large as the message.

    With `sink`, `fold` may say what the sink does in terms of pycollective._native's
    kernels, (op code, dtype code): dest = dest op payload, item by item, in order. A
    transport may then combine the payload into `dest` itself instead of calling `sink`
    (for the part of the payload it has not handed to `sink` already).
    """

    peer: int
    expect: Header
    dest: memoryview
    on_data: Callable[[int], None] | None = None
    sink: Callable[[memoryview], None] | None = None
    align: int = 1
    fold: tuple[int, int] | None = None
    done: bool = False
    source: int = -1  # the rank the message came from (useful with ANY_SOURCE)
    header: Header | None = field(default=None, repr=False)  # what actually arrived


class Transport(ABC):
    rank: int
    size: int
    supports_sink = False  # honours InMessage.sink (else the executor uses a temporary)

    @abstractmethod
    def exchange(
        self,
        sends: Sequence[OutMessage],
        recvs: Sequence[InMessage],
        deadline: float | None,
        group: int,
        label: str = "",
    ) -> None:
        """Run every send and receive to completion, concurrently.

        Raises TransportError when a peer involved is lost, CollectiveTimeout at the
        deadline (time.monotonic()), MismatchError when a peer's header disagrees, and the
        reported error when a peer of `group` aborted.
        """

    @abstractmethod
    def abort(self, peers: Iterable[int], group: int, error: CollectiveError, seq: int = 0) -> None:
        """Tell `peers` (best effort, never blocking long) that `group` failed with `error`
        in its collective number `seq` (0: at once, whatever they are running)."""

    @abstractmethod
    def close(self) -> None:
        """Release every socket and buffer. Never hangs, even with peers gone."""

    def lost_peers(self) -> dict[int, str]:
        """Peers whose connection is gone, with the reason."""
        return {}

    def check_group(  # noqa: B027
        self, group: int, seq: int | None = None, call: Header | None = None
    ) -> None:
        """Raise now, without waiting, if a peer reported that `group` failed in its
        collective `seq` or earlier (None: any). Called before each operation, so a rank
        whose own steps would not touch the peer at fault still learns at once. `call` is
        the header of the collective about to run: a frame that peers sent for an earlier
        collective and nobody received, or that contradicts this one, is a mismatch even
        when this call runs elsewhere (the shared-memory arena)."""

    def interrupt(self, reason: str) -> None:  # noqa: B027 - optional for simple transports
        """Make the exchange in progress (from any thread) and every later one raise
        TransportError(reason) promptly. Used by destroy_process_group."""
