"""What the tests' worker scripts (each run as one rank of a job) print for their tests to
parse: `report` prints one `RESULT {json}` line; `attempt` runs one step and reports how it
ended (tests/_launch.py's steps_of and tagged read them back).

Workers run as scripts, with only their own folder on sys.path, so each begins with the
same two lines to find this one:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
    from _workerlib import attempt, report  # noqa: E402
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

RESULT = "RESULT "


def emit(fields: dict[str, Any], prefix: str = RESULT) -> None:
    """One line: `prefix` and `fields` as JSON, flushed (a killed rank loses nothing)."""
    print(prefix + json.dumps(fields), flush=True)


def report(**fields: Any) -> None:
    emit(fields)


def attempt(
    step: str, fn: Callable[[], object], catch: type[BaseException] = Exception
) -> BaseException | None:
    """Run `fn` as `step` and report it: `error` (the class name, or None), `elapsed`
    seconds and `at` (wall clock, to compare ranks' moments); for an error also `bases` (the
    class's MRO names), `msg`, and the ranks it names (`peer`, `waiting_on`). Returns the
    error caught (only `catch`: anything else propagates and fails the worker), or None."""
    t0 = time.monotonic()
    try:
        fn()
    except catch as exc:
        report(
            step=step,
            error=type(exc).__name__,
            bases=[c.__name__ for c in type(exc).__mro__],
            msg=str(exc),
            elapsed=time.monotonic() - t0,
            at=time.time(),
            peer=getattr(exc, "peer", None),
            waiting_on=list(getattr(exc, "waiting_on", ()) or ()),
        )
        return exc
    report(step=step, error=None, elapsed=time.monotonic() - t0, at=time.time())
    return None
