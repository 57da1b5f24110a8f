"""The pickle-free object serializer: round trips, bounded decoding of malformed payloads,
refusal of pickles in safe mode, and object collectives over it in real jobs."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests._launch import REPO, run_ranks

from pycollective import _serialize
from pycollective._errors import CollectiveError, MismatchError, UsageError

WORKER = REPO / "tests" / "security" / "_objects_worker.py"

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=4), max_size=4)
    ),
    max_leaves=20,
)


@pytest.fixture
def safe():
    _serialize.use("safe")
    yield
    _serialize.use(None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_safe_format_round_trips_plain_values(value) -> None:
    _serialize.use("safe")
    try:
        data = _serialize.dumps(value)
        assert data.startswith(_serialize.MAGIC)
        assert _serialize.loads(data) == value
    finally:
        _serialize.use(None)


def test_arrays_scalars_and_sets_round_trip(safe) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = _serialize.loads(_serialize.dumps({"a": arr, "s": {1, 2}, "n": np.int16(-3)}))
    assert back["a"].dtype == np.float32 and back["a"].shape == (3, 4)
    assert np.array_equal(back["a"], arr) and back["s"] == {1, 2}
    assert back["n"] == np.int16(-3) and back["n"].dtype == np.int16
    assert math.isnan(_serialize.loads(_serialize.dumps(float("nan"))))


def test_torch_tensors_round_trip_as_tensors(safe) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    back = _serialize.loads(_serialize.dumps([t]))[0]
    assert isinstance(back, torch.Tensor) and torch.equal(back, t)


@pytest.mark.parametrize("bad", [object(), np.array([object()]), lambda: 0, {1: type}])
def test_safe_mode_refuses_what_it_cannot_carry(safe, bad) -> None:
    with pytest.raises(UsageError, match="pickle-free"):
        _serialize.dumps(bad)


def test_safe_mode_refuses_pickles_naming_the_sender(safe) -> None:
    with pytest.raises(MismatchError, match="rank 3 sent a pickled object"):
        _serialize.loads(pickle.dumps({"x": 1}), sender=3)


def test_auto_mode_reads_both_formats_for_object_collectives() -> None:
    assert _serialize.chosen() == "auto"
    assert _serialize.loads(pickle.dumps([1, "a"])) == [1, "a"]
    _serialize.use("safe")
    data = _serialize.dumps([1, "a"])
    _serialize.use(None)
    assert _serialize.loads(data) == [1, "a"]


@pytest.mark.parametrize(
    "mode, internal, authenticated, allowed",
    [
        ("auto", False, True, True),  # object collectives pickle, as torch's
        ("auto", True, True, False),  # the library's own transfers never do
        ("pickle", True, True, True),  # unless the job chose pickle
        ("pickle", False, False, False),  # and never from peers that proved nothing
        ("auto", False, False, False),
        ("safe", False, True, False),
        ("safe", True, True, False),
    ],
)
def test_who_may_pickle(mode, internal, authenticated, allowed) -> None:
    """Finding 2 of the security review: elastic state went through pickle.loads whatever
    the setting. Now one rule decides for every transfer."""
    _serialize.use(mode)
    try:
        assert _serialize.allow_pickle(internal, authenticated) is allowed
        payload = pickle.dumps({"x": 1})
        if allowed:
            assert _serialize.loads(payload, 2, _serialize.allow_pickle(internal, authenticated))
        else:
            with pytest.raises(MismatchError, match="rank 2 sent a pickled object"):
                _serialize.loads(payload, 2, _serialize.allow_pickle(internal, authenticated))
    finally:
        _serialize.use(None)


def test_a_torch_state_dict_travels_without_pickle() -> None:
    """What elastic training sends a replacement: a model's and an optimizer's state_dict
    (an OrderedDict with torch's version metadata, bfloat16 and 0-d tensors)."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "extra": [torch.ones(2, dtype=torch.bfloat16), torch.tensor(3.0), torch.empty(0, 2)],
    }
    back = _serialize.loads(_serialize.dumps(state, pickling=False), pickling=False)
    assert back["model"]._metadata == state["model"]._metadata
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    twin.load_state_dict(back["model"])
    torch.optim.Adam(twin.parameters()).load_state_dict(back["optimizer"])
    for a, b in zip(state["model"].values(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    bf, zero_d, empty = back["extra"]
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, state["extra"][0])
    assert zero_d.shape == () and empty.shape == (0, 2)


def test_bad_choice_is_a_usage_error(monkeypatch) -> None:
    with pytest.raises(UsageError):
        _serialize.use("marshal")
    monkeypatch.setenv("PYCOLLECTIVE_OBJECT_SERIALIZER", "yaml")
    with pytest.raises(UsageError):
        _serialize.dumps(1)


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # magic only
        b"l\xff\xff\xff\xff",  # four billion items promised
        b"s\xff\xff\xff\x7fabc",  # a 2 GB string promised
        b"a" + b"s\x03\x00\x00\x00<f8" + b"\x02" + b"\xff" * 16,  # an exabyte array
        b"a" + b"s\x03\x00\x00\x00|O8" + b"\x01" + b"\x01" + b"\x00" * 7 + b"\x00" * 8,  # objects
        b"i\xff\xff\x00\x00",  # an int of 65535 bytes that are not there
        b"l\x01\x00\x00\x00" * 500 + b"N",  # nested past the depth bound
        b"S\x01\x00\x00\x00l\x00\x00\x00\x00",  # an unhashable set item
        b"NN",  # trailing bytes
        b"?",  # unknown tag
    ],
)
def test_malformed_payloads_are_errors_not_allocations(payload: bytes) -> None:
    """Any other bytes: the serialize target of fuzz/ (tests/security/test_fuzz_targets.py)."""
    with pytest.raises(CollectiveError, match="malformed"):
        _serialize.loads(_serialize.MAGIC + payload)


def _results(results):
    out = {}
    for r in results:
        out[r.rank] = {}
        for line in r.stdout.splitlines():
            if line.startswith("RESULT "):
                d = json.loads(line[7:])
                out[r.rank][d["step"]] = d
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("serializer", ["auto", "pickle", "safe"])
def test_object_collectives_work_with_every_serializer(serializer: str) -> None:
    results = run_ranks(
        WORKER, 3, ("roundtrip",), env={"PYCOLLECTIVE_OBJECT_SERIALIZER": serializer}
    )
    steps = _results(results)
    for r in results:
        assert r.returncode == 0, r.stderr
        assert steps[r.rank]["roundtrip"]["error"] is None, steps[r.rank]
        assert steps[r.rank]["check"]["ok"] is True, steps[r.rank]


@pytest.mark.timeout(60)
def test_a_safe_rank_refuses_a_pickling_peer() -> None:
    results = run_ranks(
        WORKER, 2, ("roundtrip",), per_rank_env={0: {"PYCOLLECTIVE_OBJECT_SERIALIZER": "safe"}}
    )
    s = _results(results)[0]["roundtrip"]
    assert s["error"] == "MismatchError" and "rank 1 sent a pickled object" in s["msg"], s


@pytest.mark.timeout(60)
def test_a_root_that_cannot_serialize_fails_every_rank_promptly() -> None:
    results = run_ranks(
        WORKER,
        3,
        ("unencodable",),
        env={"PYCOLLECTIVE_OBJECT_SERIALIZER": "safe", "PYCOLLECTIVE_TIMEOUT": "30"},
    )
    steps = _results(results)
    for r in results:
        s = steps[r.rank]["broadcast"]
        want = "UsageError" if r.rank == 1 else "CollectiveError"
        assert s["error"] == want, (r.rank, s)
        assert s["elapsed"] < 5.0, (r.rank, s)  # not the 30 s timeout
        if r.rank != 1:
            assert "rank 1 could not serialize its object" in s["msg"], s
