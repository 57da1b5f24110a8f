"""Reading: bytes off each connection, through its 64 KiB read buffer for headers and
small payloads, straight into the destination for large ones, or piece by piece through
a window that a reduction reads from (a sink); during an exchange, a large sink payload's
pieces are read by the receive helper (receiver.py) while this thread reduces them. What
a header or a whole payload means is matching.py's."""

from __future__ import annotations

import os
import ssl

from .. import _wire
from .._base import InMessage
from .conn import RBUF_BYTES as _RBUF_BYTES
from .conn import Conn as _Conn
from .folding import COPY_FROM_BYTES, FOLD_BUDGET_BYTES, FOLD_PIECE_BYTES
from .state import TransportState

_DIRECT_BYTES = 16 * 1024  # payload left beyond this skips the buffer
SINK_BYTES = 1 << 20  # a sink's pieces: cache-sized (L2), a multiple of every item size
# During an exchange, a payload for a posted receive with at least this much left is read
# by the receive helper (receiver.py) in place, and a sink's with at least SINK_HELPER_BYTES
# left at a piece boundary through its windows while this thread reduces what it has read.
# A 4 MiB all_reduce of 2 ranks (2 MiB payloads) stays on this thread: its bursts are a
# slice or two long, and the hand-offs would cost more than they win back.
RECV_HELPER_BYTES = 4 << 20
SINK_HELPER_BYTES = 4 << 20
# The helper's pieces (a divisor of SINK_BYTES): small enough that the two threads hand
# pieces to each other, and so sleep and wake, hundreds of times a 64 MiB call, which a
# busy machine's scheduler serves sooner than long bursts (docs/tcp.md, "Under load").
HELPER_PIECE_BYTES = 256 << 10


class Receiving(TransportState):
    """The receive state machine's byte side."""

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
                    if k >= COPY_FROM_BYTES and self._copy is not None:
                        self._copy(view[got : got + k], buf[pos : pos + k])
                    else:
                        view[got : got + k] = buf[pos : pos + k]
                    conn.rpos = pos + k
                    self._on_bytes(conn, k)
                    if conn.lost is not None:
                        return
                    continue
                if self._fold is not None and conn.target is not None and not conn.tls:
                    fold = conn.target.fold
                    if fold is not None:  # a reduction the compiled core reads and combines
                        if drained or not self._recv_fold(conn, fold):
                            return
                        continue
                left = view.nbytes - got
                # A sink's piece with more to follow is read to its end in place even
                # when little is left: through the read buffer, its tail would come with
                # the next piece's start, and a boundary reached with bytes read ahead
                # can never go to the receive helper (_hand_read).
                target = conn.target
                sink_mid = got and conn.left and target is not None and target.sink is not None
                if left >= _DIRECT_BYTES or sink_mid:
                    if drained:
                        return
                    if self._hand_read(conn):
                        return  # the receive helper reads the rest; _fold_recv takes it
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

    def _recv_fold(self, conn: _Conn, fold: tuple[int, int]) -> bool:
        """Read the rest of `conn`'s sink payload with the compiled recv_reduce, which
        combines it into the receive's destination as it lands (the window's first
        conn.got bytes, read already, go first). True once the payload is in; False when
        the socket has nothing more for now, the budget is spent (the sends get their
        turn; the poller says readable again) or the connection is lost. The sink has
        been given every byte before the window's; from here on it is not called."""
        target, window, view = conn.target, conn.window, conn.view
        assert target is not None and window is not None and view is not None  # noqa: S101
        dest = target.dest
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        have = conn.got
        rest = view.nbytes - have + conn.left  # payload bytes not read yet
        start = dest.nbytes - rest - have  # where window[0] goes
        scratch = window if have > FOLD_PIECE_BYTES else window[:FOLD_PIECE_BYTES]
        op, dtype = fold
        n, _, have, status = self._fold(  # type: ignore[misc]  # checked by the caller
            conn.sock.fileno(), dest[start:], scratch, have, op, dtype, FOLD_BUDGET_BYTES
        )
        rest -= n
        if rest:  # the window holds `have` bytes of a split item; keep the counts whole
            piece = min(len(window), have + rest)
            conn.view = window[:piece]
            conn.left = have + rest - piece
            conn.got = have
        if status:
            reason = os.strerror(status) if status > 0 else ""
            self._lose(
                conn,
                f"connection error: {reason}"
                if reason
                else "connection closed by peer (process exited or crashed?)",
            )
            return False
        if rest:
            return False
        conn.got = 0
        self._on_payload(conn)
        return conn.lost is None

    def _hand_read(self, conn: _Conn) -> bool:
        """Give the rest of `conn`'s payload for a posted receive to the receive helper if
        it is large, the helper is wanted (PYCOLLECTIVE_TCP_RECV_HELPER: by default while
        the machine is busy) and free (the read buffer empty, a sink's at a piece
        boundary: the helper reads exactly the payload's bytes, so the stream stays in
        step): a sink's pieces through its windows, a plain payload into its
        destination."""
        target, view = conn.target, conn.view
        if (
            target is None
            or view is None
            or not self._driving
            or self._reader_conn is not None
            or conn.tls
            or not self._sel.unwatches_reads
        ):
            return False
        if target.sink is not None:
            rest = view.nbytes + conn.left
            if conn.got or rest < max(SINK_HELPER_BYTES, RECV_HELPER_BYTES):
                return False
            into = None
        else:
            rest = view.nbytes - conn.got
            if rest < RECV_HELPER_BYTES:
                return False
            into = view[conn.got :]
        if not self._reader_wanted():  # last: it may read the machine's load
            return False
        self._reader_conn, self._reader_left, self._reader_sink = conn, rest, target.sink
        conn.reader = True
        self._sel.modify(conn.sock, conn, conn.writing, read=False)
        self._reader.start(conn.sock, rest, HELPER_PIECE_BYTES, into)
        return True

    def _fold_recv(self) -> None:
        """Take the pieces the receive helper read (a sink reduces them, a plain payload
        counts them in); once it has let go, finish the payload, or lose the connection
        with its error, or (stopped part way) leave what it read of a piece where this
        thread goes on from."""
        conn, reader, sink = self._reader_conn, self._reader, self._reader_sink
        assert conn is not None  # noqa: S101
        busy = reader.busy  # read first: pieces come before the thread lets go
        for piece in reader.take():
            if sink is None:
                self._on_bytes(conn, piece.nbytes)  # in place already; the last completes
            else:
                sink(piece)
            self._reader_left -= piece.nbytes
            reader.give_back(piece)
        if busy:
            return
        self._reader_conn = None
        conn.reader = False
        if reader.error is not None:
            self._lose(conn, reader.error)
            return
        if conn.lost is not None:
            return
        self._sel.modify(conn.sock, conn, conn.writing)
        if sink is None:
            if reader.partial is not None and reader.partial.nbytes:
                self._on_bytes(conn, reader.partial.nbytes)  # short of the end: no completion
            return
        left = self._reader_left
        if not left:
            self._on_payload(conn)
            return
        if conn.window is None:
            conn.window = memoryview(bytearray(SINK_BYTES))
        piece = min(SINK_BYTES, left)
        got = reader.partial
        n = 0 if got is None else got.nbytes
        if n:
            conn.window[:n] = got
        conn.view = conn.window[:piece]
        conn.got = n
        conn.left = left - piece

    def _take_back_recv(self) -> None:
        """Stop the receive helper (within its poll interval) and fold what it read."""
        if self._reader_conn is not None:
            self._reader.wait_stopped()
            self._fold_recv()

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
                        piece = min(SINK_BYTES, conn.left)
                        conn.view = conn.window[:piece]  # type: ignore[index]
                        conn.left -= piece
                        conn.got = 0
                        return
                    self._on_payload(conn)
                return
            if target.on_data is not None:
                target.on_data(conn.got)
        if conn.got == conn.view.nbytes:  # type: ignore[union-attr]
            stash = conn.stash
            if stash is not None and stash.before_last + conn.got < stash.nbytes:
                # the early message's piece is full and more is coming: the next piece
                conn.view = stash.grow()
                conn.got = 0
                return
            self._on_payload(conn)

    @staticmethod
    def _target(conn: _Conn, m: InMessage, nbytes: int, got: int = 0) -> None:
        """Read the rest of an `nbytes` payload, of which `got` bytes are in already, for
        `m`: into its destination, or piece by piece through the connection's window."""
        conn.target = m
        if m.sink is not None:
            if conn.window is None:
                conn.window = memoryview(bytearray(SINK_BYTES))
            rest = nbytes - got
            first = min(SINK_BYTES, rest)
            conn.view = conn.window[:first]
            conn.left = rest - first
            conn.got = 0
            return
        dest = m.dest
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")  # bytes are copied in from the read buffer by slices
        conn.view = dest[:nbytes]
        conn.got = got
