"""TCP transport: one authenticated, full-duplex connection per pair of ranks.

A single-threaded progress engine (non-blocking sockets and a poller) drives every send
and receive of a round at once, so a ring step sends and receives at the same time and
two ranks that both send large messages to each other cannot deadlock: while a rank waits
on anything it keeps reading, and a message that arrives before its receive is posted is
kept (bounded) until it is. Payloads go straight from the caller's memory to the socket
and from the socket into the destination (`sendmsg`, `recv_into`): no copies, no
per-element Python loops. The connections are made by mesh.py; one connection's state is
conn.py's.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ... import _config
from ..._errors import (
    CollectiveError,
    CollectiveTimeout,
    MismatchError,
    TransportError,
    UsageError,
)
from ...observe.timeline import WAIT as _WAIT
from .. import _wire
from .._base import ANY_SOURCE, InMessage, OutMessage, Transport
from .._calls import CallTracker, describe_peer
from .._wire import Header
from .conn import RBUF_BYTES as _RBUF_BYTES
from .conn import Conn as _Conn
from .conn import Poller as _Poller

log = logging.getLogger("pycollective.transport")

MAX_FRAME_BYTES = 1 << 40  # a peer's length beyond this is a protocol error, not a malloc
# A collective whose receives have waited this long tells the peers it waits on which
# collective it is in (a PROBE frame). Ranks that called different collectives and only
# wait on each other (so no data ever flows to reveal the difference) then find out at
# once instead of at the timeout. A peer that is merely slow checks it when it gets there.
PROBE_AFTER = 0.5
# Messages that come before their receive are kept, up to PYCOLLECTIVE_MAX_EARLY_BYTES
# in all (counted as the peer announces them); each one's buffer starts at STASH_FIRST
# bytes and doubles as its bytes arrive, so an announcement alone allocates little.
STASH_FIRST = 1 << 20
# A send abandoned mid-frame (the exchange failed) is finished if at most this much is
# left and it goes within FINISH_SECONDS: the stream stays in step, so the peer then hears
# the abort notice saying why, instead of a hang-up that looks like this rank crashed.
FINISH_BYTES = 64 << 20
FINISH_SECONDS = 1.0
SPIN_SECONDS = 50e-6  # how long an exchange first polls without blocking (adapted in _drive)
SPIN_MAX = 200e-6
SPIN_MIN = 2e-6
SPIN_RETRY = 64  # exchanges after polling was given up before it is tried again
CLOSE_LINGER = 0.25  # seconds close() waits for peers to hang up too (see _linger)
_DIRECT_BYTES = 16 * 1024  # payload left beyond this skips the buffer
_TLS_JOIN_BYTES = 16 * 1024  # under TLS, payloads up to this share their header's record
_SINK_BYTES = 1 << 20  # a sink's pieces: cache-sized (L2), a multiple of every item size

SWAP_DONE, SWAP_PENDING, SWAP_DECLINED = 0, 1, -1  # what TCPTransport.swap returns

_ERROR_CODES: dict[type[CollectiveError], int] = {
    CollectiveError: 1,
    TransportError: 2,
    CollectiveTimeout: 3,
    MismatchError: 4,
    UsageError: 5,
}
_ERROR_TYPES = {code: cls for cls, code in _ERROR_CODES.items()}


def _data_header(sends: Sequence[OutMessage], recvs: Sequence[InMessage]) -> Header | None:
    """The header of the collective an exchange belongs to (None for point-to-point)."""
    if recvs:
        header = recvs[0].expect
    elif sends:
        header = sends[0].header
    else:
        return None
    return header if header.frame == _wire.DATA else None


def _copy_error(exc: CollectiveError) -> CollectiveError:
    """A fresh exception like `exc` (same class, message and details) to raise again."""
    if isinstance(exc, TransportError):
        return TransportError(str(exc), peer=exc.peer)
    if isinstance(exc, CollectiveTimeout):
        return CollectiveTimeout(str(exc), op=exc.op, seq=exc.seq, waiting_on=exc.waiting_on)
    return type(exc)(str(exc))


def _error_code(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in _ERROR_CODES:
            return _ERROR_CODES[cls]
    return 1


class TCPTransport(Transport):
    """Full mesh of TCP connections among `size` ranks. Build it with `connect_mesh`."""

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
        self._unexpected: dict[tuple, deque[tuple[int, Header, np.ndarray]]] = {}
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
        # A swap (see `swap`) left for swap_finish: (error, header, sends, recvs, whether
        # it polled for the whole budget).
        self._swap: tuple | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, None)

    # ------------------------------------------------------------------ public interface

    def lost_peers(self) -> dict[int, str]:
        return {p: c.lost for p, c in self._conns.items() if c.lost is not None}

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

    # ---------------------------------------------------------- the repeated small swap

    def swap(
        self,
        peer: int,
        header: Header,
        payload: memoryview,
        into: memoryview,
        ready: bool = False,
    ) -> int:
        """The lean way of the commonest exchange: one frame of `header` (a collective's
        DATA frame) and `payload` to `peer`, and one frame back from it with the very same
        header (both sides send alike), its payload into `into`. For a repeated small
        call, without the queues, the poller or a message object: one `sendmsg`, then
        non-blocking `recv_into` the connection's read buffer while the peer is within the
        polling budget (SPIN_SECONDS, adapted as in _drive).

        Returns SWAP_DECLINED, having touched nothing, unless the swap is this plain
        (`swap_ready`; callers that asked it just before say so with `ready`): the
        only connection (so that reading it reads every abort notice and probe there can
        be), nothing queued, buffered, posted or reported failed, nothing kept early but
        maybe the very frame expected (then it is taken from there), the frame small
        enough for the read buffer. SWAP_DONE when both frames went. SWAP_PENDING
        when anything else happened (the first bytes back are not that frame, a partial
        send, a wait past the budget, a lost connection): everything is then in the
        regular state (the send queued, the receive posted, what was read in the buffer),
        and `swap_finish` goes on as `exchange` does (the same errors, deadline, probes)."""
        conn = self._conns[peer]
        nbytes = header.nbytes
        if nbytes != payload.nbytes or nbytes != into.nbytes:
            return SWAP_DECLINED
        if not ready and not self.swap_ready(peer, header):
            return SWAP_DECLINED
        early = None
        if self._unexpected:  # the peer's frame came already (swap_ready: that one alone)
            early = self._unexpected.pop(header.key)[0][2]
            self._unexpected_bytes -= nbytes
        group = header.group
        head = header.pack()
        try:
            self._calls.begin(group, header, ())
        except CollectiveError as exc:  # a probe kept for this call disagrees
            self._swap = (exc, header, (), (), False)
            return SWAP_PENDING
        sock = conn.sock
        total = _wire.SIZE + nbytes
        try:
            sent = sock.sendmsg([head, payload])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            sent = 0
            self._lose(conn, f"send failed: {exc.strerror or exc}")
        out = OutMessage(peer, header, payload)
        if sent == total:
            out.done = True
        elif conn.lost is None:  # the rest goes the regular way
            conn.outq.append(out)
            conn.out_hdr = head
            conn.out_sent = sent
            self._sel.modify(sock, conn, True)
            conn.writing = True
        if early is not None:
            into[:] = memoryview(early)
            if out.done:
                return SWAP_DONE
            self._swap = (None, header, (out,), (InMessage(peer, header, into, done=True),), False)
            return SWAP_PENDING
        buf = conn.rbuf
        raw = buf.obj  # the bytearray: startswith compares at C speed (a memoryview item by item)
        conn.rpos = conn.rend = end = 0
        spin = self._spin
        until = None
        spun = False  # polled for the whole budget
        if out.done:
            while True:
                try:
                    n = sock.recv_into(buf[end:])
                except (BlockingIOError, InterruptedError):
                    n = -1
                except OSError as exc:
                    self._lose(conn, f"connection error: {exc.strerror or exc}")
                    break
                if n == 0:
                    self._lose(conn, "connection closed by peer (process exited or crashed?)")
                    break
                if n > 0:
                    end += n
                    if end >= _wire.SIZE and not raw.startswith(head):
                        break  # another frame first: the regular way reads it
                    if end >= total:
                        break
                elif not spin or self._interrupted is not None:
                    break
                elif until is None:
                    until = time.monotonic() + spin
                elif time.monotonic() >= until:
                    spun = True
                    break
        conn.rend = end
        if out.done and end >= total and raw.startswith(head):
            into[:] = buf[_wire.SIZE : total]
            conn.rpos = total
            conn.last = header
            if spin:
                self._spin = min(2 * spin, SPIN_MAX)
            if end == total:
                conn.rpos = conn.rend = 0
                return SWAP_DONE
            # More came behind it (the peer's next frames): read them the regular way.
            m = InMessage(peer, header, into, done=True)
            self._swap = (None, header, (out,), (m,), False)
            return SWAP_PENDING
        m = InMessage(peer, header, into)
        self._swap = (None, header, (out,), (m,), spun)
        return SWAP_PENDING

    def swap_ready(self, peer: int, header: Header) -> bool:
        """Whether `swap` would take this swap with `peer` now (see there)."""
        unexpected = self._unexpected
        if unexpected:  # only the very frame expected, from that peer, come early
            queue = unexpected.get(header.key)
            if len(unexpected) != 1 or queue is None or len(queue) != 1:
                return False
            if queue[0][0] != peer or queue[0][1] != header:
                return False
        conn = self._conns.get(peer)
        return not (
            conn is None
            or conn.tls  # no sendmsg; records
            or len(self._conns) != 1
            or conn.lost is not None
            or conn.outq
            or conn.cur is not None
            or conn.rpos != conn.rend
            or self._posted
            or self._posted_any
            or self._aborted
            or self._interrupted is not None
            or self._closed
            or self._swap is not None
            or header.nbytes > _RBUF_BYTES - _wire.SIZE
            or _WAIT.on
        )

    def swap_finish(self, deadline: float | None, label: str = "") -> None:
        """Finish the swap `swap` left pending, as `exchange` would (see there)."""
        state = self._swap
        self._swap = None
        if state is None:  # pragma: no cover - the caller's bug
            raise RuntimeError("swap_finish without a pending swap")
        error, header, sends, recvs, spun = state
        if error is not None:
            raise error
        group, seq = header.group, header.seq
        conn = self._conns[recvs[0].peer]
        try:
            self._calls.active = group
            for m in recvs:
                if not m.done:
                    self._post(m)
            if conn.lost is None and conn.rend > conn.rpos:
                self._read(conn)  # what the swap read and did not take
            self._drive(sends, recvs, deadline, group, label, seq, spun)
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

    def _early(self, group: int) -> Iterator[tuple[int, Header]]:
        """(peer, header) of `group`'s DATA frames that came before their receive."""
        for key, stashed in self._unexpected.items():
            if key[0] == _wire.DATA and key[1] == group:
                for peer, got, _payload in stashed:
                    yield peer, got

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
        reason = str(error).encode("utf-8", "replace")[: _wire.MAX_ABORT_PAYLOAD]
        # `root` names the rank at fault when there is exactly one (the lost peer, the rank
        # a timeout waited on), so the relayed error keeps .peer / .waiting_on.
        culprit = -1
        if isinstance(error, TransportError) and error.peer is not None:
            culprit = error.peer
        elif isinstance(error, CollectiveTimeout) and len(error.waiting_on) == 1:
            culprit = error.waiting_on[0]
        header = Header(
            _wire.ABORT, _error_code(error), 0, 0, 0, group, seq, 0, culprit, 0, len(reason)
        )
        frame = header.pack() + reason
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

    # ------------------------------------------------------------------ posting

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

    def _post(self, m: InMessage) -> None:
        key = m.expect.key
        # A message that came early is delivered from where it was kept.
        queue = self._unexpected.get(key)
        if queue:
            for i, (peer, header, payload) in enumerate(queue):
                if m.peer in (ANY_SOURCE, peer):
                    del queue[i]
                    if not queue:
                        del self._unexpected[key]
                    self._unexpected_bytes -= payload.nbytes
                    self._calls.check_match(peer, header, m.expect, m.dest.nbytes)
                    _deliver(m, payload)
                    self._complete(m, peer, header)
                    return
        if self._adopt(m):
            return
        if m.peer == ANY_SOURCE:
            self._posted_any.setdefault(key, deque()).append(m)
        else:
            self._posted.setdefault((m.peer, key), deque()).append(m)

    def _adopt(self, m: InMessage) -> bool:
        """A message still arriving into a stash (it came before its receive): move what
        has landed into the receive's destination and read the rest straight there, so a
        large early message is copied only as far as it got, not whole at the end."""
        key = m.expect.key
        for conn in self._conns.values():
            header = conn.cur
            if (
                header is None
                or conn.stash is None
                or header.key != key
                or m.peer not in (ANY_SOURCE, conn.peer)
                or conn.lost is not None
            ):
                continue
            got = conn.got
            if m.sink is not None and got % m.align:
                continue  # a piece would split an item: delivered whole when it is in
            self._calls.check_match(conn.peer, header, m.expect, m.dest.nbytes)
            if got:
                _deliver(m, conn.stash[:got])
            self._unexpected_bytes -= header.nbytes
            conn.stash = None
            self._target(conn, m, header.nbytes, got)
            if m.on_data is not None and got:
                m.on_data(got)
            return True
        return False

    def _unpost(self, recvs: Sequence[InMessage]) -> None:
        for m in recvs:
            if m.done:
                continue
            for table, k in (
                (self._posted, (m.peer, m.expect.key)),
                (self._posted_any, m.expect.key),
            ):
                queue = table.get(k)
                if queue and m in queue:
                    queue.remove(m)
                    if not queue:
                        del table[k]
            for conn in self._conns.values():
                if conn.target is m:
                    # Half-received: the stream position is lost, so is the connection.
                    self._lose(conn, "a receive was abandoned mid-message")

    def _drop_unsent(self, sends: Sequence[OutMessage]) -> None:
        half_sent = []
        for m in sends:
            if m.done:
                continue
            conn = self._conns.get(m.peer)
            if conn is None or m not in conn.outq:
                continue
            if conn.outq[0] is m and conn.out_sent:
                half_sent.append((conn, m))
            else:
                conn.outq.remove(m)
        for conn, m in half_sent:
            self._finish_frame(conn, m)

    def _finish_frame(self, conn: _Conn, m: OutMessage) -> None:
        """Send the rest of a frame the failed exchange left half-sent, within bounds (the
        peer is reading: every rank reads all its connections while it waits), else give
        up the connection: the byte stream cannot be resumed mid-frame."""
        left = _wire.SIZE + m.payload.nbytes - conn.out_sent
        deadline = time.monotonic() + FINISH_SECONDS
        while left <= FINISH_BYTES and conn.lost is None and conn.outq and conn.outq[0] is m:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                self._pump(min(remaining, 0.05))
            except CollectiveError:
                pass  # this exchange failed already; other news waits for the next call
        if conn.lost is None and conn.outq and conn.outq[0] is m:
            self._lose(conn, "a send was abandoned mid-message")

    def _enqueue(self, m: OutMessage) -> None:
        conn = self._conns[m.peer]
        conn.outq.append(m)
        if len(conn.outq) == 1:
            self._flush(conn)

    # ------------------------------------------------------------------ the progress loop

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
        now = time.monotonic()
        probe_at = now + PROBE_AFTER if recvs else None
        # Poll without blocking for a moment first: a small message from a peer that is
        # running arrives within microseconds, where sleeping in the selector adds two
        # context switches to every step (the sender's wake-up of the sleeper, and back).
        # Adapted to what pays: doubled (to SPIN_MAX) when the exchange ends while
        # polling, quartered (to 0) when it does not, as when ranks outnumber the cores
        # and a poller only keeps its peer off the core; retried every SPIN_RETRY.
        spin = self._spin
        if spun:  # the caller polled for its budget already (swap), to no avail
            self._spin = spin / 4 if spin >= 4 * SPIN_MIN else 0.0
            spin = 0.0
        elif not spin:
            self._unspun += 1
            if self._unspun >= SPIN_RETRY:
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
                    self._spin = spin = spin / 4 if spin >= 4 * SPIN_MIN else 0.0
            self._pump(timeout)
            self._raise_if_aborted(group, seq, sends, recvs)
            self._raise_if_interrupted()
            for m in recvs:
                if not m.done:
                    self._raise_if_lost(m.peer)
            for m in sends:
                if not m.done:
                    self._raise_if_lost(m.peer)

    def _probe(self, recvs: Sequence[InMessage]) -> None:
        """Tell each peer we still wait on in this collective which collective it is."""
        seen = set()
        for m in recvs:
            if m.done or m.expect.frame != _wire.DATA or m.peer in seen:
                continue
            seen.add(m.peer)
            conn = self._conns.get(m.peer)
            if conn is None or conn.lost is not None:
                continue
            self._send_probe(m.peer, m.expect)

    def _send_probe(self, peer: int, e: Header) -> None:
        self._calls.probing(peer, e)
        header = Header(
            _wire.PROBE, e.kind, e.dtype, e.op, e.algo, e.group, e.seq, 0, e.root, e.count, 0
        )
        self._enqueue(OutMessage(peer, header, memoryview(b"")))

    def _on_probe(self, peer: int, got: Header) -> None:
        reply = self._calls.on_probe(peer, got)
        if reply is not None:
            self._send_probe(peer, reply)

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
            if readable and conn.lost is None:
                self._read(conn)

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

    def _raise_if_lost(self, peer: int) -> None:
        if peer == ANY_SOURCE:
            return
        conn = self._conns[peer]
        if conn.lost is not None:
            raise TransportError(f"rank {self.rank} lost rank {peer}: {conn.lost}", peer=peer)

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
        error = _copy_error(exc)
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

    def _raise_if_interrupted(self) -> None:
        if self._interrupted is not None:
            raise TransportError(self._interrupted)

    def _lose(self, conn: _Conn, reason: str) -> None:
        if conn.lost is not None:
            return
        conn.lost = reason
        self._hang_up(conn)

    def _hang_up(self, conn: _Conn) -> None:
        """Stop polling a connection and close its socket (either may be done already)."""
        self._sel.unregister(conn.sock)
        try:
            conn.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ sending

    def _flush(self, conn: _Conn) -> None:
        sock = conn.sock
        while conn.outq:
            m = conn.outq[0]
            if conn.out_sent == 0:
                conn.out_hdr = m.header.pack()
            hlen = len(conn.out_hdr)
            total = hlen + m.payload.nbytes
            sent = conn.out_sent
            try:
                if conn.tls:
                    n = self._send_tls(conn, m, sent, hlen)
                elif sent < hlen:
                    n = sock.sendmsg([conn.out_hdr[sent:], m.payload])
                else:
                    n = sock.send(m.payload[sent - hlen :])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                conn.write_pending = conn.tls
                break
            except OSError as exc:
                self._lose(conn, f"send failed: {exc.strerror or exc}")
                return
            conn.write_pending = False
            conn.out_sent = sent + n
            if conn.out_sent < total:
                break
            conn.outq.popleft()
            conn.out_sent = 0
            m.done = True
        want_write = bool(conn.outq)
        if want_write != conn.writing:
            self._sel.modify(sock, conn, want_write)
            conn.writing = want_write

    @staticmethod
    def _send_tls(conn: _Conn, m: OutMessage, sent: int, hlen: int) -> int:
        """One SSL write of what is left of `m`'s frame. A small frame goes as one record
        (header and payload together); a large payload as one write of its own, which
        OpenSSL encrypts into records as the socket takes them."""
        if sent < hlen:
            if m.payload.nbytes <= _TLS_JOIN_BYTES:
                return conn.sock.send(conn.out_hdr[sent:] + m.payload)
            return conn.sock.send(conn.out_hdr[sent:])
        return conn.sock.send(m.payload[sent - hlen :])

    # ------------------------------------------------------------------ receiving

    def _read(self, conn: _Conn) -> None:
        """Read what is there (the socket is non-blocking) and act on every whole header
        and payload. Returns after a short read: the socket is then most likely drained,
        and if not the (level-triggered) selector says so again."""
        buf = conn.rbuf
        drained = False
        while True:
            avail = conn.rend - conn.rpos
            if conn.cur is None:
                if avail >= _wire.SIZE:
                    pos = conn.rpos
                    conn.rpos = pos + _wire.SIZE
                    self._on_header(conn, pos)
                    if conn.lost is not None:
                        return
                    continue
            else:
                view = conn.view
                assert view is not None  # noqa: S101 - set with cur
                got = conn.got
                if avail:
                    k = min(avail, view.nbytes - got)
                    pos = conn.rpos
                    view[got : got + k] = buf[pos : pos + k]
                    conn.rpos = pos + k
                    self._on_bytes(conn, k)
                    if conn.lost is not None:
                        return
                    continue
                left = view.nbytes - got
                if left >= _DIRECT_BYTES:
                    if drained:
                        return
                    n = self._recv(conn, view[got:])
                    if n <= 0:
                        return
                    drained = n < left and not (conn.tls and conn.sock.pending())
                    self._on_bytes(conn, n)
                    if conn.lost is not None:
                        return
                    continue
            if drained:
                return
            # Refill the buffer, keeping the start of a header that is not whole yet.
            if conn.rpos == conn.rend:
                conn.rpos = conn.rend = 0
            elif conn.rend > _RBUF_BYTES - _wire.SIZE:
                rest = conn.rend - conn.rpos
                buf[:rest] = buf[conn.rpos : conn.rend]
                conn.rpos, conn.rend = 0, rest
            space = _RBUF_BYTES - conn.rend
            n = self._recv(conn, buf[conn.rend :])
            if n <= 0:
                return
            conn.rend += n
            # Under TLS a short read is one record: more may be decrypted and waiting.
            drained = n < space and not (conn.tls and conn.sock.pending())

    def _recv(self, conn: _Conn, into: memoryview) -> int:
        """recv_into `into`: bytes read, 0 if none are there yet, -1 if the peer is lost."""
        if conn.tls:
            return self._recv_tls(conn, into)
        try:
            n = conn.sock.recv_into(into)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._lose(conn, f"connection error: {exc.strerror or exc}")
            return -1
        if n == 0:
            self._lose(conn, "connection closed by peer (process exited or crashed?)")
            return -1
        return n

    def _recv_tls(self, conn: _Conn, into: memoryview) -> int:
        """_recv under TLS: SSL hands out one record (16 KiB at most) a call, so read record
        after record until `into` is full or nothing more has come; the loop around the
        state machine then runs once for many records, not once for each."""
        sock, got, size = conn.sock, 0, into.nbytes
        while got < size:
            try:
                n = sock.recv_into(into[got:] if got else into)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return got
            except ssl.SSLZeroReturnError:
                n = 0  # the peer closed its TLS session
            except OSError as exc:
                self._lose(conn, f"connection error: {exc.strerror or exc}")
                return -1
            if n == 0:
                if got:
                    return got  # take what came; the next read finds the close
                self._lose(conn, "connection closed by peer (process exited or crashed?)")
                return -1
            got += n
        return got

    def _on_bytes(self, conn: _Conn, n: int) -> None:
        conn.got += n
        target = conn.target
        if target is not None:
            if target.sink is not None:
                if conn.got == conn.view.nbytes:  # type: ignore[union-attr]
                    target.sink(conn.view)  # type: ignore[arg-type]
                    if conn.left:
                        piece = min(_SINK_BYTES, conn.left)
                        conn.view = conn.window[:piece]  # type: ignore[index]
                        conn.left -= piece
                        conn.got = 0
                        return
                    self._on_payload(conn)
                return
            if target.on_data is not None:
                target.on_data(conn.got)
        if conn.got == conn.view.nbytes:  # type: ignore[union-attr]
            if conn.stash is not None and conn.got < conn.cur.nbytes:  # type: ignore[union-attr]
                self._grow_stash(conn)
                return
            self._on_payload(conn)

    @staticmethod
    def _grow_stash(conn: _Conn) -> None:
        """The early message's buffer is full and more is coming: double it (to its size)."""
        old = conn.stash
        assert old is not None and conn.cur is not None  # noqa: S101
        new = np.empty(min(2 * old.size, conn.cur.nbytes), dtype=np.uint8)
        new[: old.size] = old
        conn.stash = new
        conn.view = memoryview(new).cast("B")

    def _on_header(self, conn: _Conn, pos: int) -> None:
        try:
            header = _wire.unpack(conn.rbuf, pos)
        except _wire.FrameError as exc:
            # Lose the connection but raise nothing here: the exchange in progress may be
            # another group's, with other peers; whoever needs this peer raises (_drive).
            self._lose(conn, f"rank {conn.peer} sent an invalid frame: {exc}")
            return
        if (
            header.nbytes > MAX_FRAME_BYTES
            or (header.frame == _wire.ABORT and header.nbytes > _wire.MAX_ABORT_PAYLOAD)
            or (header.frame == _wire.PROBE and header.nbytes)
        ):
            self._lose(
                conn, f"rank {conn.peer} announced a {header.nbytes}-byte frame, over the limit"
            )
            return
        conn.cur = conn.last = header
        conn.got = 0
        mismatch: MismatchError | None = None
        try:
            target = self._match(conn.peer, header)
        except MismatchError as exc:
            # Keep the stream in step: the payload is read and set aside, then we raise.
            target, mismatch = None, exc
        if target is not None:
            self._target(conn, target, header.nbytes)
        else:
            if self._unexpected_bytes + header.nbytes > self.max_unexpected:
                self._lose(
                    conn,
                    f"rank {conn.peer} sent {header.nbytes} bytes nobody asked for, beyond "
                    f"the {self.max_unexpected}-byte bound on early messages "
                    "(PYCOLLECTIVE_MAX_EARLY_BYTES)",
                )
                return
            conn.stash = np.empty(min(header.nbytes, STASH_FIRST), dtype=np.uint8)
            conn.view = memoryview(conn.stash).cast("B")
            self._unexpected_bytes += header.nbytes
        if header.nbytes == 0:
            self._on_payload(conn)
        if mismatch is not None:
            raise mismatch

    @staticmethod
    def _target(conn: _Conn, m: InMessage, nbytes: int, got: int = 0) -> None:
        """Read the rest of an `nbytes` payload, of which `got` bytes are in already, for
        `m`: into its destination, or piece by piece through the connection's window."""
        conn.target = m
        if m.sink is not None:
            if conn.window is None:
                conn.window = memoryview(bytearray(_SINK_BYTES))
            rest = nbytes - got
            first = min(_SINK_BYTES, rest)
            conn.view = conn.window[:first]
            conn.left = rest - first
            conn.got = 0
            return
        dest = m.dest
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")  # bytes are copied in from the read buffer by slices
        conn.view = dest[:nbytes]
        conn.got = got

    def _match(self, peer: int, header: Header) -> InMessage | None:
        """The posted receive this header is for, after checking it agrees with ours."""
        if header.frame == _wire.ABORT or header.frame == _wire.PROBE:
            return None
        key = header.key
        queue = self._posted.get((peer, key))
        if not queue and header.frame == _wire.P2P:
            queue = self._posted_any.get(key)
        if queue:
            m = queue[0]
            self._calls.check_match(peer, header, m.expect, m.dest.nbytes)
            queue.popleft()
            if not queue:
                self._posted.pop((peer, key), None)
                self._posted_any.pop(key, None)
            return m
        if header.frame == _wire.DATA:
            self._calls.arrived_early(peer, header)
        return None

    def _on_payload(self, conn: _Conn) -> None:
        header = conn.cur
        assert header is not None  # noqa: S101 - internal invariant of the state machine
        target, stash = conn.target, conn.stash
        conn.cur = conn.target = conn.stash = conn.view = None
        conn.got = 0
        if header.frame == _wire.PROBE:
            self._on_probe(conn.peer, header)
            return
        if header.frame == _wire.ABORT:
            self._unexpected_bytes -= header.nbytes
            reason = bytes(stash).decode("utf-8", "replace") if stash is not None else ""
            cls = _ERROR_TYPES.get(header.kind, CollectiveError)
            if cls is UsageError:
                cls = CollectiveError  # someone else's misuse is not ours
            message = f"rank {conn.peer} failed: {reason}"
            culprit = header.root if header.root >= 0 else None
            if cls is TransportError:
                error: CollectiveError = TransportError(message, peer=culprit)
            elif cls is CollectiveTimeout:
                waiting = () if culprit is None else (culprit,)
                error = CollectiveTimeout(message, waiting_on=waiting)
            else:
                error = cls(message)
            if header.seq < self._abort_seq.get(header.group, header.seq + 1):
                # the earliest collective that failed is the one to report
                self._aborted[header.group] = error
                self._abort_seq[header.group] = header.seq
            return
        if target is not None:
            self._complete(target, conn.peer, header)
        else:
            assert stash is not None  # noqa: S101
            # Its receive may have been posted while the message was still arriving.
            late = self._match(conn.peer, header)
            if late is not None:
                self._unexpected_bytes -= header.nbytes
                _deliver(late, memoryview(stash))
                self._complete(late, conn.peer, header)
            else:
                self._unexpected.setdefault(header.key, deque()).append((conn.peer, header, stash))

    @staticmethod
    def _complete(m: InMessage, peer: int, header: Header) -> None:
        m.source = peer
        m.header = header
        m.done = True


def _deliver(m: InMessage, payload: memoryview | np.ndarray) -> None:
    """Hand a payload that was kept aside (it came early) to its receive."""
    data = payload if isinstance(payload, memoryview) else memoryview(payload)
    if m.sink is not None:
        for lo in range(0, data.nbytes, _SINK_BYTES):
            m.sink(data[lo : lo + _SINK_BYTES])
    else:
        m.dest[: data.nbytes] = data
