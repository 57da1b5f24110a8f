"""Our errors as the torch backend raises them (torch/_work.torch_error): both the
pycollective class and torch's DistBackendError, with gloo's words for a timeout, and
picklable, so that multiprocessing or torch's spawn harness can send one to its parent."""

from __future__ import annotations

import pickle

import pytest
import torch.distributed as tdist

from pycollective._errors import CollectiveTimeout, MismatchError, TransportError
from pycollective.torch._work import torch_error


@pytest.mark.parametrize(
    "exc",
    [
        TransportError("rank 1 closed its connection", peer=1),
        CollectiveTimeout("waited for rank 1 after 5 s", op="all_reduce", waiting_on=[1]),
        MismatchError("collective mismatch (count differs)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_torch_error_is_both_classes_and_survives_pickling(exc: Exception) -> None:
    err = torch_error(exc)
    assert isinstance(err, type(exc)) and isinstance(err, tdist.DistBackendError)
    assert isinstance(err, RuntimeError)  # what `except RuntimeError` around gloo catches
    assert type(err).__name__ == type(exc).__name__ and err.__cause__ is exc
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)  # the same flavour class, not a look-alike
    assert back.args == err.args and back.__dict__ == err.__dict__
    if isinstance(exc, CollectiveTimeout):
        assert str(back).startswith("pycollective: Timed out in all_reduce: ")
    if isinstance(exc, TransportError):
        assert back.peer == 1


def test_errors_that_are_not_ours_pass_through() -> None:
    plain = ValueError("x")
    assert torch_error(plain) is plain
