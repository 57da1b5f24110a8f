"""The progress loop: an exchange drives every send and receive of its round at once
(non-blocking sockets and one poller), polling briefly before it sleeps, probing peers it
waits on, and raising within its deadline what went wrong, naming whom it waited on."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..._errors import CollectiveTimeout
from ...observe.timeline import WAIT as _WAIT
from .._base import ANY_SOURCE, InMessage, OutMessage
from .._calls import describe_peer
from . import aborts
from .matching import Matching
from .state import SPIN_SECONDS

# A collective whose receives have waited this long tells the peers it waits on which
# collective it is in (a PROBE frame). Ranks that called different collectives and only
# wait on each other (so no data ever flows to reveal the difference) then find out at
# once instead of at the timeout. A peer that is merely slow checks it when it gets there.
PROBE_AFTER = 0.5
SPIN_MAX = 200e-6
SPIN_MIN = 2e-6
SPIN_RETRY = 64  # exchanges after polling was given up before it is tried again


class Progress(Matching):
    """Driving an exchange to its end, or to the error that ends it."""

    def _drive(
        self,
        sends: Sequence[OutMessage],
        recvs: Sequence[InMessage],
        deadline: float | None,
        group: int,
        label: str,
        seq: int | None = None,
        spun: bool = False,
    ) -> None:
        """Drive the exchange to its end or its error. A large payload's tail may be
        written by the send helper meanwhile (sending.py), and a large reduction's payload
        read by the receive helper (receiving.py); both are taken back before this
        returns or raises, so nothing outlives the exchange on another thread."""
        self._driving = True
        try:
            self._drive_loop(sends, recvs, deadline, group, label, seq, spun)
        finally:
            self._driving = False
            self._take_back_send()
            self._take_back_recv()

    def _spin_missed(self, spin: float) -> float:
        """The polling budget after `spin` ran out before the exchange ended: a quarter,
        down to 0 while the machine is busy, to SPIN_SECONDS at least while it is quiet."""
        spin = spin / 4 if spin >= 4 * SPIN_MIN else 0.0
        if spin < SPIN_SECONDS and not self._spin_load.check(time.monotonic()):
            return SPIN_SECONDS
        return spin

    def _drive_loop(
        self,
        sends: Sequence[OutMessage],
        recvs: Sequence[InMessage],
        deadline: float | None,
        group: int,
        label: str,
        seq: int | None,
        spun: bool,
    ) -> None:
        now = time.monotonic()
        probe_at = now + PROBE_AFTER if recvs else None
        # Poll without blocking for a moment first: a small message from a peer that is
        # running arrives within microseconds, where sleeping in the selector adds two
        # context switches to every step (the sender's wake-up of the sleeper, and back).
        # Adapted to what pays: doubled (to SPIN_MAX) when the exchange ends while
        # polling, quartered when it does not. It falls to 0 only while the machine is
        # busy (more runnable tasks than CPUs: ranks outnumber the cores, and a poller
        # only keeps its peer off the core), retried every SPIN_RETRY exchanges then; on
        # a quiet machine a peer that missed the budget was held up, not starved by us,
        # and it stays at SPIN_SECONDS at least, so polling resumes at the next call.
        spin = self._spin
        if spun:  # the caller polled for its budget already (swap), to no avail
            self._spin = self._spin_missed(spin)
            spin = 0.0
        elif not spin:
            self._unspun += 1
            if self._unspun >= SPIN_RETRY or not self._spin_load.check(now):
                self._unspun = 0
                spin = SPIN_SECONDS
        spin_until = now + spin
        while True:
            if all(m.done for m in recvs) and all(m.done for m in sends):
                if spin:
                    self._spin = min(2 * spin, SPIN_MAX)
                return
            if deadline is None:
                timeout = 1.0
            else:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    self._pump(0.0)  # an abort notice already here explains the wait
                    self._raise_if_aborted(group, seq, sends, recvs)
                    raise self._timeout(sends, recvs, label)
                timeout = min(timeout, 1.0)
            if probe_at is not None:
                until_probe = probe_at - time.monotonic()
                if until_probe <= 0:
                    probe_at = None
                    self._probe(recvs)
                else:
                    timeout = min(timeout, until_probe)
            if spin:
                if time.monotonic() < spin_until:
                    timeout = 0.0
                else:  # polling did not pay this time
                    self._spin = spin = self._spin_missed(spin)
            self._pump(timeout)
            self._raise_if_aborted(group, seq, sends, recvs)
            self._raise_if_interrupted()
            for m in recvs:
                if not m.done:
                    self._raise_if_lost(m.peer)
            for m in sends:
                if not m.done:
                    self._raise_if_lost(m.peer)

    def _pump(self, timeout: float) -> None:
        """Wait up to `timeout` for sockets to be ready, then make every bit of progress."""
        if _WAIT.on:  # PYCOLLECTIVE_TIMELINE: time blocked here is time waiting for peers
            t0 = time.perf_counter()
            ready = self._sel.select(timeout)
            _WAIT.total += time.perf_counter() - t0
        else:
            ready = self._sel.select(timeout)
        for conn, readable, writable in ready:
            if conn is None:  # interrupt()'s wake-up
                try:
                    while self._wake_r.recv(256):
                        pass
                except OSError:
                    pass
                continue
            if conn.lost is not None:
                continue
            if writable:
                self._flush(conn)
            if readable and conn.lost is None and not conn.reader:
                self._read(conn)
        if self._helper_conn is not None:
            self._fold_send()  # the helper finished (its wake-up is what woke us) or not
        if self._reader_conn is not None:
            self._fold_recv()  # reduce the pieces the receive helper read meanwhile

    def _timeout(
        self, sends: Sequence[OutMessage], recvs: Sequence[InMessage], label: str
    ) -> CollectiveTimeout:
        waiting = sorted(
            {m.peer for m in recvs if not m.done} | {m.peer for m in sends if not m.done}
        )
        doing = "; ".join(self._last_doing(p) for p in waiting if p != ANY_SOURCE)
        return CollectiveTimeout(
            f"rank {self.rank}: {label or 'operation'} timed out waiting for rank(s) {waiting}"
            + (f" ({doing})" if doing else ""),
            op=label or None,
            waiting_on=waiting,
        )

    def _last_doing(self, peer: int) -> str:
        """What `peer` was last seen doing, from the last frame it sent us (a PROBE says it
        waits in that collective; data says it got at least that far)."""
        conn = self._conns.get(peer)
        if conn is None:
            return f"rank {peer}: unknown"
        if conn.lost is not None:
            return f"rank {peer}: connection lost ({conn.lost})"
        if conn.last is None:
            return f"rank {peer}: has sent nothing since the job started"
        return describe_peer(peer, conn.last)

    def _raise_if_aborted(
        self,
        group: int,
        seq: int | None = None,
        sends: Sequence[OutMessage] = (),
        recvs: Sequence[InMessage] = (),
    ) -> None:
        """Raise the failure a peer reported for `group`, unless it failed in a collective
        after `seq`, the one running here: that peer finished ours, so what we wait on can
        still come (the next call raises). Point-to-point (seq None) always raises.

        A relayed timeout says whom this rank was waiting for, too: the peer that timed
        out first may have been waiting on us, while we wait on the rank actually late."""
        exc = self._aborted.get(group)
        if exc is None or (seq is not None and self._abort_seq[group] > seq):
            return
        error = aborts.copy_error(exc)
        if isinstance(error, CollectiveTimeout):
            waiting = sorted(
                {m.peer for m in recvs if not m.done} | {m.peer for m in sends if not m.done}
            )
            if waiting:
                doing = "; ".join(self._last_doing(p) for p in waiting if p != ANY_SOURCE)
                error = CollectiveTimeout(
                    f"{error}; rank {self.rank} was waiting for rank(s) {waiting}"
                    + (f" ({doing})" if doing else ""),
                    waiting_on=waiting,
                )
        raise error
