"""The torch backend's short way for repeated synchronous calls (torch/_backend.py), in a
group of one made to act as one of two: its compiled path replaced by a recorder that
accepts every call, so what is checked is the method's choice, not the collective (which
tests/torch/ops_worker.py checks in a real job).

torch's own functions (dist.all_reduce, ...) wait on a group's work only if there is one:
the short way hands them None; any other caller (a Python caller of the method, C++)
still gets a completed Work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as tdist

import pycollective as dist
import torch
from pycollective.torch import _forms
from pycollective.torch._work import DoneWork


class Recorder:
    """A compiled path that takes every call and remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def all_reduce(self, obj: Any, op: Any) -> bool:
        self.calls.append(("all_reduce", obj, op))
        return True

    def broadcast(self, obj: Any, src: Any) -> bool:
        self.calls.append(("broadcast", obj, src))
        return True

    # These decline what they are offered: in a group of one, our API's Python path then
    # runs the call for real, so the test can check its results.
    def reduce(self, obj: Any, dst: Any, op: Any) -> bool:
        self.calls.append(("reduce", obj, (dst, op)))
        return False

    def all_gather(self, out: Any, inp: Any) -> bool:
        self.calls.append(("all_gather", (out, inp), None))
        return False

    def reduce_scatter(self, out: Any, inp: Any, op: Any) -> bool:
        self.calls.append(("reduce_scatter", (out, inp), op))
        return False


class CountingSlot:
    """The group's DoneSlot, counting the works it hands out."""

    def __init__(self, slot: Any) -> None:
        self.slot, self.taken = slot, 0

    def take(self, result: Any) -> DoneWork:
        self.taken += 1
        return self.slot.take(result)

    def release(self) -> None:
        self.slot.release()


@pytest.fixture
def group() -> Iterator[Any]:
    tdist.init_process_group("pycollective", store=tdist.HashStore(), rank=0, world_size=1)
    pg = tdist.distributed_c10d._get_default_group()
    pg._solo = False  # views and the short way, as at 2+ ranks
    pg.pycollective_group.fast = Recorder()
    pg._done = CountingSlot(pg._done)
    try:
        yield pg
    finally:
        tdist.destroy_process_group()


def test_the_waiting_callers_are_torchs_functions() -> None:
    names = {code.co_name for code in _forms.WAITS_ONLY_ON_A_WORK}
    assert names == {"all_reduce", "broadcast", "reduce", "all_gather_single",
                     "reduce_scatter_single"}  # fmt: skip


def test_torchs_functions_get_no_work_and_other_callers_a_done_one(group: Any) -> None:
    fast = group.pycollective_group.fast
    t = torch.ones(3)
    tdist.all_reduce(t)  # the first: through the method in full, which makes the view
    tdist.broadcast(t, 0)
    taken, made = group._done.taken, len(fast.calls)
    for _ in range(5):
        assert tdist.all_reduce(t) is None
        assert tdist.broadcast(t, 0) is None
    assert group._done.taken == taken, "torch's functions were handed a work"
    calls = fast.calls[made:]
    assert [c[0] for c in calls] == ["all_reduce", "broadcast"] * 5
    assert all(c[1].ctypes.data == t.data_ptr() for c in calls)  # the tensor's view
    opts = tdist.AllreduceOptions()
    opts.asyncOp = False
    work = group.allreduce([t], opts)  # a direct caller, on the short way too
    assert len(fast.calls) == made + 11 and group._done.taken == taken + 1
    assert isinstance(work, DoneWork) and work.wait() and work.result()[0] is t
    bopts = tdist.BroadcastOptions()
    bopts.asyncOp = False
    assert group.broadcast([t], bopts).get_future().value()[0] is t


def test_a_tensor_changed_since_takes_the_method_in_full(group: Any) -> None:
    fast = group.pycollective_group.fast
    t = torch.arange(9.0).reshape(3, 3)
    tdist.all_reduce(t)
    tdist.all_reduce(t)
    (_, view, _) = fast.calls[-1]
    taken = group._done.taken
    tdist.all_reduce(t.t())  # same address, length and dtype: staged, not the view
    assert group._done.taken == taken + 1  # the method in full hands out a work
    assert fast.calls[-1][1] is not view
    t.data = t.view(torch.int32)
    tdist.all_reduce(t)
    assert fast.calls[-1][1].dtype.name == "int32" and group._done.taken == taken + 2


def test_reduce_and_the_flat_gathers_hand_torch_no_work_either(group: Any) -> None:
    # a group of one: under the short way these run our API's Python path for real
    red, gin, gout = torch.full((4,), 3.0), torch.full((2,), 5.0), torch.zeros(2)
    rin, rout = torch.arange(2.0), torch.zeros(2)
    for _ in range(2):  # the first of each makes the views
        tdist.reduce(red, dst=0)
        tdist.all_gather_single(gout, gin)
        tdist.reduce_scatter_single(rout, rin)
    taken = group._done.taken
    fast = group.pycollective_group.fast
    for i in range(3):
        gin.fill_(float(i))
        rin.add_(1.0)
        made = len(fast.calls)
        assert tdist.reduce(red, dst=0) is None
        assert tdist.all_gather_single(gout, gin) is None
        assert tdist.reduce_scatter_single(rout, rin) is None
        assert gout.tolist() == [float(i)] * 2 and rout.tolist() == rin.tolist()
        # the short way offered the compiled path the views (then our API did, once more)
        kinds = [c[0] for c in fast.calls[made:]]
        assert kinds == ["reduce"] * 2 + ["all_gather"] * 2 + ["reduce_scatter"] * 2, kinds
        (_, view, (dst, op)) = fast.calls[made]
        assert view.ctypes.data == red.data_ptr() and dst == 0 and op == dist.ReduceOp.SUM
        (_, (out, inp), _) = fast.calls[made + 2]
        assert (out.ctypes.data, inp.ctypes.data) == (gout.data_ptr(), gin.data_ptr())
    assert group._done.taken == taken, "torch's functions were handed a work"
    assert red.tolist() == [3.0] * 4
    opts = tdist.ReduceOptions()
    opts.asyncOp = False
    work = group.reduce([red], opts)  # a direct caller: a done work
    assert work.wait() and work.result()[0] is red and group._done.taken == taken + 1
