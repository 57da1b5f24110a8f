"""The state every part of the TCP transport shares: the connections and their poller,
the receives posted, the messages kept early, the failures peers reported, the call
tracker. The parts (sending.py, receiving.py, matching.py, progress.py, swap.py) are
mixins over it; transport.py puts them together as `TCPTransport`, the one entry point."""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable

from ... import _config
from ..._errors import CollectiveError, TransportError, UsageError
from ..._load import MachineLoad, online_cpus
from .._base import ANY_SOURCE, InMessage, Transport
from .._calls import CallTracker
from .._wire import Header
from .conn import Conn as _Conn
from .conn import Poller as _Poller
from .folding import compiled_copy, compiled_round, native_fold
from .receiver import RecvHelper
from .sender import SendHelper
from .stash import Stash, StashPool

SPIN_SECONDS = 50e-6  # how long an exchange first polls without blocking (progress.py)


class TransportState(Transport):
    """The shared state, and what every part does with a connection it gives up."""

    supports_sink = True

    def __init__(self, rank: int, size: int, conns: dict[int, socket.socket]) -> None:
        self.rank = rank
        self.size = size
        self.max_unexpected = int(_config.get("PYCOLLECTIVE_MAX_EARLY_BYTES"))
        self._sel = _Poller()
        self._conns: dict[int, _Conn] = {}
        for peer, sock in conns.items():
            sock.setblocking(False)
            conn = _Conn(peer, sock)
            self._conns[peer] = conn
            self._sel.register(sock, conn)
        # Receives posted by the exchange in progress, by (peer, key) and for ANY_SOURCE.
        self._posted: dict[tuple[int, tuple], deque[InMessage]] = {}
        self._posted_any: dict[tuple, deque[InMessage]] = {}
        # Messages that arrived before their receive: key -> [(peer, header, payload)].
        self._unexpected: dict[tuple, deque[tuple[int, Header, Stash]]] = {}
        self._stash_pool = StashPool()  # their memory, reused
        self._unexpected_bytes = 0
        self._aborted: dict[int, CollectiveError] = {}  # group id -> the error a peer reported
        self._abort_seq: dict[int, int] = {}  # group id -> the collective that failed
        self._closed = False
        self._sent_abort = False  # close() lingers so that the notice is read (_linger)
        # Which collective each group runs, and the rules that tell a peer's early or stale
        # frame from a mismatch (sans-IO, _calls.py); and interrupt(), which wakes the
        # poller from any thread.
        self._calls = CallTracker(rank)
        self._interrupted: str | None = None
        # How long an exchange polls without blocking before it sleeps in the selector
        # (adapted: see _drive), and exchanges since that last fell to 0.
        self._spin = SPIN_SECONDS
        self._unspun = 0
        # Whether the machine is busy (more runnable tasks than CPUs): only then does the
        # budget fall to 0 (PYCOLLECTIVE_LOAD_AWARE=0: never busy, as the arena's waits).
        aware = _config.get("PYCOLLECTIVE_LOAD_AWARE") != "0"
        self._spin_load = MachineLoad(None if aware else -1)
        # A swap (see `swap`) left for swap_finish: (error, header, sends, recvs, whether
        # it polled for the whole budget).
        self._swap: tuple | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, None)
        # The thread that writes a large payload's tail during an exchange (sender.py),
        # the connection it writes on, and whether an exchange is being driven.
        self._helper = SendHelper(self._wake_w)
        self._helper_conn: _Conn | None = None
        self._driving = False
        # The thread that reads a large payload during an exchange while this one reduces
        # (receiver.py), the connection it reads, the bytes of that payload not yet taken,
        # and the sink they go to (None: read into the destination in place).
        self._reader = RecvHelper(self._wake_w)
        # When to hand payloads to it: while the machine is crowded (auto, the default),
        # always or never. The helper exists for a rank short of a core; where ranks
        # have their cores the hand-offs slowed 16-64 MiB across hosts by 1.1-1.5x
        # (docs/tcp.md, "Under load"). Crowded is more than twice as many runnable tasks
        # as CPUs besides this rank's own running threads: the peers' threads on the
        # same machine (ranks of one host, or namespace hosts sharing its cores) and
        # their helpers may add a few, a machine busy with other work adds more.
        self._reader_mode = _config.get("PYCOLLECTIVE_TCP_RECV_HELPER")
        self._reader_load = MachineLoad(2 * online_cpus())
        self._reader_conn: _Conn | None = None
        self._reader_left = 0
        self._reader_sink: Callable[[memoryview], None] | None = None
        # The compiled read-and-reduce of a reduction's payload (folding.py), or None:
        # the window and the sink in Python.
        self._fold = native_fold()
        # The compiled round of a small swap (swap.py), or None: the Python loop.
        self._round = compiled_round()
        # The compiled copy of a payload out of the read buffer (folding.py), or None.
        self._copy = compiled_copy()

    def _reader_wanted(self) -> bool:
        """Whether a large payload goes to the receive helper now."""
        if self._reader_mode == "auto":
            own = 2 if self._helper.busy else 1  # this thread, and the send helper's
            return self._reader_load.check(time.monotonic(), own)
        return self._reader_mode == "1"

    def lost_peers(self) -> dict[int, str]:
        return {p: c.lost for p, c in self._conns.items() if c.lost is not None}

    def _check_peer(self, peer: int) -> None:
        if peer == ANY_SOURCE:
            lost = self.lost_peers()
            if lost and len(lost) == len(self._conns):
                raise TransportError("every peer is gone")
            return
        conn = self._conns.get(peer)
        if conn is None:
            raise UsageError(
                f"rank {peer} is not a peer of rank {self.rank} (world size {self.size})"
            )
        if conn.lost is not None:
            raise TransportError(f"rank {peer} is unreachable: {conn.lost}", peer=peer)

    def _raise_if_interrupted(self) -> None:
        if self._interrupted is not None:
            raise TransportError(self._interrupted)

    def _raise_if_lost(self, peer: int) -> None:
        if peer == ANY_SOURCE:
            return
        conn = self._conns[peer]
        if conn.lost is not None:
            raise TransportError(f"rank {self.rank} lost rank {peer}: {conn.lost}", peer=peer)

    def _lose(self, conn: _Conn, reason: str) -> None:
        if conn.lost is not None:
            return
        conn.lost = reason
        self._hang_up(conn)

    def _hang_up(self, conn: _Conn) -> None:
        """Stop polling a connection and close its socket (either may be done already)."""
        if conn.helper:  # never close a socket another thread writes on (its fd is reused)
            self._take_back_send()
        if conn.reader:  # nor one another thread reads
            self._take_back_recv()
        self._sel.unregister(conn.sock)
        try:
            conn.sock.close()
        except OSError:
            pass

    # Implemented by the parts, called across them.

    def _pump(self, timeout: float) -> None:  # progress.py
        raise NotImplementedError

    def _on_header(self, conn: _Conn, pos: int) -> None:  # matching.py
        raise NotImplementedError

    def _on_payload(self, conn: _Conn) -> None:  # matching.py
        raise NotImplementedError

    def _take_back_send(self) -> None:  # sending.py
        raise NotImplementedError

    def _take_back_recv(self) -> None:  # receiving.py
        raise NotImplementedError
