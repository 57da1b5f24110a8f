"""The repeated swap (runners/swap.py): one frame each way with the only peer, without
the queues, the poller or a message object, handed to the regular machinery (progress.py)
the moment anything is not plain. A frame that fits the connection's read buffer is read
there whole; a larger one (up to SWAP_MAX_BYTES) has its header read there and its payload
straight into the destination, the send's rest written in between."""

from __future__ import annotations

import os
import time
from typing import Any

from ..._errors import CollectiveError
from ...observe.timeline import WAIT as _WAIT
from .. import _wire
from .._base import InMessage, OutMessage
from .._wire import Header
from .conn import RBUF_BYTES as _RBUF_BYTES
from .conn import Conn
from .folding import compiled_swap_path
from .progress import SPIN_MAX, Progress
from .stash import Stash

SWAP_DONE, SWAP_PENDING, SWAP_DECLINED = 0, 1, -1  # what TCPTransport.swap returns
SWAP_FOLDED = 2  # SWAP_DONE, the payload reduced into the caller's buffer already (`fold`)
# The largest payload a swap takes: the caller keeps a destination this large per call
# signature (runners/swap.py), and beyond a few MiB the ring, not one swap, is the schedule.
SWAP_MAX_BYTES = 4 << 20
# A large swap goes on while bytes move each way within the polling budget, but hands
# over to the regular loop (its deadline, probes, helpers) after this long in all.
SWAP_HOLD_SECONDS = 0.05


class Swapping(Progress):
    """`swap`, `swap_ready`, `swap_finish`."""

    def swap(
        self,
        peer: int,
        header: Header,
        payload: memoryview,
        into: memoryview,
        ready: bool = False,
        fold: tuple[memoryview, int, int] | None = None,
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
        and `swap_finish` goes on as `exchange` does (the same errors, deadline, probes).

        With `fold` (dst, op, dtype: pycollective._native's kernel codes, dst aligned and
        as long as the payload), a frame small enough for the read buffer may be sent,
        polled for and reduced (dst = dst op payload) by the compiled core in one call
        (`_round`, the GIL released): SWAP_FOLDED then says the reduction is done; any
        other result leaves it to the caller, as without `fold`."""
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
        if nbytes > _RBUF_BYTES - _wire.SIZE:
            return self._swap_large(conn, header, head, payload, into, early)
        if early is None and self._round is not None:
            return self._swap_compiled(conn, header, head, payload, into, fold)
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
        self._settle_send(conn, out, head, sent)
        if early is not None:
            early.copy_into(into)
            early.release()
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
            self._took(conn, header, total, spin)
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

    def _swap_compiled(
        self,
        conn: Conn,
        header: Header,
        head: bytes,
        payload: memoryview,
        into: memoryview,
        fold: tuple[memoryview, int, int] | None,
    ) -> int:
        """`swap`'s small frame by the compiled round (csrc/swapio.c): the same send,
        polling and checks as the Python loop below, which stays the reference; what it
        leaves is settled here the same way."""
        spin = self._spin if self._interrupted is None else 0.0
        dst, op, dtype = fold if fold is not None else (None, 0, 0)
        result = self._round(
            conn.sock.fileno(), head, payload, conn.rbuf, spin, into, dst, op, dtype
        )
        sent, _, _, _, _, landed = result
        if landed and sent == _wire.SIZE + header.nbytes:  # all sent, exactly our frame came
            conn.rend = 0
            self._took(conn, header, 0, spin)
            return SWAP_DONE if dst is None else SWAP_FOLDED
        self._settle_round(conn, header, head, payload, into, spin, result)
        return SWAP_PENDING

    def swap_settle(
        self, peer: int, header: Header, payload: memoryview, into: memoryview, result: tuple
    ) -> None:
        """After a compiled round that csrc/swappath.c ran itself (its call tracker's
        `begin` done, the polling budget `_spin`) and that was not plain: its state the
        regular way, for `swap_finish` (result: swap_round's)."""
        self._settle_round(
            self._conns[peer], header, header.pack(), payload, into, self._spin, result
        )

    def _settle_round(
        self,
        conn: Conn,
        header: Header,
        head: bytes,
        payload: memoryview,
        into: memoryview,
        spin: float,
        result: tuple,
    ) -> None:
        """What a compiled round that was not plain left, in the regular state (the send's
        rest queued, what was read in the read buffer, the receive to post), the swap
        pending for `swap_finish`."""
        sent, end, send_err, recv_status, spun, _ = result
        total = _wire.SIZE + header.nbytes
        if send_err:
            self._lose(conn, f"send failed: {os.strerror(send_err)}")
        out = OutMessage(conn.peer, header, payload)
        self._settle_send(conn, out, head, sent)
        conn.rpos, conn.rend = 0, end
        if recv_status:
            self._lose(
                conn,
                "connection closed by peer (process exited or crashed?)"
                if recv_status < 0
                else f"connection error: {os.strerror(recv_status)}",
            )
        elif out.done and end > total and conn.rbuf[: _wire.SIZE] == head:
            # Our frame and more behind it (the peer's next frames): the regular way reads those.
            into[:] = conn.rbuf[_wire.SIZE : total]
            self._took(conn, header, total, spin)
            m = InMessage(conn.peer, header, into, done=True)
            self._swap = (None, header, (out,), (m,), False)
            return
        self._swap = (None, header, (out,), (InMessage(conn.peer, header, into),), bool(spun))

    def _took(self, conn: Conn, header: Header, rpos: int, spin: float) -> None:
        """Our frame was read whole from the read buffer, up to `rpos`, within the polling
        budget `spin`: it is the connection's last, and the budget may grow."""
        conn.rpos = rpos
        conn.last = header
        if spin:
            self._spin = min(2 * spin, SPIN_MAX)

    def _settle_send(self, conn: Conn, out: OutMessage, head: bytes, sent: int) -> None:
        """After a swap's sends: `out` done if all `sent`, else (the connection alive) its
        rest queued the regular way, from that byte on."""
        if sent == _wire.SIZE + out.payload.nbytes:
            out.done = True
        elif conn.lost is None:
            conn.outq.append(out)
            conn.out_hdr = head
            conn.out_sent = sent
            self._sel.modify(conn.sock, conn, True)
            conn.writing = True

    def _swap_large(
        self,
        conn: Conn,
        header: Header,
        head: bytes,
        payload: memoryview,
        into: memoryview,
        early: Stash | None,
    ) -> int:
        """`swap` of a payload larger than the read buffer: the frame's header is read
        into the read buffer (exactly its bytes, so nothing behind it is read), the
        payload straight into `into`, and the send's rest written in between, while
        bytes move within the polling budget. Whatever is left is handed to the regular
        machinery in its own terms: the send's rest queued, a payload part way in as the
        connection's current receive (as an adopted early message), anything else in
        the read buffer with the receive posted."""
        peer, nbytes = conn.peer, header.nbytes
        sock = conn.sock
        total = _wire.SIZE + nbytes
        out = OutMessage(peer, header, payload)
        m = InMessage(peer, header, into)
        sent = 0
        if early is not None:  # the peer's frame came whole already
            early.copy_into(into)
            early.release()
            m.done = True
            got = nbytes
        else:
            got = -1  # payload bytes in `into`; -1 until the header is in and is ours
        buf = conn.rbuf
        raw = buf.obj  # the bytearray: startswith compares at C speed
        conn.rpos = conn.rend = end = 0
        spin = self._spin
        start = time.monotonic()
        until = start + spin
        spun = False
        while conn.lost is None:
            moved = False
            if sent < total:
                try:
                    if sent < _wire.SIZE:
                        n = sock.sendmsg([memoryview(head)[sent:], payload])
                    else:
                        n = sock.send(payload[sent - _wire.SIZE :])
                except (BlockingIOError, InterruptedError):
                    n = 0
                except OSError as exc:
                    self._lose(conn, f"send failed: {exc.strerror or exc}")
                    break
                sent += n
                moved = n > 0
            if got < nbytes:
                n = self._recv(conn, buf[end : _wire.SIZE] if got < 0 else into[got:])
                if n < 0:  # lost (and said why)
                    break
                if n > 0:
                    moved = True
                    if got >= 0:
                        got += n
                    else:
                        end += n
                        if end == _wire.SIZE:
                            if not raw.startswith(head):
                                break  # another frame first: the regular way reads it
                            end = got = 0
            if sent == total and got == nbytes:
                break
            now = time.monotonic()
            if moved:
                if now - start < SWAP_HOLD_SECONDS:
                    until = now + spin
                    continue
                break
            if not spin or self._interrupted is not None:
                break
            if now >= until:
                spun = True
                break
        self._settle_send(conn, out, head, sent)
        if got == nbytes:
            m.done = True
            conn.last = header
            if out.done:
                if spin:
                    self._spin = min(2 * spin, SPIN_MAX)
                return SWAP_DONE
        elif got >= 0 and conn.lost is None:  # part way in: the connection's current read
            conn.cur = conn.last = header
            self._target(conn, m, nbytes, got)
        else:
            conn.rend = end  # a header's start, or another frame's: read the regular way
        self._swap = (None, header, (out,), (m,), spun)
        return SWAP_PENDING

    def compiled_path(
        self,
        fallback: Any,
        group_state: Any,
        engine_state: Any,
        recorder: Any,
        entry_type: type,
        running: str,
        completed: str,
    ) -> Any:
        """The whole repeated small swap in C (csrc/swappath.c's SwapPath) in front of
        `fallback` (runners/swap.py's SwapFast, which it calls for whatever it does not
        take), or None where the compiled round is off. It reads this transport's fields
        that `swap_ready` reads, and the connection's (`Conn`'s slots)."""
        path = compiled_swap_path(group_state, engine_state)
        if path is None or self._round is None:
            return None
        return path(
            fallback, group_state, engine_state, recorder, entry_type, running, completed,
            self, Conn, Header, _wire.SEQ_OFFSET, _WAIT, SPIN_MAX,
        )  # fmt: skip

    def compiled_conn(self, peer: int, nbytes: int) -> tuple[Conn, int] | None:
        """The connection and socket a compiled path may swap a frame of `nbytes` on
        with `peer` (the compiled round on, no TLS, the frame within the read buffer)."""
        conn = self._conns.get(peer)
        if (
            conn is None
            or self._round is None
            or conn.tls
            or conn.lost is not None
            or nbytes > _RBUF_BYTES - _wire.SIZE
        ):
            return None
        return conn, conn.sock.fileno()

    def swap_refused(self, header: Header, error: BaseException) -> None:
        """A compiled path's swap that ended in `error`: its call tracker refused it (a
        probe kept for this call disagrees), or settling its round raised
        (SwapFast.hand_over). `swap_finish` raises `error`, as `swap` leaves it."""
        self._swap = (error, header, (), (), False)

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
            or header.nbytes > SWAP_MAX_BYTES
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
                if not m.done and conn.target is not m:  # (a large swap's, mid-payload)
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
