"""The send queue: each connection's frames go out in order, header and payload in one
`sendmsg` straight from the caller's memory, as far as the socket takes them; a frame a
failed exchange left half-sent is finished within bounds, so the stream stays in step."""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence

from ..._errors import CollectiveError
from .. import _wire
from .._base import OutMessage
from .conn import Conn as _Conn
from .state import TransportState

# A send abandoned mid-frame (the exchange failed) is finished if at most this much is
# left and it goes within FINISH_SECONDS: the stream stays in step, so the peer then hears
# the abort notice saying why, instead of a hang-up that looks like this rank crashed.
FINISH_BYTES = 64 << 20
FINISH_SECONDS = 1.0
_TLS_JOIN_BYTES = 16 * 1024  # under TLS, payloads up to this share their header's record
# During an exchange, a payload with at least this much left when the socket is full is
# written by the send helper (sender.py) while this thread reads: 2-4 socket buffers.
HELPER_BYTES = 1 << 20


class Sending(TransportState):
    """Queueing frames and writing them out."""

    def _enqueue(self, m: OutMessage) -> None:
        conn = self._conns[m.peer]
        conn.outq.append(m)
        if len(conn.outq) == 1:
            self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.helper:
            return  # the send helper writes this connection's head frame
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
                if (
                    self._driving
                    and total - conn.out_sent >= HELPER_BYTES
                    and conn.out_sent >= hlen
                    and not conn.tls
                    and self._helper_conn is None
                ):
                    self._helper_conn = conn
                    conn.helper = True
                    self._helper.start(sock, m.payload[conn.out_sent - hlen :])
                    if conn.writing:  # the helper waits for room itself
                        self._sel.modify(sock, conn, False, not conn.reader)
                        conn.writing = False
                    return
                break
            conn.outq.popleft()
            conn.out_sent = 0
            m.done = True
        want_write = bool(conn.outq)
        if want_write != conn.writing:
            self._sel.modify(sock, conn, want_write, not conn.reader)
            conn.writing = want_write

    def _fold_send(self) -> None:
        """Take back what the send helper finished (if it has): the frame is done, or the
        connection is lost with the helper's error; the queue goes on from here."""
        conn = self._helper_conn
        if conn is None or self._helper.busy:
            return
        self._helper_conn = None
        conn.helper = False
        m = conn.outq[0]
        conn.out_sent += self._helper.sent
        error = self._helper.error
        if error is not None:
            self._lose(conn, f"send failed: {error.strerror or error}")
            return
        if conn.out_sent == len(conn.out_hdr) + m.payload.nbytes:
            conn.outq.popleft()
            conn.out_sent = 0
            m.done = True
        if conn.lost is None:
            self._flush(conn)

    def _take_back_send(self) -> None:
        """Stop the send helper (within its poll interval) and fold what it wrote."""
        if self._helper_conn is not None:
            self._helper.wait_stopped()
            self._fold_send()

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
