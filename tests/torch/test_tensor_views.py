"""Views of torch tensors (pycollective._buffers): the same memory, nothing copied, and the
tensor's storage left exactly as it was. Tensor.numpy() marks a storage non-resizable for
ever, which broke legacy FSDP (resize_(0) of its flat parameter in reshard) and batched
PowerSGD on the DDP bucket; gloo leaves the flag alone, and so must we."""

from __future__ import annotations

import numpy as np
import pytest

import torch
from pycollective._buffers import as_buffer
from pycollective._errors import UsageError

DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_view_shares_memory_and_leaves_storage_resizable(dtype: torch.dtype) -> None:
    t = torch.zeros(2, 3, dtype=dtype)
    assert t.untyped_storage().resizable()
    buf = as_buffer(t)
    assert t.untyped_storage().resizable(), "viewing made the storage non-resizable"
    assert buf.count == 6 and buf.nbytes == 6 * t.element_size()
    assert buf.array.ctypes.data == t.data_ptr()
    # a write through the view lands in the tensor (bfloat16 is viewed as its raw bits)
    buf.array[4] = 0x3F80 if dtype is torch.bfloat16 else buf.array.dtype.type(1)
    assert t.reshape(-1)[4].item() == 1
    t.untyped_storage().resize_(0)  # what FSDP's reshard does
    assert t.untyped_storage().nbytes() == 0


def test_view_of_an_offset_slice_and_of_a_tensor_requiring_grad() -> None:
    base = torch.arange(10.0)
    buf = as_buffer(base[3:7])
    assert buf.array.tolist() == [3.0, 4.0, 5.0, 6.0]
    w = torch.ones(3, requires_grad=True)
    assert as_buffer(w).array.tolist() == [1.0, 1.0, 1.0]
    assert w.untyped_storage().resizable()


def test_the_view_keeps_the_tensor_alive() -> None:
    arr = as_buffer(torch.full((4,), 7.0)).array  # the tensor has no other reference
    assert arr.tolist() == [7.0] * 4


def test_empty_tensor() -> None:
    buf = as_buffer(torch.zeros(0, 5))
    assert buf.count == 0 and buf.array.dtype == np.float32


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: torch.zeros(4, 4).t(), "contiguous"),
        (lambda: torch.zeros(2, dtype=torch.complex64).conj(), "conjugate"),
        (lambda: torch.zeros(2, 2).to_sparse(), "dense"),
        (lambda: torch.zeros(2, dtype=torch.float8_e4m3fn), "cannot carry"),
    ],
    ids=["transposed", "lazy-conj", "sparse", "float8"],
)
def test_refusals_say_what_is_wrong(make, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        as_buffer(make())
