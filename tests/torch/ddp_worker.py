"""A plain torch DDP training script; only the backend name comes from the command line.

    ddp_worker.py BACKEND OUT [--steps N] [--batch B] [--scenarios plain,fp16,bf16,accum3]
        [--reference gloo]

For each scenario (plain DDP; an fp16 or bf16 compression hook; gradient accumulation
over 3 micro-batches with no_sync), each rank trains a small deterministic model (no
dropout) on its own slice of a synthetic dataset seeded identically everywhere, and saves
its final parameters to OUT.<scenario>.rank<R>.pt. The scenarios share one process group,
as a real program would. With WORLD_SIZE unset it runs as one process on the whole batch
(the reference run). --reference gloo trains every scenario again in the same processes
over a gloo group made beside BACKEND's (dist.new_group), saved to
OUT.gloo.<scenario>.rank<R>.pt: the comparison run without starting torch twice as often.
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import torch


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(4 * 6 * 6, 32), nn.Tanh(), nn.Linear(32, 5),
    )  # fmt: skip


def bf16_hook(state, bucket):
    # DDP refuses torch's bf16_compress_hook by name on CPU; the same hook under another
    # name is a user-written compression hook, which is what this checks.
    return default_hooks.bf16_compress_hook(state, bucket)


def train(
    args: argparse.Namespace, scenario: str, distributed: bool, rank: int, world: int,
    group: dist.ProcessGroup | None = None, out: str | None = None,
) -> None:  # fmt: skip
    net = model()
    hook, accum = "none", 1
    if scenario.startswith("accum"):
        accum = int(scenario[len("accum") :])
    elif scenario != "plain":
        hook = scenario
    if distributed:
        net = DDP(net, bucket_cap_mb=args.bucket_mb, process_group=group)
        # the hooks' state is the group they reduce over (None: the default group)
        if hook == "fp16":
            net.register_comm_hook(group, default_hooks.fp16_compress_hook)
        elif hook == "bf16":
            net.register_comm_hook(group, bf16_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    gen = torch.Generator().manual_seed(1234)
    total = world * args.batch if distributed else args.batch
    mine = slice(rank * args.batch, (rank + 1) * args.batch) if distributed else slice(None)
    for _step in range(args.steps):
        opt.zero_grad()
        for micro in range(accum):
            x = torch.randn(total, 1, 8, 8, generator=gen)[mine]
            y = torch.randint(0, 5, (total,), generator=gen)[mine]
            loss = nn.functional.cross_entropy(net(x), y) / accum
            if distributed and micro < accum - 1:
                with net.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
    module = net.module if distributed else net
    torch.save(
        {k: v.detach().clone() for k, v in module.state_dict().items()},
        f"{out or args.out}.{scenario}.rank{rank}.pt",
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("backend")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="per-worker batch")
    p.add_argument("--scenarios", default="plain")
    p.add_argument("--bucket-mb", type=float, default=0.002, help="small: several buckets")
    p.add_argument("--reference", choices=["gloo"], help="train again over a gloo group")
    args = p.parse_args()
    torch.set_num_threads(1)

    distributed = "WORLD_SIZE" in os.environ
    rank, world = 0, 1
    if distributed:
        dist.init_process_group(args.backend)
        rank, world = dist.get_rank(), dist.get_world_size()
    for scenario in args.scenarios.split(","):
        train(args, scenario, distributed, rank, world)
    if distributed and args.reference:
        ref = dist.new_group(backend=args.reference)
        # the reference must be the other backend, or the comparison compares us with us
        assert dist.get_backend(ref) == args.reference, dist.get_backend(ref)
        for scenario in args.scenarios.split(","):
            train(args, scenario, distributed, rank, world, ref, f"{args.out}.{args.reference}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
