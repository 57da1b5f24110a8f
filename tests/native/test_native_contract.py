"""The values the compiled core shares with Python are defined once, in Python, and the
extension is checked against them at import (shm/native.py contract_differences): the
arena's layout, the status codes, dtype and op codes, and the wire's numbering of
collectives (transport/_wire.py KIND_CODE), which C uses as its own."""

from __future__ import annotations

import collections
import os
import types

import pytest

from pycollective import _callstate
from pycollective.shm import native
from pycollective.transport import _wire

pytestmark = pytest.mark.skipif(
    native._native is None or os.environ.get("PYCOLLECTIVE_NATIVE") == "0",
    reason=f"the extension is not loaded ({native._MISSING or 'PYCOLLECTIVE_NATIVE=0'})",
)


def _copy(ext: types.ModuleType) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        CONSTANTS=dict(ext.CONSTANTS), KIND_CODE=dict(ext.KIND_CODE),
        OP_CODE=dict(ext.OP_CODE), ITEMSIZE=dict(ext.ITEMSIZE),
        GroupState=ext.GroupState, EngineState=ext.EngineState,
    )  # fmt: skip


def test_the_built_extension_agrees_with_every_python_definition() -> None:
    assert native.contract_differences(native._native, _wire.KIND_CODE) == []
    # C numbers the collectives it runs as the wire does: one numbering
    assert native._native.KIND_CODE == {k: _wire.KIND_CODE[k] for k in native._native.KIND_CODE}


@pytest.mark.parametrize(
    ("table", "key", "named"),
    [
        ("CONSTANTS", "WORDS", "WORDS: 17 in C, 16 in Python"),
        ("CONSTANTS", "PENDING", "PENDING: 17 in C, 1 in Python"),
        ("OP_CODE", "AVG", "op AVG: 17 in C, 7 in Python"),
        ("ITEMSIZE", 3, "itemsize of dtype code 3: 17 in C, 8 in Python"),
        ("KIND_CODE", "barrier", "code of barrier: 17 in C, 9 in Python"),
    ],
)
def test_a_value_c_compiled_differently_is_named(table: str, key: object, named: str) -> None:
    planted = _copy(native._native)
    getattr(planted, table)[key] = 17
    assert native.contract_differences(planted, _wire.KIND_CODE) == [named]


def test_values_only_one_side_has_are_differences_too() -> None:
    planted = _copy(native._native)
    del planted.CONSTANTS["SEQ"]
    planted.ITEMSIZE[99] = 4
    assert native.contract_differences(planted) == [
        "SEQ: None in C, 3 in Python",
        "itemsize of dtype code 99: 4 in C, None in Python",
    ]


def test_a_kind_numbered_unlike_the_wire_turns_the_compiled_arena_off_with_a_warning(
    monkeypatch,
) -> None:
    renumbered = dict(_wire.KIND_CODE, broadcast=3, reduce=2)
    monkeypatch.setattr(native._config, "first_time", lambda key: True)
    with pytest.warns(RuntimeWarning, match="numbers collectives unlike"):
        assert native.enabled(renumbered) is False
    assert native.enabled(_wire.KIND_CODE) is True


def test_the_call_state_is_c_owned_and_has_the_python_twins_fields() -> None:
    """The group and engine hold C-owned records (the compiled per-call path reads them
    by offset), with exactly the fields of the Python twins, which are their definition."""
    assert _callstate.group_state().__class__ is native._native.GroupState
    for twin in (_callstate.GroupState, _callstate.EngineState):
        compiled = getattr(native._native, twin.__name__)
        assert _callstate.fields(compiled) == set(twin.__slots__)
    lock, queue, deferred = object(), collections.deque(), []
    for make in (_callstate.EngineState, native._native.EngineState):
        st = make(lock, queue, deferred)
        assert (st.running, st.stopped, st.owner) == (False, False, None)
        assert st.lock is lock and st.queue is queue and st.deferred is deferred
    for make in (_callstate.GroupState, native._native.GroupState):
        st = make()
        assert (st.seq, st.failed, st.polled, st.checked_at) == (0, None, False, float("-inf"))
        st.seq += 1
        st.failed = ValueError("x")
        assert st.seq == 1 and isinstance(st.failed, ValueError)


def test_a_state_field_renamed_on_one_side_is_named() -> None:
    class GroupState:
        __slots__ = ("seq", "failure", "polled", "checked_at")

    planted = _copy(native._native)
    planted.GroupState = GroupState
    assert native.contract_differences(planted) == [
        "GroupState: only in C ['failure'], only in Python ['failed']"
    ]
