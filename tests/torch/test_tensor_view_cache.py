"""The group's views of torch tensors for synchronous calls (pycollective._buffers
TensorViews): a repeated call finds its tensor's view in one look-up, and a tensor whose
storage, length, shape, dtype, layout or bits changed never finds a stale one (the short
ways of the torch backend and of our API run a found view without checking it again)."""

from __future__ import annotations

import numpy as np
import pytest

import torch
from pycollective._buffers import VIEWS_KEPT, TensorViews
from pycollective._errors import UsageError


def _seen(t: torch.Tensor) -> TensorViews:
    views = TensorViews()
    view = views.get(t, "tensor")
    assert isinstance(view, np.ndarray) and view.ctypes.data == t.data_ptr()
    assert views.known(t) is view  # the same tensor, unchanged: found
    return views


def test_a_view_is_the_tensors_memory_and_is_found_again() -> None:
    t = torch.arange(6.0)
    views = _seen(t)
    views.known(t)[2] = 40.0
    assert t[2].item() == 40.0
    same_memory = t.view(2, 3)  # another tensor object, same address, length and dtype
    assert views.known(same_memory) is views.known(t)


def test_storage_moved_is_not_found() -> None:
    t = torch.ones(4)
    views = _seen(t)
    t.untyped_storage().resize_(0)  # what FSDP's reshard does
    t.untyped_storage().resize_(4 * 4)  # new memory
    assert views.known(t) is None or t.data_ptr() == views.known(t).ctypes.data
    t.set_(torch.ones(4).untyped_storage())
    assert views.known(t) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.resize_(4),  # shorter at the same address
        lambda t: setattr(t, "data", t.view(torch.int32)),  # another dtype, same memory
        lambda t: setattr(t, "data", t[:4]),  # shorter, same address, no version bump
        lambda t: setattr(t, "data", t.view(2, 4).t()),  # not contiguous any more
        lambda t: setattr(t, "data", torch._neg_view(t)),  # the negative bit
    ],
    ids=["resize", "dtype", "length", "contiguity", "negative-bit"],
)
def test_a_tensor_changed_in_place_is_not_found(change) -> None:
    t = torch.ones(8)
    views = _seen(t)
    change(t)
    assert views.known(t) is None


def test_other_tensors_at_a_known_address_are_not_found() -> None:
    t = torch.arange(9.0).reshape(3, 3)
    views = _seen(t)
    assert views.known(t.t()) is None  # transposed: same address, length, dtype
    assert views.known(t.view(torch.int32)) is None
    assert views.known(torch._neg_view(t)) is None
    assert views.known(t.reshape(-1)[:4]) is None
    c = torch.ones(3, dtype=torch.complex64)
    cviews = _seen(c)
    assert cviews.known(c.conj()) is None  # the conjugate bit, same memory
    assert cviews.known(c.conj().conj()) is cviews.known(c)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(4, 4).to_sparse(),
        lambda: torch.ones(4, 4).to_sparse_csr(),
        lambda: torch.ones(4, 4).to_mkldnn(),
        lambda: torch.ones(4, device="meta"),
        lambda: "not a tensor",
    ],
    ids=["sparse-coo", "sparse-csr", "mkldnn", "meta", "str"],
)
def test_what_is_no_dense_cpu_tensor_is_never_found(make) -> None:
    views = _seen(torch.ones(4))
    assert views.known(make()) is None


def test_refusals_say_what_is_wrong_and_keep_nothing() -> None:
    views = TensorViews()
    with pytest.raises(UsageError, match="contiguous"):
        views.get(torch.ones(3, 3).t(), "x")
    with pytest.raises(UsageError, match="conjugate"):
        views.get(torch.ones(2, dtype=torch.complex64).conj(), "x")
    with pytest.raises(UsageError, match="dense"):
        views.get(torch.ones(2, 2).to_sparse(), "x")
    assert len(views) == 0


def test_bfloat16_is_its_own_view_and_the_cache_stays_bounded() -> None:
    views = TensorViews()
    b = torch.ones(3, dtype=torch.bfloat16)
    assert views.get(b, "x") is b and views.known(b) is b  # no view reads back as it
    kept = [torch.ones(i + 1) for i in range(3 * VIEWS_KEPT)]
    for t in kept:
        views.get(t, "x")
    assert 0 < len(views) <= VIEWS_KEPT
    assert views.known(kept[-1]) is not None
