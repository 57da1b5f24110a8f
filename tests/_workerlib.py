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
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

RESULT = "RESULT "
# A directory tests/_launch.py's run_ranks makes for one job's ranks: `mark` and `wait_for`
# hand-shake through it.
MARKS = "TEST_MARKS"


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


def mark(name: str, rank: int) -> None:
    """Tell the job's other ranks that `name` happened here (a file in $TEST_MARKS)."""
    with open(os.path.join(os.environ[MARKS], f"{name}.{rank}"), "w"):
        pass


def wait_for(name: str, ranks: Iterable[int], timeout: float = 60.0) -> None:
    """Until every one of `ranks` has marked `name`: a rank that must stay out of a call
    until its peers have given up on it waits for exactly that, instead of a nap that has
    to outlast their timeout on a loaded machine (and costs its length on an idle one).
    Raises TimeoutError after `timeout` seconds (a peer that died before marking)."""
    ranks = list(ranks)  # read twice: for the paths and for the error
    paths = [os.path.join(os.environ[MARKS], f"{name}.{r}") for r in ranks]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks {list(ranks)} did not mark {name!r} in {timeout} s")
        time.sleep(0.01)
