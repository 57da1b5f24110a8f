"""NaN and infinity in configuration (issue 18, finding 9): `PYCOLLECTIVE_TIMEOUT=nan` or
`inf` and `PYCOLLECTIVE_COST_TCP=nan,...` passed validation (every comparison with NaN is
false, so `value < low` never refused it): a NaN timeout is a deadline that never comes
(a hang instead of a CollectiveTimeout), a NaN cost makes the cost model's every
comparison false. Every number read from the environment or given as a timeout is now
refused unless finite, naming the variable and what it accepts. Sans-IO: `_config.get`
on a dict."""

from __future__ import annotations

import datetime
import math

import pytest

from pycollective import _config
from pycollective._errors import UsageError

NOT_FINITE = ["nan", "NaN", " nan ", "inf", "-inf", "Infinity", "+inf", "1e999", "-1e999"]


def _floats(value) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, tuple):
        return [v for item in value for v in _floats(item)]
    return []


@pytest.mark.parametrize("name", sorted(_config.VARS))
def test_no_variable_yields_a_number_that_is_not_finite(name) -> None:
    """Every variable of the table: a non-finite spelling is refused with the variable
    named and what it accepts, or read as something that is not a number (a name)."""
    for text in NOT_FINITE:
        try:
            value = _config.get(name, {name: text})
        except UsageError as exc:
            assert str(exc).startswith(f"{name}={text!r} is not valid: it takes ")
            continue
        assert all(math.isfinite(v) for v in _floats(value)), (name, text, value)


@pytest.mark.parametrize(
    "name", ["PYCOLLECTIVE_TIMEOUT", "PYCOLLECTIVE_SHM_SPIN_US", "PYCOLLECTIVE_COST_TCP"]
)
def test_the_float_variables_say_finite(name) -> None:
    with pytest.raises(UsageError, match="finite"):
        _config.get(name, {name: "nan"})
    assert "finite" in _config.VARS[name].kind.accepts  # and so does configuration.md


@pytest.mark.parametrize(
    "text",
    ["nan,1e-9,1e-10", "1e-5,inf,0", "1e-5,1e-9,1e-10,-inf", "1e-5,1e-9,1e-10,0,0,0,nan"],
)
def test_cost_with_a_number_that_is_not_finite_is_refused(text) -> None:
    with pytest.raises(UsageError, match=r"PYCOLLECTIVE_COST_TCP=.* is not valid: it takes"):
        _config.get("PYCOLLECTIVE_COST_TCP", {"PYCOLLECTIVE_COST_TCP": text})
    good = text.replace("nan", "1").replace("-inf", "1").replace("inf", "1")
    assert _config.get("PYCOLLECTIVE_COST_TCP", {"PYCOLLECTIVE_COST_TCP": good})


def test_check_environment_refuses_a_nan_timeout_before_anything_is_sent() -> None:
    with pytest.raises(UsageError, match="PYCOLLECTIVE_TIMEOUT='nan'"):
        _config.check_environment({"PYCOLLECTIVE_TIMEOUT": "nan"})
    assert _config.get("PYCOLLECTIVE_TIMEOUT", {"PYCOLLECTIVE_TIMEOUT": "2.5"}) == 2.5


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_timeout_argument_that_is_not_finite_is_refused(bad) -> None:
    with pytest.raises(UsageError, match="finite"):
        _config.timeout_seconds(bad)
    assert _config.timeout_seconds(datetime.timedelta(minutes=1)) == 60.0


@pytest.mark.parametrize("flag", ["--grace", "--notice"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_the_launchers_seconds_refuse_nan_and_infinity(flag: str, value: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", flag, value, "-n", "1", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "a finite number of seconds" in out.stderr, out.stderr


def test_launch_refuses_nan_from_the_api() -> None:
    from pycollective.cli.run import launch

    with pytest.raises(UsageError, match="finite"):
        launch(1, ["true"], grace=float("nan"))
