"""The call tracker (transport/_calls.py) on its own: every rule, as tables of headers fed in
and what must come out. No sockets, no time (in the manner of h11's test_state.py).

Headers are built by `h`: a 4-element float32 all_reduce over the ring in group 1, with
whatever fields a row changes.
"""

from __future__ import annotations

import pytest

from pycollective._errors import MismatchError
from pycollective.transport import _calls, _wire
from pycollective.transport._calls import CallTracker, describe_peer, judge_announcement
from pycollective.transport._wire import Header

ME, PEER = 0, 1
GROUP, OTHER = 1, 2
AR, BC = _wire.KIND_CODE["all_reduce"], _wire.KIND_CODE["broadcast"]
F32, F64 = 7, 8  # any two distinct dtype codes
RING, TREE = _wire.ALGO_CODE["ring"], _wire.ALGO_CODE["tree"]


def h(seq: int, **changes: int) -> Header:
    fields = dict(
        frame=_wire.DATA, kind=AR, dtype=F32, op=0, algo=RING, group=GROUP, seq=seq, tag=0,
        root=0, count=4, nbytes=16,
    )  # fmt: skip
    fields.update(changes)
    return Header(**fields)


def tracker(*running: Header, active: int | None = GROUP) -> CallTracker:
    """A tracker of rank ME whose groups have begun these calls, in order."""
    t = CallTracker(ME)
    for header in running:
        t.begin(header.group, header, ())
    t.active = active
    return t


def raises_mismatch(fn, *words: str) -> str:
    with pytest.raises(MismatchError) as info:
        fn()
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


# ------------------------------------------------------------------ judge_announcement

# (our seq, their seq, arrived at our phase?, field they changed) -> differences named
ANNOUNCEMENTS = [
    (3, 3, False, {}, []),
    (3, 3, True, {}, []),
    (3, 3, True, {"count": 5}, ["count"]),
    (3, 3, False, {"kind": BC, "root": 1}, ["kind", "root"]),
    (3, 4, True, {}, []),  # it checked ours and moved on
    (3, 4, True, {"count": 5}, []),  # ... to a later call, which may differ
    (3, 4, False, {}, ["sequence number"]),  # a later call, without passing through ours
    (3, 4, False, {"op": 1}, ["sequence number", "op"]),
    (3, 2, True, {}, []),  # we read it before it announced ours
    (3, 2, False, {"dtype": F64}, []),  # not there yet
]


@pytest.mark.parametrize("mine, theirs, arrived, changes, diffs", ANNOUNCEMENTS)
def test_judge_announcement(mine, theirs, arrived, changes, diffs) -> None:
    assert judge_announcement(h(mine), h(theirs, **changes), arrived) == diffs


# ------------------------------------------------------------------ describe_peer

DESCRIPTIONS = [
    (None, False, "rank 1: has entered no call on this group yet"),
    (h(2), True, "rank 1: is in all_reduce(#2, dtype="),
    (h(2, frame=_wire.PROBE), False, "rank 1: was waiting in all_reduce(#2, "),
    (h(2, frame=_wire.ABORT), False, "rank 1: reported a failure in call #2"),
    (h(2), False, "rank 1: last sent data of all_reduce(#2, "),
]


@pytest.mark.parametrize("header, now_in, start", DESCRIPTIONS)
def test_describe_peer(header, now_in, start) -> None:
    assert describe_peer(PEER, header, now_in).startswith(start)


# ------------------------------------------------------------------ begin


def test_begin_records_the_call_and_keeps_the_last_ones() -> None:
    t = tracker()
    assert t.current(GROUP) is None
    for seq in range(_calls.HISTORY + 3):
        t.begin(GROUP, h(seq), ())
        assert t.current(GROUP) == h(seq)
    # the history is bounded: the oldest calls are forgotten
    previous = [c.seq for c in t._previous[GROUP]]
    assert previous == list(range(2, _calls.HISTORY + 2))
    assert t.current(OTHER) is None  # groups are apart


def test_begin_of_the_same_call_again_judges_nothing() -> None:
    t = tracker(h(3))
    t.begin(GROUP, h(3), [(PEER, h(3, count=5))])  # not judged: not a new call
    assert t.current(GROUP) == h(3)


# early DATA frames of the group when its call `seq` 3 begins: (their header) -> error words
EARLY = [
    (h(4, count=99), None),  # a later call's: kept for it
    (h(3), None),
    (h(3, tag=5, nbytes=8), None),  # another step of the same call
    (h(3, count=5), ("count differ", "rank 0 called all_reduce(#3", "rank 1 called")),
    (h(3, kind=BC, root=1), ("kind, root differ",)),
    (h(3, algo=TREE), ("algo differ", "algorithm=tree")),
    (h(2), ("sequence number differ",)),  # an earlier call nobody received
]


@pytest.mark.parametrize("early, words", EARLY)
def test_begin_judges_early_frames(early, words) -> None:
    t = tracker(h(2))
    if words is None:
        t.begin(GROUP, h(3), [(PEER, early)])
        assert t.current(GROUP) == h(3)
    else:
        raises_mismatch(lambda: t.begin(GROUP, h(3), [(PEER, early)]), *words)


def test_a_stale_frame_is_named_against_the_call_it_belonged_to() -> None:
    """A frame of call #2, which this rank ran as a broadcast: named against that call,
    not against the call running now."""
    t = tracker(h(2, kind=BC, root=1), h(3))
    message = raises_mismatch(lambda: t.begin(GROUP, h(4), [(PEER, h(2))]), "kind, root differ")
    assert "rank 0 called broadcast(#2" in message
    # a stale frame agreeing with what it belonged to is still stale: its call is over
    t = tracker(h(2), h(3))
    raises_mismatch(lambda: t.begin(GROUP, h(4), [(PEER, h(2))]), "sequence number differ")
    # one older than the history is named against the call now running
    t = tracker(*(h(s) for s in range(_calls.HISTORY + 5)))
    message = raises_mismatch(lambda: t.check_stale(GROUP, 100, [(PEER, h(0))]))
    assert f"rank 0 called all_reduce(#{_calls.HISTORY + 4}" in message


# ------------------------------------------------------------------ check_stale


@pytest.mark.parametrize("seq, stale", [(2, True), (3, False), (4, False)])
def test_check_stale(seq, stale) -> None:
    t = tracker(h(2))
    check = lambda: t.check_stale(GROUP, 3, [(PEER, h(seq))])  # noqa: E731
    if stale:
        raises_mismatch(check, "sequence number differ")
    else:
        check()


def test_check_stale_before_any_call_names_the_frame_itself() -> None:
    t = tracker()
    raises_mismatch(lambda: t.check_stale(GROUP, 1, [(PEER, h(0))]), "sequence number")


# ------------------------------------------------------------------ arrived_early

# (the frame, the active group) -> error words, or None when it is simply kept
ARRIVALS = [
    (h(3), GROUP, None),
    (h(3, tag=2), GROUP, None),
    (h(4, count=9), GROUP, None),  # a later call's
    (h(3, dtype=F64), GROUP, ("dtype differ",)),
    (h(2), GROUP, ("sequence number differ",)),
    (h(3, dtype=F64), OTHER, None),  # another group is running: judged at begin
    (h(3, dtype=F64, group=OTHER), GROUP, None),  # of a group not running
    (h(2), None, None),  # no exchange in progress
]


@pytest.mark.parametrize("got, active, words", ARRIVALS)
def test_arrived_early(got, active, words) -> None:
    t = tracker(h(3), active=active)
    if words is None:
        t.arrived_early(PEER, got)
    else:
        raises_mismatch(lambda: t.arrived_early(PEER, got), *words)


def test_arrived_early_in_a_group_that_never_ran_is_kept() -> None:
    t = tracker(active=GROUP)
    t.arrived_early(PEER, h(5, count=7))


# ------------------------------------------------------------------ check_match

# (the frame that met the receive, what the receive expected, its bytes) -> error words
MATCHES = [
    (h(3), h(3), 16, None),
    (h(3, count=5, nbytes=20), h(3), 16, ("count differ",)),
    (h(3, nbytes=20), h(3), 16, ("bytes differ", "(20 bytes arrived where 16 were expected)")),
    (h(3, op=2), h(3), 16, ("op differ", "op=MIN")),
    # point to point: frames agree on the dtype and the size; the collective fields are not
    # a collective's
    (h(0, frame=_wire.P2P, kind=0, tag=9), h(0, frame=_wire.P2P, kind=0, tag=9), 16, None),
    (h(0, frame=_wire.P2P, dtype=F64), h(0, frame=_wire.P2P), 16, ("dtype differ",)),
    (h(0, frame=_wire.P2P, count=1), h(0, frame=_wire.P2P), 16, None),
    (h(0, frame=_wire.P2P, nbytes=8), h(0, frame=_wire.P2P), 16, ("bytes differ",)),
]


@pytest.mark.parametrize("got, want, nbytes, words", MATCHES)
def test_check_match(got, want, nbytes, words) -> None:
    t = tracker(h(3))
    if words is None:
        t.check_match(PEER, got, want, nbytes)
    else:
        raises_mismatch(lambda: t.check_match(PEER, got, want, nbytes), *words)


def test_a_p2p_size_mismatch_does_not_speak_of_collective_bytes() -> None:
    t = tracker()
    message = raises_mismatch(
        lambda: t.check_match(PEER, h(0, frame=_wire.P2P, nbytes=8), h(0, frame=_wire.P2P), 16)
    )
    assert "were expected" not in message and "send(tag=0" in message


# ------------------------------------------------------------------ probes


def test_a_probe_of_our_call_is_answered_once() -> None:
    t = tracker(h(3))
    assert t.on_probe(PEER, h(3, frame=_wire.PROBE)) == h(3)
    t.probing(PEER, h(3))  # we said so
    assert t.on_probe(PEER, h(3, frame=_wire.PROBE)) is None
    # a later call of ours is answered again
    t.begin(GROUP, h(4), ())
    assert t.on_probe(PEER, h(4, frame=_wire.PROBE)) == h(4)


def test_a_probe_of_our_call_that_differs_is_a_mismatch_at_once() -> None:
    t = tracker(h(3))
    raises_mismatch(lambda: t.on_probe(PEER, h(3, frame=_wire.PROBE, count=8)), "count differ")


# (the probe, the group running) -> when it is judged: "begin" (kept until its call
# begins) or "never" (dropped: of a call already over). One of our current call that
# arrives while another group exchanges: test_a_kept_probe_of_the_call_just_finished_...
PROBES = [
    (h(4, frame=_wire.PROBE, count=8), GROUP, "begin"),  # a later call of ours
    (h(3, frame=_wire.PROBE, count=8, group=OTHER), GROUP, "begin"),
    (h(1, frame=_wire.PROBE, count=8), GROUP, "never"),
]


@pytest.mark.parametrize("probe, active, when", PROBES)
def test_probes_kept_for_later(probe, active, when) -> None:
    t = tracker(h(3), h(0, group=OTHER), active=active)
    assert t.on_probe(PEER, probe) is None  # no error, no answer now
    t.active = probe.group
    nxt = h(probe.seq, group=probe.group)
    if when == "begin":
        raises_mismatch(lambda: t.begin(probe.group, nxt, ()), "count differ")
    else:
        t.begin(probe.group, h(4, group=probe.group), ())
    # judged once: a second begin finds nothing left
    t.begin(probe.group, h(9, group=probe.group), ())


def test_a_kept_probe_that_agrees_is_dropped_quietly() -> None:
    t = tracker(h(3))
    assert t.on_probe(PEER, h(4, frame=_wire.PROBE)) is None
    t.begin(GROUP, h(4), ())
    assert not t._probes


def test_a_kept_probe_of_the_call_just_finished_is_judged_against_it() -> None:
    """A PROBE kept for call #3 while another group ran, then this group jumps to #4: the
    probe is judged against #3, the call it was about."""
    t = tracker(h(3), active=OTHER)
    t.on_probe(PEER, h(3, frame=_wire.PROBE, dtype=F64))
    raises_mismatch(lambda: t.begin(GROUP, h(4), ()), "dtype differ", "all_reduce(#3")


# ------------------------------------------------------------------ the message


def test_mismatch_error_names_both_sides() -> None:
    exc = _calls.mismatch_error(0, h(3), 2, h(3, count=5), ["count"], " (detail)")
    assert isinstance(exc, MismatchError)
    assert str(exc) == (
        "collective mismatch (count differ): rank 0 called "
        f"{h(3).describe()} but rank 2 called {h(3, count=5).describe()} (detail)"
    )
