"""Receive matching: which posted receive a frame is for (checked against what this rank
expects, sans-IO in _calls.py), messages that come before their receive (kept, bounded,
and adopted mid-arrival when the receive comes), abort notices and probes."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from ..._errors import MismatchError
from .. import _wire
from .._base import ANY_SOURCE, InMessage, OutMessage
from .._wire import Header
from . import aborts
from .conn import Conn as _Conn
from .receiving import SINK_BYTES, Receiving
from .sending import Sending
from .stash import FIRST_PIECE, Stash

MAX_FRAME_BYTES = 1 << 40  # a peer's length beyond this is a protocol error, not a malloc
# Messages that come before their receive are kept, up to PYCOLLECTIVE_MAX_EARLY_BYTES
# in all (counted as the peer announces them), in a Stash whose pieces grow as its bytes
# arrive (stash.py): an announcement alone allocates at most STASH_FIRST bytes.
STASH_FIRST = FIRST_PIECE


class Matching(Receiving, Sending):
    """What each frame is for, and what is kept until it is asked for."""

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
            conn.stash = stash = Stash(header.nbytes, self._stash_pool)
            conn.view = stash.first
            self._unexpected_bytes += header.nbytes
        if header.nbytes == 0:
            self._on_payload(conn)
        if mismatch is not None:
            raise mismatch

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
            error = aborts.decode(conn.peer, header, None if stash is None else bytes(stash))
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
                _deliver(late, stash)
                self._complete(late, conn.peer, header)
            else:
                self._unexpected.setdefault(header.key, deque()).append((conn.peer, header, stash))

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

    @staticmethod
    def _complete(m: InMessage, peer: int, header: Header) -> None:
        m.source = peer
        m.header = header
        m.done = True

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
            got = conn.stash.before_last + conn.got  # what landed
            if m.sink is not None and got % m.align:
                continue  # a piece would split an item: delivered whole when it is in
            self._calls.check_match(conn.peer, header, m.expect, m.dest.nbytes)
            if got:
                _deliver(m, conn.stash, got)
            else:
                conn.stash.release()
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

    def _early(self, group: int) -> Iterator[tuple[int, Header]]:
        """(peer, header) of `group`'s DATA frames that came before their receive."""
        for key, stashed in self._unexpected.items():
            if key[0] == _wire.DATA and key[1] == group:
                for peer, got, _payload in stashed:
                    yield peer, got

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


def _deliver(m: InMessage, stash: Stash, upto: int | None = None) -> None:
    """Hand what was kept of a message that came early (its first `upto` bytes, or all)
    to its receive, and give the stash's memory back to its pool."""
    if m.sink is not None:
        for part in stash.parts(upto):  # whole pieces: 1 MiB multiples, items never split
            for lo in range(0, part.nbytes, SINK_BYTES):
                m.sink(part[lo : lo + SINK_BYTES])
    else:
        dest = m.dest
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        stash.copy_into(dest, upto)
    stash.release()
