"""The Ray Train job of the tests and the benchmark: DDP on a small MLP, the same seed and
data on every backend, each worker its own shard; each rank writes what backend ran, a digest
of the final parameters, a few of their values and the steps' times to a JSON file in the
run's storage directory (one file system for every node here; Ray Train keeps no metrics
reported without a checkpoint).

    fit(backend, init_method, steps, width, storage, spread=False) -> [report of each rank]
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import ray.train
import ray.train.torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_loop(config: dict) -> None:
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, steps = config["width"], config["steps"]
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
    model = ray.train.torch.prepare_model(model)  # DistributedDataParallel on the group
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)
    times = []
    for _ in range(steps):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    report = {
        "backend": dist.get_backend(),
        "group": type(dist.group.WORLD).__name__,
        "world": dist.get_world_size(),
        "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "first": flat[:4].tolist(),
        "step_times": times,
        "node": ray.util.get_node_ip_address(),
    }
    path = os.path.join(config["out"], f"rank{rank}.json")
    with open(path + ".part", "w") as f:
        json.dump(report, f)
    os.replace(path + ".part", path)


def fit(
    backend: str,
    init_method: str,
    steps: int,
    width: int,
    storage: str,
    spread: bool = False,
    workers: int = 2,
) -> list[dict[str, Any]]:
    name = f"{backend}-{init_method}-{time.time_ns()}"
    out = os.path.join(storage, name + "-reports")
    os.makedirs(out)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": steps, "width": width, "out": out},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
            placement_strategy="STRICT_SPREAD" if spread else "PACK",
        ),
        torch_config=TorchConfig(backend=backend, init_method=init_method),
        run_config=RunConfig(name=name, storage_path=storage),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    reports = []
    for r in range(workers):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            reports.append(json.load(f))
    return reports
