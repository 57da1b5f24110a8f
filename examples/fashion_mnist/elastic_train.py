"""train.py --mode elastic: training that goes on when workers are lost, and takes in
replacements, without a restart (pycollective.elastic).

    pycollective run -n 4 --elastic 2:4 --max-restarts 1 train.py --mode elastic

The DDP script's shape, with three lines changed: an elastic Manager owns the group (it
hands the state of the furthest member to any member behind it or joining), the model is
wrapped in elastic.ddp.DataParallel instead of DistributedDataParallel, and the optimizer
in elastic.ddp.Optimizer, which averages the gradients over whoever is a member and skips
the update of a step that failed. The data comes from ElasticSampler: one global batch of
--batch samples per update, split over the current members, so an update averages the same
number of samples whatever the membership, and every sample is used once per epoch (the
lost worker's samples of a step that is redone are split among the survivors).

The leader (the member of rank 0 at the time) appends one line per committed update to
--steps-log: update, loss over the global batch, members, round. With --kill-at S, the
worker whose launcher RANK is --kill-rank SIGKILLs itself in the middle of update S.
With --stop-after-rejoin N the run ends N updates after a replacement joined (the
membership back to its initial size) rather than at --samples, which stays the bound.
Every member prints `FINAL {json}` at the end with a digest of its parameters and
optimizer state, to show they are the same bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import data
import models
import numpy as np

import torch
from pycollective import elastic
from pycollective.elastic import ddp
from torch import nn


def _process_start() -> float:
    """When this process started (wall clock, from /proc): a replacement's clock starts here."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


def _digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    for state in optimizer.state_dict()["state"].values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class UpdatesToRun:
    """The `total` of manager.steps(): `steps`, or with `after` > 0, `after` updates past
    the first round (not the first) whose members are as many as the job started with and
    that someone joined: a replacement is in, and the run stops once it has shown that the
    job goes on with it. Every member of that round, the replacement too, records the same
    round at the same committed step (Event.step), so all stop at the same update."""

    def __init__(self, manager: elastic.Manager, steps: int, after: int) -> None:
        self.manager, self.steps, self.after = manager, steps, after

    def limit(self) -> int:
        if self.after:
            full = self.manager.initial_size
            for e in self.manager.events:
                if e.round > 0 and e.joined and len(e.members) >= full:
                    return min(self.steps, e.step + self.after)
        return self.steps

    def __le__(self, step: int) -> bool:  # what manager.steps() asks: `total <= step`
        return self.limit() <= step


def main(
    args: argparse.Namespace,
    *,
    tensors: Callable[..., Any],
    evaluate: Callable[..., float],
    adam: Callable[..., torch.optim.Optimizer],
) -> int:
    torch.set_num_threads(1)
    try:
        ds = data.load(args.data_dir)
    except data.DatasetError as exc:
        raise SystemExit(f"fashion-mnist: {exc}") from None
    x_train, y_train = tensors(ds.train_images, ds.train_labels)
    x_test, y_test = tensors(ds.test_images, ds.test_labels)
    x_probe, y_probe = x_test[: args.probe], y_test[: args.probe]

    torch.manual_seed(args.seed)
    model = models.build(args.model)
    inner = adam(list(model.parameters()), args.lr)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])

    ready = time.time()  # imports, data and model done: what follows is joining
    manager = elastic.Manager(state_dict, load_state_dict)
    net = ddp.DataParallel(manager, model)
    optimizer = ddp.Optimizer(manager, inner)
    sampler = elastic.ElasticSampler(manager, len(x_train), args.batch, seed=args.seed)
    samples = args.samples or int(len(x_train) * args.epochs)
    steps = max(1, samples // args.batch)
    if args.steps:
        steps = min(steps, args.steps)
    log_path = Path(args.steps_log) if args.steps_log else None
    started = _process_start()
    first_commit = first_cpu = None
    for step in manager.steps(UpdatesToRun(manager, steps, args.stop_after_rejoin)):
        idx = torch.from_numpy(sampler.indices())
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx]) if len(idx) else None
        if loss is not None:
            loss.backward()
        if step + 1 == args.kill_at and os.environ.get("RANK") == str(args.kill_rank):
            if not manager.events or manager.events[0].round == 0:  # not a replacement
                if log_path is not None:
                    with open(log_path, "a") as f:
                        f.write(json.dumps({"killed": step + 1, "t": time.time()}) + "\n")
                os.kill(os.getpid(), signal.SIGKILL)  # mid-step: before the all-reduce
        committed = optimizer.step()
        # the loss over the whole global batch, for the curve (a small all_reduce)
        value = np.array([loss.item() * sampler.share() if loss is not None else 0.0])
        manager.allreduce(value)
        if committed and first_commit is None:
            first_commit, first_cpu = time.time(), time.process_time()
        if committed and manager.rank == 0 and log_path is not None:
            with open(log_path, "a") as f:
                f.write(json.dumps({
                    "step": manager.step, "loss": float(value[0]), "members": manager.size,
                    "round": manager.round, "t": time.time(),
                }) + "\n")  # fmt: skip
    rank = manager.rank
    if rank < 0:  # a replacement that came after the last update: nothing to show
        manager.close()
        return 0
    final = {
        "rank": rank, "launcher_rank": os.environ.get("RANK"), "step": manager.step,
        "digest": _digest(model, inner), "rounds": [vars(e) for e in manager.events],
        "started": started, "ready": ready, "first_commit": first_commit,
        "cpu_at_first_commit": first_cpu,
    }  # fmt: skip
    print("FINAL " + json.dumps(final), flush=True)
    if rank == 0:
        acc = evaluate(model, x_probe, y_probe)
        print(f"elastic x{manager.size}: probe accuracy {acc:.4f} after {manager.step} updates "
              f"({manager.samples} samples)", flush=True)  # fmt: skip
        if args.metrics:
            Path(args.metrics).write_text(json.dumps({
                "mode": "elastic", "steps": manager.step, "samples": manager.samples,
                "probe_accuracy": acc, "members": manager.size,
                "rounds": [vars(e) for e in manager.events],
            }, indent=1))  # fmt: skip
        if args.save_params:
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
            np.save(args.save_params, flat)
    manager.close()
    return 0
