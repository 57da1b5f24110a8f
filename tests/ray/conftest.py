"""A Ray cluster of one node for the tests of tests/ray (the pytest process is its driver),
started on loopback and torn down at the end. `make test-ray` runs these in .venv-ray (Ray
2.60, ray[train]); `make test` does not collect this folder (tests/conftest.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile

import pytest

# No usage reports, no dashboard: the cluster talks to nothing but itself, on loopback (on
# Linux Ray otherwise replaces a loopback node address with the machine's own).
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("PYCOLLECTIVE_TIMEOUT", "60")
# Ray's token authentication on, with a token of this session's (Ray would otherwise make
# one and leave it in ~/.ray/auth_token).
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)

import ray  # noqa: E402

import pycollective.ray  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    # A short temporary directory: Ray's unix sockets live under it (107-byte paths).
    temp = tempfile.mkdtemp(prefix="pcr-", dir="/tmp")
    pycollective.ray.register()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp,
        runtime_env={"worker_process_setup_hook": "pycollective.ray.register"},
        log_to_driver=True,
    )
    pycollective.ray.register()  # after ray.init: the driver makes the job's secret
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
