"""TCP transport: one authenticated, full-duplex connection per pair of ranks.

A single-threaded progress engine (non-blocking sockets and a poller) drives every send
and receive of a round at once, so a ring step sends and receives at the same time and
two ranks that both send large messages to each other cannot deadlock: while a rank waits
on anything it keeps reading, and a message that arrives before its receive is posted is
kept (bounded) until it is. Payloads go straight from the caller's memory to the socket
and from the socket into the destination (`sendmsg`, `recv_into`): no copies, no
per-element Python loops.

`TCPTransport` is the one entry point; its parts are one concern a file: mesh.py makes
the connections, conn.py holds one connection's state, state.py what the parts share,
sending.py the send queue, receiving.py the bytes in, matching.py which receive a frame
is for and what came early, progress.py the loop that drives an exchange and its errors,
swap.py the repeated small swap, aborts.py the abort notice's codec.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Sequence

from ..._errors import CollectiveError, TransportError
from .. import _wire
from .._base import InMessage, OutMessage
from .._wire import Header
from . import aborts
from .matching import MAX_FRAME_BYTES, STASH_FIRST
from .progress import PROBE_AFTER
from .swap import SWAP_DECLINED, SWAP_DONE, SWAP_FOLDED, SWAP_PENDING, Swapping

log = logging.getLogger("pycollective.transport")

CLOSE_LINGER = 0.25  # seconds close() waits for peers to hang up too (see _linger)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROBE_AFTER",
    "STASH_FIRST",
    "SWAP_DECLINED",
    "SWAP_DONE",
    "SWAP_FOLDED",
    "SWAP_PENDING",
    "TCPTransport",
]


def _data_header(sends: Sequence[OutMessage], recvs: Sequence[InMessage]) -> Header | None:
    """The header of the collective an exchange belongs to (None for point-to-point)."""
    if recvs:
        header = recvs[0].expect
    elif sends:
        header = sends[0].header
    else:
        return None
    return header if header.frame == _wire.DATA else None


class TCPTransport(Swapping):
    """Full mesh of TCP connections among `size` ranks. Build it with `connect_mesh`."""

    def exchange(
        self,
        sends: Sequence[OutMessage],
        recvs: Sequence[InMessage],
        deadline: float | None,
        group: int,
        label: str = "",
    ) -> None:
        if self._closed:
            raise TransportError("the transport is closed (destroy_process_group was called)")
        self._raise_if_interrupted()
        current = _data_header(sends, recvs)
        seq = None if current is None else current.seq
        self._raise_if_aborted(group, seq)
        for m in sends:
            self._check_peer(m.peer)
        try:
            self._calls.active = group
            if current is not None:
                self._calls.begin(group, current, self._early(group))
            for m in recvs:
                # A message already here counts even if its sender has since left.
                self._post(m)
                if not m.done:
                    self._check_peer(m.peer)
            for m in sends:
                self._enqueue(m)
            self._drive(sends, recvs, deadline, group, label, seq)
        except BaseException:
            self._unpost(recvs)
            self._drop_unsent(sends)
            raise
        finally:
            self._calls.active = None

    def check_group(self, group: int, seq: int | None = None, call: Header | None = None) -> None:
        """Raise now if a peer reported that `group` failed (in collective `seq` or before;
        None: any): read whatever already arrived, abort notices included, without waiting.
        One non-blocking select. A peer that hung up is not a failure by itself: it may
        have finished its part and left (a clean exit and a crash look alike on TCP);
        whoever still needs it finds out in the exchange and tells the others."""
        if self._closed:
            raise TransportError("the transport is closed (destroy_process_group was called)")
        self._raise_if_interrupted()
        self._pump(0.0)
        self._raise_if_aborted(group, seq)
        if call is not None:
            self._calls.begin(group, call, self._early(group))
            self._calls.check_stale(group, call.seq, self._early(group))

    def same_host(self, peer: int) -> bool:
        """Whether the connection to `peer` stays on this machine: both its ends are
        loopback addresses (read when it was made: Conn.loopback). Both ends see the same,
        whatever address translation lies between hosts, so ranks may choose by it alike.
        False for any other connection: two ranks of one host meeting at the host's own
        address count as two hosts (the choice only has to agree, and be right where it
        pays)."""
        conn = self._conns.get(peer)
        return conn is not None and conn.loopback

    def interrupt(self, reason: str) -> None:
        """Make the exchange in progress (in any thread), and every later one, raise
        TransportError(reason) promptly. Used by destroy_process_group."""
        self._interrupted = reason
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # already woken (buffer full) or closed

    def peers_closed(self) -> list[int]:
        """The peers whose end of the connection is closed: they exited, crashed or closed
        their group. For a transport being abandoned (the elastic manager asks before it
        leaves a failed group): a connection still open is read to its end here, dropping
        whatever frames were unread, to find an end of file or a reset behind them."""
        out = []
        scratch = bytearray(1 << 16)
        for peer, conn in sorted(self._conns.items()):
            if conn.lost is not None:
                # an end of file, a reset, or a write into a connection the peer closed
                if any(w in conn.lost for w in ("closed by peer", "reset by peer", "Broken pipe")):
                    out.append(peer)
                continue
            while True:
                try:
                    n = conn.sock.recv_into(scratch, len(scratch), socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                except (ConnectionResetError, BrokenPipeError):
                    out.append(peer)
                    break
                except OSError:
                    break
                if n == 0:
                    out.append(peer)
                    break
        return out

    def abort(self, peers: Iterable[int], group: int, error: CollectiveError, seq: int = 0) -> None:
        frame = aborts.encode(error, group, seq)
        self._sent_abort = True
        for peer in peers:
            conn = self._conns.get(peer)
            if conn is None or conn.lost is not None:
                continue
            # Best effort, and only if no frame is half-sent on this connection (that would
            # interleave bytes); a peer stuck behind a full socket learns by timeout instead.
            if conn.out_sent or conn.write_pending:
                continue
            try:
                n = conn.sock.send(frame)
                if n < len(frame):  # rare: the socket is full; finish within a short bound
                    conn.sock.settimeout(0.5)
                    conn.sock.sendall(frame[n:])
                    conn.sock.setblocking(False)
            except OSError:
                self._lose(conn, "could not deliver an abort notice")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._helper.close()
        self._reader.close()
        for sock in (self._wake_r, self._wake_w):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        # Linger only after telling peers why we fail: then the notice must reach them.
        self._linger(CLOSE_LINGER if self._sent_abort else 0.0)
        for conn in self._conns.values():
            self._hang_up(conn)
        self._sel.close()
        self._unexpected.clear()

    def _linger(self, seconds: float) -> None:
        """Close gently, within `seconds`: send FIN, then read (and drop) what peers still
        send until they close too. Closing a socket with unread data makes the kernel send
        a reset, and a reset destroys what the peer has not read yet, such as the abort
        notice that says why we are leaving."""
        live = {c.sock: c for c in self._conns.values() if c.lost is None}
        for sock, conn in list(live.items()):
            try:
                sock.shutdown(socket.SHUT_WR)
                self._sel.modify(sock, conn, write=False)  # reading only, now
            except (OSError, KeyError, ValueError):
                del live[sock]
        deadline = time.monotonic() + seconds
        while live:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                ready = [c.sock for c, _, _ in self._sel.select(remaining) if c is not None]
            except OSError:
                break
            for sock in ready:
                try:
                    if not sock.recv(1 << 16):  # type: ignore[union-attr]
                        raise OSError
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    live.pop(sock, None)  # type: ignore[arg-type]
                    try:
                        self._sel.unregister(sock)
                    except (KeyError, ValueError):
                        pass
            if remaining <= 0:
                break  # one last pass over what had arrived, then go
