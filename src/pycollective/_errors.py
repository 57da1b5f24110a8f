"""The error hierarchy (README, "Errors, never hangs").

Every failure that crosses a rank boundary surfaces as one of these, on every rank
involved, within the timeout. Local misuse is a UsageError, raised before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence


class CollectiveError(Exception):
    """Base class of every error pycollective raises."""


class UsageError(CollectiveError, ValueError):
    """Local misuse: a bad argument, dtype, root or buffer. Raised before any communication."""


class TransportError(CollectiveError):
    """A peer or the link failed. The group is unusable afterwards."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective did not complete within its timeout."""

    def __init__(
        self,
        message: str,
        op: str | None = None,
        seq: int | None = None,
        waiting_on: Sequence[int] = (),
    ) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.waiting_on = tuple(waiting_on)


class MismatchError(CollectiveError):
    """Ranks called different collectives, or one with different shapes, dtypes or roots."""


class AuthenticationError(CollectiveError):
    """A peer failed the shared-secret handshake."""


class StoreError(CollectiveError):
    """The rendezvous store failed or refused a request."""


__all__ = [
    "AuthenticationError",
    "CollectiveError",
    "CollectiveTimeout",
    "MismatchError",
    "StoreError",
    "TransportError",
    "UsageError",
]
