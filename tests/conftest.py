"""Session-wide test settings."""

from __future__ import annotations

import importlib.util
import os

import pytest


def _ray_installed() -> bool:
    """Ray itself, not the namespace package this folder's tests/ray makes of "ray"
    (which has no origin) when Ray is not installed."""
    spec = importlib.util.find_spec("ray")
    return spec is not None and spec.origin is not None


# tests/ray needs Ray (`make test-ray` installs it into .venv-ray and runs that folder);
# where Ray is not installed, as in `make test`'s .venv, the folder is not collected.
collect_ignore = [] if _ray_installed() else ["ray"]

# auto's cost parameters must not depend on what `pycollective calibrate` cached on this
# machine: tests (and the ranks they start) use the defaults unless a test says otherwise.
os.environ.setdefault("PYCOLLECTIVE_COST_CACHE", "off")


@pytest.fixture(scope="session", autouse=True)
def _flight_dumps_in_a_temporary_dir(tmp_path_factory):
    """Ranks started by tests dump their flight recorders (on every injected fault) under
    pytest's temporary directory instead of the shared default in /tmp."""
    if os.environ.get("PYCOLLECTIVE_FLIGHT_DIR"):
        yield
        return
    os.environ["PYCOLLECTIVE_FLIGHT_DIR"] = str(tmp_path_factory.mktemp("flight"))
    try:
        yield
    finally:
        os.environ.pop("PYCOLLECTIVE_FLIGHT_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def _per_user_key_in_a_temporary_home(tmp_path_factory):
    """The per-user key file (pycollective._keys, made on first use) goes under pytest's
    temporary directory rather than this user's ~/.config: ranks the tests start find
    each other with no step, exactly as a user's jobs do, and the suite leaves nothing
    behind in the home directory."""
    if os.environ.get("XDG_CONFIG_HOME"):
        yield
        return
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    try:
        yield
    finally:
        os.environ.pop("XDG_CONFIG_HOME", None)
