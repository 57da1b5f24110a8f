"""Every PYCOLLECTIVE_* variable is declared once (_config.py), checked with a message that
names it and what it accepts, and documented in docs/configuration.md (generated)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pycollective import UsageError, _config
from pycollective.core import rendezvous

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

# A value each kind of variable must refuse (text kinds refuse nothing but emptiness,
# which means "unset": their checks are elsewhere, e.g. algorithm names below).
BAD = {
    _config.SECONDS: ["abc", "0", "-3"],
    _config.COUNT: ["many", "-1", "2.5"],
    _config.POSITIVE: ["0", "x"],
    _config.BYTES: ["0", "1MB"],
    _config.MICROSECONDS: ["-1", "fast"],
    _config.SWITCH: ["maybe", "2"],
    _config.AUTO_SWITCH: ["maybe", "2", "always"],
    _config.TRANSPORTS: ["udp"],
    _config.SERIALIZERS: ["json"],
    _config.CALIBRATE: ["sometimes"],
    _config.COST: ["1,2", "a,b,c", "1,2,3,4,5", "-1,1,1"],
    _config.BOUNDS: ["4", "3:2", "0:2", "a:b"],
    _config.ROLES: ["boss"],
    _config.DEBUG_LEVELS: ["verbose", "1"],
}


def _cases():
    for var in _config.VARS.values():
        for kind, values in BAD.items():
            if var.kind is kind:
                for value in values:
                    yield pytest.param(var.name, value, id=f"{var.name}={value}")


@pytest.mark.parametrize("name, value", list(_cases()))
def test_a_bad_value_names_the_variable_and_what_it_takes(name: str, value: str) -> None:
    with pytest.raises(UsageError) as err:
        _config.get(name, {name: value})
    text = str(err.value)
    assert name in text and repr(value) in text and _config.VARS[name].kind.accepts in text


def test_every_kind_of_value_is_covered() -> None:
    """Each declared variable of a checkable kind has bad values above (a new kind needs
    its own)."""
    text_kinds = {_config.PATH, _config.NAME, _config.ALGORITHM}
    for var in _config.VARS.values():
        if var.kind in text_kinds:
            continue
        assert var.kind in BAD, f"{var.name}: add bad values for its kind to BAD"


def test_good_values_and_defaults() -> None:
    assert _config.get("PYCOLLECTIVE_TIMEOUT", {}) == 300.0
    assert _config.get("PYCOLLECTIVE_TIMEOUT", {"PYCOLLECTIVE_TIMEOUT": " 12.5 "}) == 12.5
    assert _config.get("PYCOLLECTIVE_TRANSPORT", {"PYCOLLECTIVE_TRANSPORT": "TCP"}) == "tcp"
    assert _config.get("PYCOLLECTIVE_CALIBRATE", {"PYCOLLECTIVE_CALIBRATE": "yes"}) == "1"
    assert _config.get("PYCOLLECTIVE_COST_TCP", {"PYCOLLECTIVE_COST_TCP": "1e-4,1e-9,0"}) == (
        1e-4,
        1e-9,
        0.0,
    )
    assert _config.get("PYCOLLECTIVE_FLIGHT_RECORDER", {"PYCOLLECTIVE_FLIGHT_RECORDER": ""}) == 256


def test_algorithm_names_are_checked_against_what_runners_know(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_ALL_REDUCE_ALGORITHM", "rign")
    with pytest.raises(UsageError, match=r"PYCOLLECTIVE_ALL_REDUCE_ALGORITHM='rign'.*'ring'"):
        rendezvous.check_environment()
    monkeypatch.setenv("PYCOLLECTIVE_ALL_REDUCE_ALGORITHM", "hierarchical")
    rendezvous.check_environment()
    monkeypatch.setenv("PYCOLLECTIVE_BROADCAST_ALGORITHM", "shm")
    rendezvous.check_environment()


def test_an_unknown_name_warns_once_with_the_closest(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_TIMEOTU", "5")
    with pytest.warns(UserWarning, match="PYCOLLECTIVE_TIMEOTU.*did you mean PYCOLLECTIVE_TIMEOUT"):
        _config.check_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _config.check_environment()  # said once per process


def test_init_process_group_refuses_a_bad_setting_before_anything(monkeypatch) -> None:
    """A world of one: no launcher needed; the check comes first."""
    import pycollective as dist

    monkeypatch.setenv("PYCOLLECTIVE_TIMEOUT", "abc")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_TIMEOUT='abc'"):
        dist.init_process_group()
    monkeypatch.setenv("PYCOLLECTIVE_TIMEOUT", "0")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_TIMEOUT='0'.*seconds > 0"):
        dist.init_process_group()
    monkeypatch.delenv("PYCOLLECTIVE_TIMEOUT")
    monkeypatch.setenv("PYCOLLECTIVE_SHM_SPIN_US", "x")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_SHM_SPIN_US='x'"):
        dist.init_process_group()
    assert not dist.is_initialized()


def test_every_variable_the_code_reads_is_declared() -> None:
    """Names spelled in the source (src, tools, tests, benchmarks) are all in the table."""
    import re

    root = Path(__file__).resolve().parents[1]
    spelled: set[str] = set()
    for folder in ("src", "tools", "benchmarks", "examples"):
        for path in (root / folder).rglob("*.py"):
            spelled |= set(re.findall(r"PYCOLLECTIVE_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    families = {"PYCOLLECTIVE_COST", "PYCOLLECTIVE_COST_", "PYCOLLECTIVE_"}
    missing = sorted(n for n in spelled - families if n not in _config.VARS)
    assert not missing, f"declare these in _config.py: {missing}"


def test_the_configuration_page_is_current() -> None:
    assert DOCS.read_text() == _config.markdown(), (
        "docs/configuration.md is stale: regenerate it (see its header)"
    )


def test_the_regeneration_command_in_the_page_works(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pycollective import _config; print(_config.markdown(), end='')",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == DOCS.read_text() and not out.stderr
