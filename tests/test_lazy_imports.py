"""`import pycollective` loads what a rank needs to run collectives and nothing more: every
rank process of a job (and of the test suite: many hundreds) pays for it at start.

The heavy modules below stay out of a plain import (a fresh interpreter is asked, so
nothing this test process imported counts); the lazy names of pycollective._lazy resolve
to the real objects on first use, and `__all__`, `dir()` and the errors of unknown names
behave as without laziness.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pycollective
from pycollective import _lazy
from pycollective import store as store_mod

# Not needed to run a collective: the etcd client (and the http/email parsers under it),
# the integrations and commands built on the API, and the optional third-party packages.
NOT_ON_PLAIN_IMPORT = (
    "pycollective.store.etcd",
    "pycollective.store._etcd_client",
    "http.client",
    "email.parser",
    "pycollective.cli",
    "pycollective.torch",
    "pycollective.elastic",
    "pycollective.ps",
    "pycollective.ray",
    "pycollective.observe.diagnose",
    "torch",
    "ml_dtypes",
    "matplotlib",
    "cryptography",
)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_a_plain_import_leaves_the_heavy_modules_out() -> None:
    loaded = _modules_after("import pycollective")
    assert "pycollective.store" in loaded and "pycollective.core.group" in loaded
    assert not loaded & set(NOT_ON_PLAIN_IMPORT), sorted(loaded & set(NOT_ON_PLAIN_IMPORT))


def test_a_rank_that_runs_collectives_still_leaves_them_out() -> None:
    """A world of one through the whole path (rendezvous, the group's runners, a call):
    nothing on the way reaches for the etcd client."""
    loaded = _modules_after(
        "import numpy as np, pycollective as dist\n"
        "dist.init_process_group(rank=0, world_size=1, init_method='tcp://127.0.0.1:0')\n"
        "x = np.ones(4); dist.all_reduce(x); assert x[0] == 1\n"
        "dist.destroy_process_group()"
    )
    assert "pycollective.runners" in loaded
    assert not loaded & {"pycollective.store.etcd", "http.client"}


def test_the_launcher_leaves_the_etcd_client_out() -> None:
    """`pycollective run` (every launcher process) parses --rdzv-endpoint with
    store/_etcd_endpoints.py, not the client."""
    loaded = _modules_after(
        "from pycollective.cli.run import options\n"
        "from pycollective.store._etcd_endpoints import parse_endpoints\n"
        "assert str(parse_endpoints('h:1')[0]) == 'h:1'"
    )
    assert "pycollective.cli.run.launch" in loaded
    assert not loaded & {"pycollective.store.etcd", "pycollective.store._etcd_client"}


def test_lazy_names_resolve_to_the_real_objects() -> None:
    loaded = _modules_after(
        "from pycollective import store\n"
        "from pycollective.store import EtcdStore\n"
        "import pycollective.store.etcd as etcd\n"
        "assert EtcdStore is etcd.EtcdStore and store.parse_etcd_url is etcd.parse_url\n"
        "assert 'EtcdStore' in dir(store) and 'EtcdStore' in store.__all__"
    )
    assert "pycollective.store.etcd" in loaded


def test_every_public_name_resolves() -> None:
    for module in (pycollective, store_mod):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
        assert set(module.__all__) <= set(dir(module))


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchStore'"):
        store_mod.NoSuchStore  # noqa: B018
    assert not hasattr(store_mod, "NoSuchStore")


def test_if_loaded_does_not_import() -> None:
    """rendezvous.route_of's isinstance check: before the etcd module is loaded it answers
    None (no EtcdStore can exist), after it the class."""
    code = (
        "import sys\n"
        "from pycollective import _lazy, store\n"
        "assert _lazy.if_loaded(store, 'EtcdStore') is None\n"
        "assert 'pycollective.store.etcd' not in sys.modules\n"
        "import pycollective.store.etcd as etcd\n"
        "assert _lazy.if_loaded(store, 'EtcdStore') is etcd.EtcdStore\n"
    )
    assert "pycollective.store.etcd" in _modules_after(code)
    assert _lazy.if_loaded(store_mod, "EtcdStore") is store_mod.EtcdStore  # here: loaded
