"""Reading: bytes off each connection, through its 64 KiB read buffer for headers and
small payloads, straight into the destination for large ones, or piece by piece through
a window that a reduction reads from (a sink). What a header or a whole payload means is
matching.py's."""

from __future__ import annotations

import ssl

from .. import _wire
from .._base import InMessage
from .conn import RBUF_BYTES as _RBUF_BYTES
from .conn import Conn as _Conn
from .state import TransportState

_DIRECT_BYTES = 16 * 1024  # payload left beyond this skips the buffer
SINK_BYTES = 1 << 20  # a sink's pieces: cache-sized (L2), a multiple of every item size


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
