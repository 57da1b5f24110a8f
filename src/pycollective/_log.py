"""The library's logging: quiet unless asked, as a library should be, and one switch users
know from NCCL_DEBUG and TORCH_DISTRIBUTED_DEBUG.

Every logger of the package is a child of "pycollective", which has a NullHandler: a
program that configures no logging sees nothing, and one that does (logging.basicConfig)
decides itself. PYCOLLECTIVE_DEBUG turns on a handler of our own on stderr:

    PYCOLLECTIVE_DEBUG=INFO     the few facts of a job, once each: rendezvous (who found
                                whom, where, how long it took), flight-recorder dumps
    PYCOLLECTIVE_DEBUG=DETAIL   also (DEBUG level) the algorithm each distinct call runs
                                ("auto" chose what) and every collective call
    unset, "" or OFF            nothing (the default)

Decisions are DEBUG, not INFO, because programs that configure logging at INFO for their
own sake (Ray's workers do) would otherwise print one line per new call signature; INFO
stays a small constant per job. Off costs a level check per call (Logger.isEnabledFor,
cached by logging).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from . import _config
from ._errors import UsageError

LOGGER = logging.getLogger("pycollective")
LOGGER.addHandler(logging.NullHandler())

VARIABLE = "PYCOLLECTIVE_DEBUG"
LEVELS = {"OFF": None, "INFO": logging.INFO, "DETAIL": logging.DEBUG}
FORMAT = "pycollective %(levelname)s pid %(process)d %(name)s: %(message)s"


class _DebugHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic in the stubs only
    """The handler PYCOLLECTIVE_DEBUG installs (told apart from the user's own)."""


def debug_level(env: Mapping[str, str] | None = None) -> int | None:
    """The level PYCOLLECTIVE_DEBUG asks for (None: off); UsageError for a bad value."""
    value = _config.get(VARIABLE, env)
    return None if value is None else LEVELS[value]


def configure(env: Mapping[str, str] | None = None) -> None:
    """Install (or remove) the stderr handler PYCOLLECTIVE_DEBUG asks for. Called when the
    package is imported (a bad value is ignored there) and by init_process_group (where
    it raises); idempotent."""
    level = debug_level(env)
    ours = [h for h in LOGGER.handlers if isinstance(h, _DebugHandler)]
    if level is None:
        for h in ours:
            LOGGER.removeHandler(h)
        if ours:
            LOGGER.setLevel(logging.NOTSET)
        return
    if not ours:
        handler = _DebugHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        LOGGER.addHandler(handler)
    LOGGER.setLevel(level)


def note_call(
    seen: set[tuple[object, ...]], group: str, rank: int, size: int, collective: str,
    asked: str | None,
    algorithm: str, label: str, nbytes: int,
) -> None:  # fmt: skip
    """At DEBUG (PYCOLLECTIVE_DEBUG=DETAIL): the algorithm each distinct call runs (once
    per group, collective, asked name, choice and size), and every call. Callers check
    LOGGER.isEnabledFor(logging.DEBUG) first, so that this costs nothing when off."""
    key = (collective, asked, algorithm, nbytes)
    if key not in seen and len(seen) < _MAX_NOTED:
        seen.add(key)
        how = f"auto chose {algorithm}" if asked in (None, "auto") else f"{algorithm} (asked)"
        LOGGER.debug(
            "%s rank %d of %d: %s of %d bytes: %s", group, rank, size, collective, nbytes, how
        )
    LOGGER.debug("%s rank %d: %s", group, rank, label)


_MAX_NOTED = 4096  # distinct calls noted per group: a program of ever-new sizes stays bounded


def configure_quietly() -> None:
    try:
        configure()
    except UsageError:
        pass  # init_process_group raises it, naming the variable


__all__ = ["LOGGER", "configure", "configure_quietly", "debug_level", "note_call"]
