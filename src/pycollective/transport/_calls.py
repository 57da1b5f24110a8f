"""Which collective each group is in, and the rules that tell a peer's early, stale or
mismatched call from a merely late one. Sans-IO: no sockets, no shared memory, no time.

A transport that carries collectives (tcp/) feeds this tracker the headers it sees (the
call a group starts, frames that arrive before their receive is posted, PROBE frames) and
it raises MismatchError when they show that ranks called different things. The
shared-memory arena (runners/arena.py) judges its peers' announcements with
`judge_announcement` and the same message. Rules, in short:

* A frame of the call in progress must agree with it (kind, dtype, count, root, op,
  algorithm): else the ranks called different collectives.
* A frame of an earlier call that nobody received will never be: that call finished here
  without it, so the ranks' calls differed (named against what this rank called then,
  when remembered).
* A frame of a later call is early: kept, and checked when that call starts.
* A PROBE ("I have waited a while on you in call #s") of the call in progress is checked
  at once and answered once; one of a later call waits for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .._errors import MismatchError
from . import _wire
from ._wire import Header

HISTORY = 16  # collectives per group remembered to describe a stale frame


def mismatch_error(
    me: int, mine: Header, peer: int, theirs: Header, diffs: list[str], detail: str = ""
) -> MismatchError:
    """The one message for ranks that called different things (both sides named)."""
    return MismatchError(
        f"collective mismatch ({', '.join(diffs)} differ): rank {me} called "
        f"{mine.describe()} but rank {peer} called {theirs.describe()}{detail}"
    )


def judge_announcement(mine: Header, theirs: Header, arrived: bool) -> list[str]:
    """How a peer's announced call differs from ours ([] when nothing is wrong yet).

    Peers announce before entering a phase and may move on right after it, so what a peer
    announced is judged together with whether it has arrived at our phase (`arrived`,
    read after the announcement): arrived with a later seq means it checked ours and moved
    on; arrived with an earlier one, that we read before it announced; not arrived and
    earlier, that it is not there yet."""
    if theirs.seq != mine.seq and (arrived or theirs.seq < mine.seq):
        return []
    diffs = [] if theirs.seq == mine.seq else ["sequence number"]
    return diffs + _wire.meta_differences(theirs, mine)


def describe_peer(peer: int, header: Header | None, now_in: bool = False) -> str:
    """What `peer` was last seen doing, in the words a timeout uses: `header` is the last
    frame it sent (or call it announced); `now_in`, that it is in that very call."""
    if header is None:
        return f"rank {peer}: has entered no call on this group yet"
    if now_in:
        return f"rank {peer}: is in {header.describe()}"
    if header.frame == _wire.PROBE:
        return f"rank {peer}: was waiting in {header.describe()}"
    if header.frame == _wire.ABORT:
        return f"rank {peer}: reported a failure in call #{header.seq}"
    return f"rank {peer}: last sent data of {header.describe()}"


class CallTracker:
    """The calls of every group of one rank, as one transport sees them."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._current: dict[int, Header] = {}  # group -> the collective it runs (or last ran)
        self._previous: dict[int, deque[Header]] = {}  # group -> a few before that
        self.active: int | None = None  # the group of the exchange in progress
        self._probes: dict[tuple[int, int], Header] = {}  # (group, peer) -> its PROBE, for later
        self._probed: dict[int, tuple[int, int]] = {}  # peer -> (group, seq) we last probed

    def current(self, group: int) -> Header | None:
        return self._current.get(group)

    def begin(self, group: int, header: Header, early: Iterable[tuple[int, Header]]) -> None:
        """`group` runs the collective of `header`. When it is a new one, judge the frames
        peers sent early for it (`early`: (peer, header) of DATA frames of this group that
        wait for a receive) and the PROBEs kept for it."""
        current = self._current.get(group)
        if current is not None and current.seq == header.seq:
            return
        if current is not None:
            history = self._previous.get(group)
            if history is None:
                history = self._previous[group] = deque(maxlen=HISTORY)
            history.append(current)
        self._current[group] = header
        for peer, got in early:
            if got.seq > header.seq:
                continue
            if got.seq < header.seq:
                self._stale(peer, got, header)
            diffs = _wire.meta_differences(got, header)
            if diffs:
                raise self._mismatch(peer, got, header, diffs)
        if self._probes:
            for (g, peer), got in list(self._probes.items()):
                if g != group or got.seq > header.seq:
                    continue
                del self._probes[(g, peer)]
                ours = header if got.seq == header.seq else current
                if ours is not None and ours.seq == got.seq:
                    diffs = _wire.meta_differences(got, ours)
                    if diffs:
                        raise self._mismatch(peer, got, ours, diffs)

    def check_stale(self, group: int, seq: int, early: Iterable[tuple[int, Header]]) -> None:
        """Before `group`'s collective `seq`: a frame of an earlier one still unread will
        never be (that collective finished here without it) - e.g. two ranks that both
        thought they were the root and only sent, and then went on in the arena."""
        for peer, got in early:
            if got.seq < seq:
                current = self._current.get(group)
                self._stale(peer, got, current if current is not None else got)

    def arrived_early(self, peer: int, got: Header) -> None:
        """A DATA frame nobody waits for yet: fine if it belongs to a later step or call, a
        mismatch if it contradicts the call in progress or belongs to an earlier one."""
        if got.group != self.active:
            return  # another group's business: judged when that group runs (begin)
        want = self._current.get(got.group)
        if want is None:
            return
        if got.seq == want.seq:
            diffs = _wire.meta_differences(got, want)
            if diffs:
                raise self._mismatch(peer, got, want, diffs)
        elif got.seq < want.seq:
            self._stale(peer, got, want)

    def check_match(self, peer: int, got: Header, want: Header, nbytes: int) -> None:
        """A frame met the receive that expected `want` into `nbytes` bytes."""
        diffs = _wire.meta_differences(got, want) if got.frame == _wire.DATA else []
        if got.frame == _wire.P2P and got.dtype != want.dtype:
            diffs.append("dtype")
        if not diffs and got.nbytes != nbytes:
            diffs.append("bytes")
        if diffs:
            raise self._mismatch(peer, got, want, diffs)

    def probing(self, peer: int, header: Header) -> None:
        """We are about to PROBE `peer` in the call of `header`."""
        self._probed[peer] = (header.group, header.seq)

    def on_probe(self, peer: int, got: Header) -> Header | None:
        """A PROBE from `peer`. Returns the header to PROBE it back with (we are in that
        call too, waiting, and have not said so), else None."""
        current = self._current.get(got.group)
        if got.group == self.active and current is not None and current.seq == got.seq:
            diffs = _wire.meta_differences(got, current)
            if diffs:
                raise self._mismatch(peer, got, current, diffs)
            if self._probed.get(peer) != (got.group, got.seq):
                # Answer once: then a peer that times out waiting on us can say we were
                # in the same call, waiting in turn (on someone else), not absent.
                return current
        elif current is None or got.seq >= current.seq:
            # judged when this group next runs (begin); raising now would blame
            # whatever other group's exchange happens to be in progress
            self._probes[(got.group, peer)] = got
        return None

    def _stale(self, peer: int, got: Header, current: Header) -> None:
        """A frame of a collective this rank already finished without it: the ranks' calls
        differed. Name what this rank called then, if remembered, else what it runs now."""
        for before in self._previous.get(got.group, ()):
            if before.seq == got.seq:
                diffs = _wire.meta_differences(got, before)
                if diffs:
                    raise self._mismatch(peer, got, before, diffs)
        raise self._mismatch(peer, got, current, ["sequence number"])

    def _mismatch(self, peer: int, got: Header, want: Header, diffs: list[str]) -> MismatchError:
        # all_to_all's header carries no count (splits may differ by rank): say the sizes
        sizes = (
            f" ({got.nbytes} bytes arrived where {want.nbytes} were expected)"
            if "bytes" in diffs and got.frame == _wire.DATA
            else ""
        )
        return mismatch_error(self.rank, want, peer, got, diffs, sizes)
