"""Data-parallel training on Fashion-MNIST three ways: one process, ring all-reduce among
the workers (torch's DDP on the "pycollective" backend), or parameter servers.

    python train.py --mode single
    pycollective run -n 2 train.py --mode allreduce [--accumulate 4]
    pycollective run -n 2 --servers 1 train.py --mode ps
    pycollective run -n 4 --elastic 2:4 --max-restarts 1 train.py --mode elastic

--mode elastic (elastic_train.py) survives lost workers without a restart
(pycollective.elastic). Under `pycollective run --max-restarts K`, --checkpoint-every N
saves every N updates and a restarted job resumes from the checkpoint.

Same samples, same order, whatever the mode: every rank draws the same permutation of
the training set each epoch, an update consumes the next --batch samples of it, and worker
w of W computes the gradient of its contiguous W-th of them, in --accumulate micro-batches
(DDP's no_sync for all but the last, so one all-reduce per update). So 1 process with
batch B, W workers with B/W each, and W workers with --accumulate k micro-batches of
B/(W k) compute the same update, up to float rounding: the modes differ in where the
arithmetic runs, not in what it computes.

Rank 0 shows a progress bar, evaluates a fixed probe of test images at --eval-points
evenly spaced points (the curve), evaluates the whole test set at the end, and with
--metrics writes a JSON report: accuracy, samples per second, time per update split into
compute and the communication the update waited for, bytes sent and received per worker
per update and per sample, and the curve. --save-params writes the final parameters as
one float32 .npy vector (tests compare the modes with it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

import pycollective.torch as pctorch  # registers the backend (torch's entry point does too)
import torch
from pycollective import ps
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402
import elastic_train  # noqa: E402
import models  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["single", "allreduce", "ps", "elastic"], default="single")
    p.add_argument("--model", choices=sorted(models.MODELS), default="small")
    p.add_argument("--data-dir", default=None, help="the four IDX files (default: Debian's)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the training set")
    p.add_argument("--samples", type=int, default=0, help="samples to train (not --epochs)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many updates (0: none)")
    p.add_argument("--batch", type=int, default=64, help="global batch per update")
    p.add_argument(
        "--accumulate", type=int, default=1,
        help="micro-batches per update and worker (accumulated: one all-reduce per update)",
    )  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    p.add_argument("--ps-mode", choices=["sync", "async"], default="sync")
    p.add_argument("--eval-points", type=int, default=12, help="points of the accuracy curve")
    p.add_argument("--probe", type=int, default=2000, help="test images the curve is measured on")
    p.add_argument("--no-eval", action="store_true", help="no curve, no test accuracy (timing)")
    p.add_argument("--checkpoint", default=None, help="rank 0 saves the model here")
    p.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="N",
        help="also save every N updates; a restarted job (pycollective run --max-restarts, "
        "or --resume) continues from the checkpoint",
    )  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.add_argument(
        "--kill-at", type=int, default=0, metavar="STEP",
        help="elastic/allreduce demo: the rank of --kill-rank SIGKILLs itself in this update "
        "(first attempt only)",
    )  # fmt: skip
    p.add_argument("--kill-rank", type=int, default=1, help="the RANK that --kill-at kills")
    p.add_argument("--steps-log", default=None, help="elastic: the leader appends each update here")
    p.add_argument(
        "--stop-after-rejoin", type=int, default=0, metavar="N",
        help="elastic: stop N updates after the first round that brings the membership back "
        "to its initial size after a change (a replacement joined); --samples/--steps stay "
        "the upper bound (0: off)",
    )  # fmt: skip
    p.add_argument("--save-params", default=None, help="rank 0 writes the parameters (.npy)")
    p.add_argument("--metrics", default=None, help="rank 0 writes its JSON report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    for name in ("batch", "accumulate"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.stop_after_rejoin < 0:
        p.error(f"--stop-after-rejoin must be >= 0 updates, got {args.stop_after_rejoin}")
    if args.stop_after_rejoin and args.mode != "elastic":
        p.error("--stop-after-rejoin is for --mode elastic only")
    return args


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

    def update_to(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n - self.bar.n)

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
    with torch.inference_mode():
        for i in range(0, len(images), 500):
            correct += int((model(images[i : i + 500]).argmax(1) == labels[i : i + 500]).sum())
    model.train()
    return correct / len(images)


def tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.from_numpy(data.to_float(images)) - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def eval_steps(steps: int, points: int) -> set[int]:
    """Updates after which the curve is measured: `points` evenly spaced ones ending with the
    last (each at most once), and 0, before training."""
    points = max(1, min(points, steps))
    return {0} | {round(steps * i / points) for i in range(1, points + 1)}


def adam(params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    try:  # the fused kernel: 3 ms instead of 40 per step for the 30 MB model on one core
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr)


def _kill_now(args: argparse.Namespace, step: int) -> bool:
    """--kill-at: this process is the one to die at this update (the first attempt only)."""
    return (
        args.kill_at == step
        and os.environ.get("RANK") == str(args.kill_rank)
        and os.environ.get("PYCOLLECTIVE_RESTART_COUNT", "0") == "0"
    )


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    """torch.save, atomically: a rank killed mid-write leaves the previous checkpoint."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.mode == "elastic":
        return elastic_train.main(args, tensors=tensors, evaluate=evaluate, adam=adam)
    torch.set_num_threads(1)  # one core per worker: the workers share the machine
    rank, workers, servers = 0, 1, 0
    client = None
    if args.mode == "allreduce":
        dist.init_process_group("pycollective")
        rank, workers = dist.get_rank(), dist.get_world_size()
    elif args.mode == "ps":
        roles = ps.init()
        if roles.is_server:
            stats = ps.serve(roles)
            print(f"server {roles.server_index}: {stats.updates} updates in {stats.seconds:.1f} s")
            ps.shutdown()
            return 0
        rank, workers, servers = roles.worker_index, roles.num_workers, roles.num_servers
    k = args.accumulate
    if args.batch % (workers * k):
        raise SystemExit(
            f"--batch {args.batch} does not split into {workers} workers x {k} micro-batches"
        )
    micro = args.batch // (workers * k)

    try:
        ds = data.load(args.data_dir)
    except data.DatasetError as exc:
        raise SystemExit(f"fashion-mnist: {exc}") from None
    x_train, y_train = tensors(ds.train_images, ds.train_labels)
    x_test, y_test = tensors(ds.test_images, ds.test_labels)
    probe = min(args.probe, len(x_test))
    x_probe, y_probe = x_test[:probe], y_test[:probe]

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
        optimizer = adam(params, args.lr)
    restart = int(os.environ.get("PYCOLLECTIVE_RESTART_COUNT", "0"))
    resumed: dict[str, Any] | None = None
    if args.checkpoint and (args.resume or restart) and os.path.exists(args.checkpoint):
        # every rank reads rank 0's checkpoint, so all go on from the same state
        resumed = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(resumed["model"])
        if optimizer is not None and "optimizer" in resumed:
            optimizer.load_state_dict(resumed["optimizer"])
        if rank == 0:
            print(f"resumed from {args.checkpoint} at update {resumed['step']} "
                  f"(restart {restart})", flush=True)  # fmt: skip

    n_train = len(x_train)
    samples = args.samples or int(n_train * args.epochs)
    steps = max(1, samples // args.batch)
    if args.steps:
        steps = min(steps, args.steps)
    evals = set() if args.no_eval else eval_steps(steps, args.eval_points)

    # The moment the last gradient of a backward pass is ready: what follows, until
    # backward returns, is DDP waiting for its last buckets' all-reduce.
    last_grad = [0.0]

    def grad_ready(_param: torch.Tensor) -> None:
        last_grad[0] = time.perf_counter()

    for p in params:
        p.register_post_accumulate_grad_hook(grad_ready)

    gen = torch.Generator().manual_seed(args.seed)  # the same order on every rank
    order = torch.randperm(n_train, generator=gen)
    cursor = 0
    first = 1 if resumed is None else resumed["step"] + 1
    if resumed is not None and "order" in resumed:
        gen.set_state(resumed["generator"])
        order, cursor = resumed["order"], resumed["cursor"]
    bar = Progress(steps, rank == 0 and not args.no_progress, f"{args.mode} x{workers}")
    traffic0 = _traffic(args.mode, client)
    curve: list[dict[str, float]] = []
    step_times: list[float] = []
    step_cpu: list[float] = []  # this process's CPU time per step (alone on a core: its time)
    compute = comm = 0.0
    loss_avg = None
    if resumed is not None:
        curve = list(resumed.get("curve", []))
        bar.update_to(first - 1)
    elif rank == 0 and 0 in evals:
        curve.append({"samples": 0, "step": 0, "acc": evaluate(model, x_probe, y_probe)})
    start = time.perf_counter()
    for step in range(first, steps + 1):
        if cursor + args.batch > n_train:
            order, cursor = torch.randperm(n_train, generator=gen), 0
        mine = order[cursor + rank * k * micro : cursor + (rank + 1) * k * micro]
        cursor += args.batch
        t0, c0 = time.perf_counter(), time.process_time()
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        value = 0.0
        for j in range(k):
            idx = mine[j * micro : (j + 1) * micro]
            # all but the last micro-batch only accumulate: no all-reduce
            quiet = net.no_sync() if args.mode == "allreduce" and j < k - 1 else None
            with quiet or contextlib.nullcontext():
                loss = nn.functional.cross_entropy(net(x_train[idx]), y_train[idx]) / k
                if _kill_now(args, step):
                    os.kill(os.getpid(), signal.SIGKILL)
                loss.backward()
            value += loss.item()
        t1 = time.perf_counter()
        waited = max(0.0, t1 - last_grad[0]) if args.mode == "allreduce" else 0.0
        if client is not None:
            before = client.comm_seconds
            client.step([p.grad for p in params])
            waited = client.comm_seconds - before
        else:
            optimizer.step()
        t2 = time.perf_counter()
        step_times.append(t2 - t0 - waited)
        step_cpu.append(time.process_time() - c0)
        comm += waited
        compute += (t2 - t0) - waited
        loss_avg = value if loss_avg is None else 0.9 * loss_avg + 0.1 * value
        bar.update(loss_avg)
        if rank == 0 and step in evals:
            t_eval = time.perf_counter()
            acc = evaluate(model, x_probe, y_probe)
            curve.append({"samples": step * args.batch, "step": step, "loss": loss_avg, "acc": acc})
            start += time.perf_counter() - t_eval  # evaluation is not training time
        every = args.checkpoint_every
        if rank == 0 and args.checkpoint and every and step % every == 0:
            save_checkpoint(args.checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer
                else None, "step": step, "order": order, "cursor": cursor,
                "generator": gen.get_state(), "curve": curve, "args": vars(args),
            })  # fmt: skip
    elapsed = time.perf_counter() - start
    bar.close()
    traffic = _delta(_traffic(args.mode, client), traffic0)
    if client is not None:
        client.close()

    if rank == 0:
        test_acc = None if args.no_eval else evaluate(model, x_test, y_test)
        seen = steps * args.batch
        warm, warm_cpu = step_times[2:] or step_times, step_cpu[2:] or step_cpu
        report = {
            "mode": args.mode, "workers": workers, "servers": servers, "model": args.model,
            "parameters": models.parameter_count(model), "steps": steps, "samples": seen,
            "global_batch": args.batch, "accumulate": k, "micro_batch": micro,
            "seconds": elapsed, "samples_per_s": seen / elapsed,
            "step_ms": 1000 * elapsed / steps, "compute_ms": 1000 * compute / steps,
            "compute_ms_median": 1000 * statistics.median(warm),
            "cpu_ms_median": 1000 * statistics.median(warm_cpu),
            "comm_ms": 1000 * comm / steps,
            "bytes_sent_per_step": traffic[0] / steps, "bytes_recv_per_step": traffic[1] / steps,
            # per sample of the global batch: what one worker's link carries per sample trained
            "bytes_sent_per_sample": traffic[0] / seen, "bytes_recv_per_sample": traffic[1] / seen,
            "test_accuracy": test_acc, "test_images": len(x_test),
            "probe_accuracy": curve[-1]["acc"] if curve else None, "probe_images": probe,
            "curve": curve, "lr": args.lr, "seed": args.seed,
        }  # fmt: skip
        acc = "-" if test_acc is None else f"{test_acc:.4f}"
        print(f"{args.mode} x{workers} (accumulate {k}): test accuracy {acc} after {seen} "
              f"samples, {report['samples_per_s']:.0f} samples/s")  # fmt: skip
        if args.metrics:
            Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
            Path(args.metrics).write_text(json.dumps(report, indent=1))
        if args.save_params:
            flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
            np.save(args.save_params, flat)
        if args.checkpoint:
            state = {"model": model.state_dict(), "args": vars(args), "steps": steps,
                     "step": steps, "curve": curve}  # fmt: skip
            if optimizer is not None:
                state["optimizer"] = optimizer.state_dict()
            save_checkpoint(args.checkpoint, state)
    if args.mode == "allreduce":
        dist.destroy_process_group()
    elif args.mode == "ps":
        ps.shutdown()
    return 0


def _traffic(mode: str, client: Any) -> tuple[int, int]:
    if client is not None:
        t = client.traffic()
    elif mode == "allreduce":
        t = pctorch.traffic()
    else:
        return 0, 0
    return t.bytes_sent, t.bytes_received


def _delta(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[0], a[1] - b[1]


if __name__ == "__main__":
    sys.exit(main())
