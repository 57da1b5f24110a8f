"""torch's op translation (torch/_forms.py): op_of, and known_op, the synchronous calls'
short way, which finds an options struct's op by its ReduceOp's hash."""

from __future__ import annotations

import pytest
import torch.distributed as tdist

from pycollective._errors import UsageError
from pycollective._reduce_ops import ReduceOp as OurOp
from pycollective.torch import _forms

PLAIN = [
    ("SUM", OurOp.SUM), ("AVG", OurOp.AVG), ("PRODUCT", OurOp.PRODUCT), ("MIN", OurOp.MIN),
    ("MAX", OurOp.MAX), ("BAND", OurOp.BAND), ("BOR", OurOp.BOR), ("BXOR", OurOp.BXOR),
]  # fmt: skip


def _opts(op: object) -> tdist.AllreduceOptions:
    opts = tdist.AllreduceOptions()
    opts.reduceOp = op
    return opts


def test_this_torch_hashes_a_reduce_op_as_its_type() -> None:
    # what the short way's table relies on; without it known_op only ever says None
    assert _forms._HASH_IS_TYPE


@pytest.mark.parametrize(("name", "ours"), PLAIN)
def test_known_op_finds_each_op_once_translated(name: str, ours: OurOp) -> None:
    torch_op = getattr(tdist.ReduceOp, name)
    assert _forms.op_of(_opts(torch_op)) is ours
    # a fresh options struct (a new ReduceOp object), as every torch call passes
    assert _forms.known_op(_opts(torch_op)) is ours


def test_every_op_maps_to_its_own_after_all_were_seen() -> None:
    for name, _ in PLAIN:
        _forms.op_of(_opts(getattr(tdist.ReduceOp, name)))
    for name, ours in PLAIN:
        assert _forms.known_op(_opts(getattr(tdist.ReduceOp, name))) is ours


def test_premul_sum_is_refused_and_never_known() -> None:
    premul = tdist._make_nccl_premul_sum(2.0)
    opts = _opts(premul)
    with pytest.raises(UsageError, match="PREMUL_SUM"):
        _forms.op_of(opts)
    assert _forms.known_op(opts) is None
