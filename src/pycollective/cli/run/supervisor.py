"""Watching one attempt's ranks: the first failure, the notice window that lets the others
end on their own, then SIGUSR1, SIGTERM and SIGKILL; in elastic mode, replacements."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from .ranks import Output, Rank, describe_exit, exit_code, handles, killpg, last_line, signal_name

_POLL = 0.02
_DUMP_WAIT = 0.5  # seconds between SIGUSR1 (flight recorders dump) and SIGTERM


class Job:
    """The ranks of one attempt and how they are stopped.

    After the first failure the others get `notice` seconds with no signal at all (a rank
    in a collective learns of the loss through its connections and raises, prints and
    exits on its own; Python's default SIGTERM would end it before its except and finally
    blocks run); then SIGUSR1 to those still running that handle it (pycollective's flight
    recorder dumps), then SIGTERM, `grace` seconds, SIGKILL. In elastic mode a rank killed
    by a signal, when at least `elastic_min` ranks still run, stops nobody: the job goes on
    with them, and a replacement is started while `replacements` allows (a rank that
    exits with an error status still ends the job).
    """

    def __init__(
        self,
        spawn: Callable[[int, int], Rank],
        ranks: list[Rank],
        notice: float,
        grace: float,
        received: list[int],
        err: Output,
        elastic_min: int | None = None,
        replacements: int = 0,
        next_id: int = 0,
    ) -> None:
        self.spawn = spawn
        self.ranks = ranks
        self.notice = notice
        self.grace = grace
        self.received = received
        self.err = err
        self.elastic_min = elastic_min
        self.replacements = replacements
        self.next_id = next_id
        self.first: Rank | None = None  # the first failure that stopped the job
        self.tolerated: list[Rank] = []  # elastic: failures the job went on without
        self.launcher_signal: int | None = None
        self.replaced = 0

    def say(self, text: str) -> None:
        self.err.write(b"", f"pycollective run: {text}".encode())

    def supervise(self) -> int:
        phase = "run"  # run -> notice -> dump -> term (-> SIGKILL at `until`)
        until = 0.0
        handled = 0
        while True:
            running, failed_now = [], []
            for r in list(self.ranks):
                if r.returncode is None:
                    r.returncode = r.proc.poll()
                    if r.returncode is None:
                        running.append(r)
                    elif r.returncode != 0:
                        failed_now.append(r)
            now = time.monotonic()
            if failed_now and phase == "run":
                # Several found dead in one look: a rank killed by a signal is likelier the
                # cause than one that exited with an error (often the others' reaction to it).
                failed_now.sort(key=lambda x: ((x.returncode or 0) >= 0, x.rank))
                # Elastic: a rank killed by a signal is a lost worker the others go on
                # without; one that exits with an error (an exception in the script, or
                # the elastic manager saying the job cannot go on) ends the job.
                lost = all((x.returncode or 0) < 0 for x in failed_now)
                if self.elastic_min is not None and lost and len(running) >= self.elastic_min:
                    self._go_on(failed_now, running)
                    continue
                self.first = failed_now[0]
                if running:
                    self.say(
                        f"rank {self.first.rank} {describe_exit(self.first.returncode or 0)}; "
                        f"the other ranks have {self.notice:g} s to exit on their own, then "
                        f"SIGTERM and {self.grace:g} s more"
                    )
                phase, until = "notice", now + self.notice
            while handled < len(self.received):
                sig = self.received[handled]
                handled += 1
                if self.launcher_signal is None:
                    self.launcher_signal = sig
                    for r in running:
                        killpg(r.proc.pid, sig)
                    phase, until = "term", now + self.grace
                else:  # a second signal: the user does not want to wait
                    until = now
            if not running:
                return self._report()
            if phase != "run" and now >= until:
                if phase == "notice":
                    dumping = [r for r in running if handles(r.proc.pid, signal.SIGUSR1)]
                    for r in dumping:
                        killpg(r.proc.pid, signal.SIGUSR1)
                    phase, until = "dump", now + (_DUMP_WAIT if dumping else 0.0)
                elif phase == "dump":
                    for r in running:
                        killpg(r.proc.pid, signal.SIGTERM)
                    phase, until = "term", now + self.grace
                elif phase == "term":
                    for r in running:
                        killpg(r.proc.pid, signal.SIGKILL)
                    phase, until = "killed", float("inf")  # SIGKILL cannot be ignored: reap
            time.sleep(_POLL)

    def _go_on(self, failed: list[Rank], running: list[Rank]) -> None:
        for r in failed:
            self.tolerated.append(r)
            self.ranks.remove(r)
            killpg(r.proc.pid, signal.SIGKILL)  # whatever it started goes with it
            n = len(running)
            on = f"{n} rank goes on" if n == 1 else f"{n} ranks go on"
            text = f"rank {r.rank} {describe_exit(r.returncode or 0)}; {on}"
            if self.replaced < self.replacements:
                new = self.spawn(self.next_id, r.local_rank)
                self.next_id += 1
                self.replaced += 1
                self.ranks.append(new)
                running.append(new)
                text += f" and rank {new.rank} starts to replace it"
            self.say(text)

    def _report(self) -> int:
        for r in self.ranks + self.tolerated:
            killpg(r.proc.pid, signal.SIGKILL)  # what the ranks left running would hold the pipes
        until = time.monotonic() + 2.0
        for r in self.ranks + self.tolerated:
            for t in r.readers:
                t.join(timeout=max(0.0, until - time.monotonic()))  # so the stderr tail is complete
        if self.launcher_signal is not None:
            self.say(f"stopped by {signal_name(self.launcher_signal)}")
            return 128 + self.launcher_signal
        if self.tolerated:
            lost = ", ".join(
                f"rank {r.rank} ({describe_exit(r.returncode or 0)})" for r in self.tolerated
            )
            self.say(f"elastic: the job went on without {lost}")
        first = self.first
        if first is None:
            return 0
        assert first.returncode is not None
        # The rank's traceback was forwarded as it was written: name it once, with its
        # last line (the exception), rather than print it a second time.
        line = f"rank {first.rank} {describe_exit(first.returncode)} (the first rank to fail)"
        last = last_line(first.stderr_tail)
        lines = [f"pycollective run: {line}" + (f": {last}" if last else "")]
        others = [
            f"rank {r.rank} {describe_exit(r.returncode)}"
            for r in self.ranks
            if r is not first and r.returncode not in (None, 0)
        ]
        if others:
            lines.append("pycollective run: then " + ", ".join(others))
        self.err.write(b"", "\n".join(lines).encode())
        return exit_code(first.returncode)
