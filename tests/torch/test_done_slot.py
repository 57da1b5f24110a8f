"""The group's reusable DoneWork (torch/_work.py DoneSlot): a synchronous call's work is
reused only while nobody holds it, from Python or from C++."""

from __future__ import annotations

import pytest

import torch
from pycollective.torch import _work

pytestmark = pytest.mark.skipif(not _work._REFS_READABLE, reason="torch's C++ count unreadable")


def test_a_dropped_work_is_reused_with_the_new_result() -> None:
    slot = _work.DoneSlot()
    a, b = [torch.ones(1)], [torch.zeros(1)]
    first = id(slot.take(a))  # dropped at once, as torch's dist.all_reduce drops it
    w = slot.take(b)
    assert id(w) == first and w.result() is b and w.get_future().value() is b
    assert w.wait() and w.is_completed() and w.exception() is None


def test_a_work_held_in_python_keeps_its_result() -> None:
    slot = _work.DoneSlot()
    a, b = [torch.ones(1)], [torch.zeros(1)]
    held = slot.take(a)
    fut = held.get_future()
    other = slot.take(b)
    assert other is not held and held.result() is a and fut.value() is a
    assert other.result() is b


def test_a_work_held_only_by_cpp_is_not_reused_and_stays_alive() -> None:
    slot = _work.DoneSlot()
    a = [torch.ones(1)]
    boxed = slot.take(a).boxed()  # C++ holds it now; Python drops its reference
    other = slot.take([torch.zeros(1)])
    back = torch.distributed.Work.unbox(boxed)
    assert back is not other and back.result() is a  # the Python half lived on
    del back, boxed
    slot.release()
