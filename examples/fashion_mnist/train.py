"""Data-parallel training on Fashion-MNIST three ways: one process, ring all-reduce among
the workers (torch's DDP on the "pycollective" backend), or parameter servers.

    python train.py --mode single
    pycollective run -n 2 train.py --mode allreduce
    pycollective run -n 2 --servers 1 train.py --mode ps

Each worker trains on its own contiguous shard of the training set. Rank 0 shows a
progress bar, saves a checkpoint, and with --metrics writes a JSON report: test accuracy,
samples per second, time per step split into compute and the communication the step
waited for, bytes sent and received per worker per step, and a loss/accuracy curve.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402
import models  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["single", "allreduce", "ps"], default="single")
    p.add_argument("--model", choices=sorted(models.MODELS), default="small")
    p.add_argument("--data-dir", default=None, help="the four IDX files (default: Debian's)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the training set")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: none)")
    p.add_argument("--batch", type=int, default=64, help="global batch (split over workers)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    p.add_argument("--ps-mode", choices=["sync", "async"], default="sync")
    p.add_argument("--eval-every", type=float, default=6.0, help="seconds between evals")
    p.add_argument("--checkpoint", default=None, help="rank 0 saves the model here")
    p.add_argument("--metrics", default=None, help="rank 0 writes its JSON report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


class Progress:
    """tqdm on rank 0; one line per refresh when the output is not a terminal (the
    launcher forwards whole lines only)."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            tty = sys.stderr.isatty()
            self.bar = tqdm(total=total, desc=desc, unit="step", ncols=90, ascii=not tty,
                            mininterval=0.5 if tty else 10.0,
                            file=sys.stderr if tty else _Lines(sys.stdout))  # fmt: skip

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Lines:
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), 1000):
            correct += (model(images[i : i + 1000]).argmax(1) == labels[i : i + 1000]).sum()
    model.train()
    return float(correct) / len(images)


def tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.from_numpy(data.to_float(images)) - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # one core per worker: the workers share the machine
    rank, workers, servers = 0, 1, 0
    client = ddp_group = None
    if args.mode == "allreduce":
        import pycollective.torch  # noqa: F401 - registers the backend (the entry point does too)

        dist.init_process_group("pycollective")
        rank, workers = dist.get_rank(), dist.get_world_size()
        ddp_group = dist.distributed_c10d._get_default_group()
    elif args.mode == "ps":
        from pycollective import ps

        roles = ps.init()
        if roles.is_server:
            stats = ps.serve(roles)
            print(f"server {roles.server_index}: {stats.updates} updates in {stats.seconds:.1f} s")
            ps.shutdown()
            return 0
        rank, workers, servers = roles.worker_index, roles.num_workers, roles.num_servers
    if args.batch % workers:
        raise SystemExit(f"--batch {args.batch} is not divisible by {workers} workers")
    local_batch = args.batch // workers

    try:
        ds = data.load(args.data_dir)
    except data.DatasetError as exc:
        raise SystemExit(f"fashion-mnist: {exc}") from None
    mine = data.shard(len(ds.train_images), rank, workers)
    x_train, y_train = tensors(ds.train_images[mine], ds.train_labels[mine])
    x_test, y_test = tensors(ds.test_images, ds.test_labels)
    x_probe, y_probe = x_test[:1000], y_test[:1000]  # quick accuracy for the curve

    torch.manual_seed(args.seed)
    model = models.build(args.model)
    params = list(model.parameters())
    net: nn.Module = model
    optimizer = None
    if args.mode == "allreduce":
        net = nn.parallel.DistributedDataParallel(model)
    if args.mode == "ps":
        client = ps.Client(roles, params, {"name": "adam", "lr": args.lr}, mode=args.ps_mode)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    # Every worker runs the same number of steps (the shards differ by at most one example).
    per_epoch = (len(ds.train_images) // workers) // local_batch
    steps = max(1, int(per_epoch * args.epochs))
    if args.steps:
        steps = min(steps, args.steps)

    # The moment the last gradient of a backward pass is ready: what follows, until
    # backward returns, is DDP waiting for its last buckets' all-reduce.
    last_grad = [0.0]

    def grad_ready(_param: torch.Tensor) -> None:
        last_grad[0] = time.perf_counter()

    for p in params:
        p.register_post_accumulate_grad_hook(grad_ready)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    order = torch.randperm(len(x_train), generator=gen)
    cursor = 0
    bar = Progress(steps, rank == 0 and not args.no_progress, f"{args.mode} x{workers}")
    traffic0 = _traffic(ddp_group, client)
    curve: list[dict[str, float]] = []
    compute = comm = 0.0
    loss_avg = None
    start = last_eval = time.perf_counter()
    for step in range(steps):
        if cursor + local_batch > len(order):
            order, cursor = torch.randperm(len(x_train), generator=gen), 0
        idx = order[cursor : cursor + local_batch]
        cursor += local_batch
        t0 = time.perf_counter()
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx])
        loss.backward()
        t1 = time.perf_counter()
        waited = max(0.0, t1 - last_grad[0]) if args.mode == "allreduce" else 0.0
        if client is not None:
            before = client.comm_seconds
            client.step([p.grad for p in params])
            waited = client.comm_seconds - before
        else:
            optimizer.step()
        t2 = time.perf_counter()
        comm += waited
        compute += (t2 - t0) - waited
        value = loss.item()
        loss_avg = value if loss_avg is None else 0.9 * loss_avg + 0.1 * value
        bar.update(loss_avg)
        if rank == 0 and (t2 - last_eval >= args.eval_every or step == steps - 1):
            last_eval = time.perf_counter()
            acc = evaluate(model, x_probe, y_probe)
            curve.append({"t": t2 - start, "step": step + 1, "loss": loss_avg, "acc": acc})
            start += time.perf_counter() - last_eval  # evaluation is not training time
    elapsed = time.perf_counter() - start
    bar.close()
    traffic = _delta(_traffic(ddp_group, client), traffic0)
    if client is not None:
        client.close()

    if rank == 0:
        test_acc = evaluate(model, x_test, y_test)
        report = {
            "mode": args.mode, "workers": workers, "servers": servers, "model": args.model,
            "parameters": models.parameter_count(model), "steps": steps,
            "global_batch": args.batch, "seconds": elapsed,
            "samples_per_s": steps * args.batch / elapsed,
            "step_ms": 1000 * elapsed / steps, "compute_ms": 1000 * compute / steps,
            "comm_ms": 1000 * comm / steps,
            "bytes_sent_per_step": traffic[0] / steps, "bytes_recv_per_step": traffic[1] / steps,
            "test_accuracy": test_acc, "curve": curve,
        }  # fmt: skip
        print(f"{args.mode}: test accuracy {test_acc:.4f} after {steps} steps, "
              f"{report['samples_per_s']:.0f} samples/s")  # fmt: skip
        if args.metrics:
            Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics).write_text(json.dumps(report, indent=1))
        if args.checkpoint:
            Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            state = {"model": model.state_dict(), "args": vars(args), "steps": steps}
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            torch.save(state, args.checkpoint)
    if args.mode == "allreduce":
        dist.destroy_process_group()
    elif args.mode == "ps":
        ps.shutdown()
    return 0


def _traffic(ddp_group: Any, client: Any) -> tuple[int, int]:
    if client is not None:
        t = client.traffic()
    elif ddp_group is not None:
        t = ddp_group.traffic()
    else:
        return 0, 0
    return t.bytes_sent, t.bytes_received


def _delta(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[0], a[1] - b[1]


if __name__ == "__main__":
    sys.exit(main())
