"""Ranks that meet in etcd instead of rank 0's store: init_method="etcd://h1,h2/job" and
the environment form PYCOLLECTIVE_STORE=etcd://..., against a real 1-member etcd on
loopback (tests/_etcd.py); no rank hosts anything, and a second run of the same job name
right after the first starts clean (its keys went with its last rank)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from tests import _etcd
from tests._launch import assert_all_ok, run_ranks

WORKER = Path(__file__).with_name("_etcd_worker.py")
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def etcd():
    if _etcd.missing():
        pytest.fail(_etcd.missing())
    with _etcd.EtcdCluster(1) as cluster:
        yield cluster


def _sums(results) -> list[str]:
    return [line for r in results for line in r.stdout.splitlines() if line.startswith("SUM")]


def test_init_method_etcd_url_twice_under_one_job_name(etcd):
    url = f"etcd://{etcd.endpoints},127.0.0.1:1/{uuid.uuid4().hex[:8]}"  # a dead endpoint too
    for _ in range(2):
        results = run_ranks(WORKER, 3, env={"ET_URL": url, "MASTER_PORT": "1"}, timeout=90)
        assert_all_ok(results)
        assert _sums(results) == ["SUM 6"] * 3


def test_the_environment_form(etcd):
    env = {"PYCOLLECTIVE_STORE": f"etcd://{etcd.endpoints}/{uuid.uuid4().hex[:8]}"}
    results = run_ranks(WORKER, 2, env=env, timeout=90)
    assert_all_ok(results)
    assert _sums(results) == ["SUM 3"] * 2


def test_a_bad_store_url_is_named():
    results = run_ranks(WORKER, 2, env={"PYCOLLECTIVE_STORE": "etcd:///job"}, timeout=60)
    assert all(r.returncode != 0 for r in results)
    assert all("names no etcd endpoint" in r.stderr for r in results), results[0].stderr[-2000:]
