"""Why an elastic job cannot go on (raised on every member alike)."""

from __future__ import annotations

from .._errors import CollectiveError


class ElasticError(CollectiveError):
    """The elastic job cannot go on: no majority, too few members, the store is gone, or
    the membership did not settle within its bound. Raised on every member alike."""


class JobFinished(ElasticError):
    """A newcomer arrived after the job finished: there is nothing left to join."""
