"""Parameter-server pieces without processes: sharding, roles, optimizers vs torch.optim,
and the launcher's --servers environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tests._launch import REPO

import torch
from pycollective import UsageError, ps


@pytest.mark.parametrize("total,servers", [(0, 1), (1, 3), (10, 3), (7_507_850, 4), (5, 5)])
def test_shards_cover_everything_once_balanced(total: int, servers: int) -> None:
    bounds = ps.shard_bounds(total, servers)
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_roles_last_ranks_are_servers() -> None:
    r = ps.roles(3, 5, 2)
    assert r.is_server and r.server_index == 0 and r.num_workers == 3
    assert ps.roles(2, 5, 2).worker_index == 2 and ps.roles(4, 5, 2).server_rank(1) == 4
    with pytest.raises(UsageError, match="servers"):
        ps.roles(0, 2, 2)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "sgd", "lr": 0.1},
        {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
        {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True},
        {"name": "adam", "lr": 1e-2},
        {"name": "adam", "lr": 1e-3, "weight_decay": 1e-2, "betas": [0.8, 0.99]},
    ],
)
def test_server_optimizers_follow_torch(spec: dict) -> None:
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(257).astype(np.float32)
    ours, theirs = p0.copy(), torch.tensor(p0, requires_grad=True)
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    topt = (torch.optim.SGD if spec["name"] == "sgd" else torch.optim.Adam)([theirs], **kwargs)
    opt = ps.make_optimizer(spec)
    for _ in range(30):
        g = rng.standard_normal(257).astype(np.float32)
        opt.step(ours, g)
        theirs.grad = torch.tensor(g)
        topt.step()
    assert np.abs(ours - theirs.detach().numpy()).max() < 1e-5
    assert np.abs(ours - p0).max() > 1e-2


def test_launcher_starts_servers_after_workers() -> None:
    code = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
        "['RANK', 'WORLD_SIZE', 'PYCOLLECTIVE_ROLE', 'PYCOLLECTIVE_NUM_SERVERS']}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    res = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "--no-prefix", "-n", "2", "--servers",
         "2", sys.executable, "-c", code],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda e: e["RANK"])
    assert [(e["RANK"], e["WORLD_SIZE"], e["PYCOLLECTIVE_ROLE"]) for e in got] == [
        ("0", "4", "worker"), ("1", "4", "worker"), ("2", "4", "server"), ("3", "4", "server"),
    ]  # fmt: skip
    assert {e["PYCOLLECTIVE_NUM_SERVERS"] for e in got} == {"2"}
    bad = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "1", "--nnodes", "2",
         "--master-addr", "127.0.0.1", "--master-port", "29999", "--servers", "1", "true"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "single node" in bad.stderr
