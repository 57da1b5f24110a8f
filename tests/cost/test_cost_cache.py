"""The per-host cache of cost parameters and where _tuning takes its numbers from (no
ranks: files in a temporary directory only)."""

from __future__ import annotations

import json
import warnings

import pytest

from pycollective.schedule.cost import CostParams
from pycollective.tuning import cache as _costcache
from pycollective.tuning import params as _tuning

MEASURED = CostParams(
    alpha=123e-6, beta=0.7e-9, gamma=0.2e-9, overhead=50e-6,
    msg_cpu=90e-6, byte_cpu=0.9e-9, call_cpu=400e-6, ranks_per_core=3.0,
)  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", str(tmp_path / "c"))
    monkeypatch.delenv("PYCOLLECTIVE_COST_TCP", raising=False)
    _tuning.reload()
    yield tmp_path / "c"
    _tuning.reload()


def test_round_trip(cache) -> None:
    assert _costcache.load("tcp") is None
    assert _tuning.host_params("tcp") == _tuning.defaults("tcp")
    path = _costcache.save("tcp", MEASURED, {"world_size": 2})
    assert path is not None and path.parent == cache and path.exists()
    # The job's CPU share is not a property of the host: it is not stored.
    assert _costcache.load("tcp") == MEASURED.__class__(**_costcache.as_dict(MEASURED))
    assert _costcache.load("tcp").ranks_per_core == 1.0
    _tuning.reload()
    assert _tuning.host_params("tcp").alpha == 123e-6
    assert _tuning.source("tcp") == str(path)
    data = json.loads(path.read_text())
    assert data["transport"] == "tcp" and data["version"] and data["details"]["world_size"] == 2


def test_key_names_host_transport_and_version(cache) -> None:
    name = _costcache.cache_path("tcp").name
    assert name.startswith("cost-tcp-") and _costcache.host_key() in name
    from pycollective import __version__

    assert name.endswith(f"-v{__version__}.json")
    assert _costcache.cache_path("shm") != _costcache.cache_path("tcp")


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"format": 1, "transport": "tcp"}',
     '{"format": 1, "transport": "tcp", "params": {"alpha": -1, "beta": 0, "gamma": 0}}',
     '{"format": 1, "transport": "tcp", "params": {"alpha": "x", "beta": 0, "gamma": 0}}',
     '{"format": 99, "transport": "tcp", "params": {"alpha": 1, "beta": 0, "gamma": 0}}'],
)  # fmt: skip
def test_corrupt_file_is_ignored_with_a_warning(cache, text: str) -> None:
    cache.mkdir(parents=True, mode=0o700)
    _costcache.cache_path("tcp").write_text(text)
    _costcache.cache_path("tcp").chmod(0o600)  # private, as the cache writes its entries
    with pytest.warns(UserWarning, match="ignoring the corrupt cost cache"):
        assert _costcache.load("tcp") is None
    _tuning.reload()
    with pytest.warns(UserWarning):
        assert _tuning.host_params("tcp") == _tuning.defaults("tcp")


def test_unwritable_directory_warns_and_never_raises(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # A directory below a regular file cannot be made, even by root.
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", str(blocker / "sub"))
    with pytest.warns(UserWarning, match="cannot write the cost cache"):
        assert _costcache.save("tcp", MEASURED) is None
    assert _costcache.load("tcp") is None  # and reading there is just "nothing cached"


def test_turned_off(monkeypatch) -> None:
    for value in ("off", "0", "none"):
        monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", value)
        assert _costcache.cache_dir() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _costcache.save("tcp", MEASURED) is None
            assert _costcache.load("tcp") is None


def test_default_location_follows_xdg(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYCOLLECTIVE_COST_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _costcache.cache_dir() == tmp_path / "pycollective"


def test_environment_beats_cache(cache, monkeypatch) -> None:
    _costcache.save("tcp", MEASURED)
    monkeypatch.setenv("PYCOLLECTIVE_COST_TCP", "1e-4,1e-9,1e-10,2e-5,1e-5,1e-10,1e-4")
    _tuning.reload()
    got = _tuning.host_params("tcp")
    assert (got.alpha, got.msg_cpu, got.call_cpu) == (1e-4, 1e-5, 1e-4)
    assert _tuning.source("tcp") == "environment"
    monkeypatch.setenv("PYCOLLECTIVE_COST_TCP", "1,2")
    _tuning.reload()
    with pytest.raises(ValueError, match="PYCOLLECTIVE_COST_TCP must be"):
        _tuning.host_params("tcp")
