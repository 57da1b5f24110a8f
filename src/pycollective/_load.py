"""Whether this machine is busy: more tasks ready to run than it has CPUs.

The shared-memory arena's waits read it to decide how long to keep their core. A rank
that spins or yields while its peer waits for a core only delays the peer on a busy
machine (the core goes to the spinner, or after a yield to whatever else is ready there
for a time slice); sleeping soon hands the core over and the peer's wake-up preempts the
others. On a quiet machine the spin is what makes a small call a microsecond or two, so
the view decides per wait.

The count is the kernel's number of runnable tasks, the fourth field of /proc/loadavg
("R/T": R running or ready now, T in all), read at most every CHECK_SECONDS. It counts
the reading task and its peers too: two ranks spinning on two CPUs are not busy, a third
task ready is. The compiled arena (csrc/wait.c) reads the same field at the same rate
with the same rule; shm/native.py checks the constant it was built with.
"""

from __future__ import annotations

import os

LOADAVG = "/proc/loadavg"
CHECK_SECONDS = 0.005  # how old a reading may be before the next wait reads it again


def runnable(text: bytes) -> int | None:
    """The runnable tasks in /proc/loadavg's text ("0.52 0.58 0.59 3/467 12345"), or
    None if it does not read as such."""
    fields = text.split()
    if len(fields) < 4:
        return None
    running, slash, _ = fields[3].partition(b"/")
    if not slash or not running.isdigit():
        return None
    return int(running)


def online_cpus() -> int:
    """The CPUs online on this machine (the runnable count is the whole machine's)."""
    try:
        n = os.sysconf("SC_NPROCESSORS_ONLN")
    except (AttributeError, OSError, ValueError):
        n = os.cpu_count() or 1
    return max(1, int(n))


def read_runnable(path: str = LOADAVG) -> int | None:
    """The runnable tasks now, or None where the file is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return runnable(os.read(fd, 128))
    except OSError:
        return None
    finally:
        os.close(fd)


class MachineLoad:
    """A view of whether the machine is busy, refreshed at most every CHECK_SECONDS.
    `cpus` is the most runnable tasks that are not busy (None: the CPUs online); -1
    switches it off (never busy), as PYCOLLECTIVE_LOAD_AWARE=0 does."""

    def __init__(self, cpus: int | None = None, path: str = LOADAVG) -> None:
        self.cpus = online_cpus() if cpus is None else cpus
        self.path = path
        self.busy = False
        self._count: int | None = None  # the last reading
        self._next = 0.0

    def check(self, now: float, own: int = 0) -> bool:
        """Whether the machine is busy; `now` is time.monotonic()'s. `own`: runnable
        tasks of the caller's own that the count includes and that should not make it
        busy (a process's threads running its call)."""
        if self.cpus < 0:
            return False
        if now >= self._next:
            self._next = now + CHECK_SECONDS
            self._count = read_runnable(self.path)
        count = self._count
        self.busy = count is not None and count - own > self.cpus
        return self.busy
