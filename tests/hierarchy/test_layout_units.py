"""The pieces of the hierarchical all-reduce that need no processes: the layout every rank
derives from the host identities, and the per-step tag ranges."""

from __future__ import annotations

import pytest

from pycollective.runners import hierarchical as H
from pycollective.runners.executor import make_plan
from pycollective.schedule import build


def layout(text: str) -> H.Layout:
    return H.Layout.from_host_ids([c.encode() * 16 for c in text])


@pytest.mark.parametrize(
    "text,hosts,even,prefers",
    [
        ("aabb", ((0, 1), (2, 3)), True, True),
        ("abab", ((0, 2), (1, 3)), True, True),
        ("aab", ((0, 1), (2,)), False, True),
        ("abc", ((0,), (1,), (2,)), True, False),  # one rank per host: nothing to gain
        ("aaaa", ((0, 1, 2, 3),), True, False),  # one host: the arena does it all
        ("a", ((0,),), True, False),
    ],
)
def test_layout(text, hosts, even, prefers):
    lay = layout(text)
    assert lay.hosts == hosts
    assert lay.even is even
    assert lay.prefers_hierarchy() is prefers
    assert lay.size == len(text)


def test_every_rank_sees_its_host_and_partners():
    lay = layout("abab")
    h = [H.Hierarchy(lay, me, [10, 11, 12, 13], None) for me in range(4)]
    assert [x.intra for x in h] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert [x.local for x in h] == [0, 0, 1, 1]
    assert [x.cross for x in h] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [x.local_host for x in h] == [0, 1, 0, 1]
    uneven = [H.Hierarchy(layout("aab"), me, [0, 1, 2], None) for me in range(3)]
    assert [x.cross for x in uneven] == [(0, 2)] * 3  # the leaders


def test_steps_get_tag_ranges_of_their_own():
    base = make_plan(build("reduce_scatter", "ring", 1, 4, 10))
    tags = {m.tag for r in base.rounds for m in (*r.sends, *r.recvs)}
    for phase in (1, 2):
        plan = H._plan("reduce_scatter", "ring", 1, 4, 10, phase)
        moved = {m.tag for r in plan.rounds for m in (*r.sends, *r.recvs)}
        assert moved == {t | phase << 28 for t in tags}
        assert all(t < 2**32 for t in moved)
    assert H._plan("reduce_scatter", "ring", 1, 4, 10, 0) == base
