"""Ray across two hosts for real: a head node in one network-namespace host and a worker
node in another (`ray start --head` / `ray start --address`, each bound to its namespace
address; tests/ray/_hosts.py), then, from a driver on host 0 (tests/ray/_multihost_job.py):
a ray.util.collective job with one actor on each host, every call on the pycollective
backend and on Ray's gloo backend in the same actors; and TorchTrainer with two workers on
different hosts on pycollective (init_method "env" and "tcp") and on gloo.

Needs root and `ip netns` (skipped otherwise, saying which is missing)."""

from __future__ import annotations

import json
import sys

import pytest
from _hosts import RayHosts
from tools import nethosts

_WHY = nethosts.available()
pytestmark = [
    pytest.mark.skipif(_WHY is not None, reason=f"no namespace hosts: {_WHY}"),
    pytest.mark.timeout(1200),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("rayhosts") / "out.json"
    with RayHosts() as cluster:
        res = cluster.driver([sys.executable, "tests/ray/_multihost_job.py", str(out)])
        assert res.returncode == 0, f"{res.stdout[-5000:]}\n{res.stderr[-8000:]}"
        addrs = cluster.hosts.addrs
    data = json.loads(out.read_text())
    data["addrs"] = addrs
    return data


def test_collective_actors_on_both_hosts_match_numpy_and_rays_gloo(report):
    assert report["nodes"] == report["addrs"]  # one actor on each host
    for key, res in report["calls"].items():
        assert res["ours"] == res["expected"], key
        assert res["gloo"] == res["expected"], key
    # across hosts the data went over TCP: each rank sent at least its 4000-byte buffers
    # of the two allreduces, the two allgathers and the two reducescatters
    assert all(b > 6 * 1000 * 4 for b in report["tcp_bytes"]), report["tcp_bytes"]


@pytest.mark.parametrize("init_method", ["env", "tcp"])
def test_torch_trainer_across_hosts_equals_gloo(report, init_method):
    ours = report["train"][f"pycollective/{init_method}"]
    gloo = report["train"]["gloo/env"]
    assert sorted(r["node"] for r in ours) == report["addrs"]  # a worker on each host
    assert sorted(r["node"] for r in gloo) == report["addrs"]
    for mine, theirs in zip(ours, gloo, strict=True):
        assert mine["backend"] == "pycollective" and theirs["backend"] == "gloo"
        assert mine["digest"] == theirs["digest"], (mine["first"], theirs["first"])
