"""Data-parallel training of one small model, by all-reduce (torch DDP on the pycollective
backend) or through pycollective.ps parameter servers; saves each worker's final
parameters to OUT.rank<R>.pt.

    ps_worker.py allreduce|ps OUT [--steps K] [--batch B] [--ps-mode sync|async]

A server never imports torch (pycollective.ps serves numpy): torch is imported once the
process knows it trains, which spares each server rank a torch start (seconds of CPU).
"""

from __future__ import annotations

import argparse
from typing import Any

from pycollective import ps

LR, MOMENTUM = 0.05, 0.9


def model() -> Any:
    import torch.nn as nn

    import torch

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))


def batches(steps: int, worker: int, workers: int, batch: int):
    import torch

    gen = torch.Generator().manual_seed(99)
    mine = slice(worker * batch, (worker + 1) * batch)
    for _ in range(steps):
        x = torch.randn(workers * batch, 10, generator=gen)
        y = torch.randint(0, 3, (workers * batch,), generator=gen)
        yield x[mine], y[mine]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["allreduce", "ps"])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ps-mode", default="sync")
    args = p.parse_args()
    roles = ps.init() if args.mode == "ps" else None
    if roles is not None and roles.is_server:
        stats = ps.serve(roles)
        print(f"server {roles.server_index} updates={stats.updates} pushes={stats.pushes}")
        ps.shutdown()
        return

    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch

    torch.set_num_threads(1)
    net = model()

    if roles is None:
        dist.init_process_group("pycollective")
        rank, workers = dist.get_rank(), dist.get_world_size()
        ddp = DDP(net)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
        for x, y in batches(args.steps, rank, workers, args.batch):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        dist.destroy_process_group()
    else:
        rank, workers = roles.worker_index, roles.num_workers
        params = list(net.parameters())
        client = ps.Client(roles, params, {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                           mode=args.ps_mode)  # fmt: skip
        for x, y in batches(args.steps, rank, workers, args.batch):
            for q in params:
                q.grad = None
            nn.functional.cross_entropy(net(x), y).backward()
            client.step([q.grad for q in params])
        client.close()
        tr = client.traffic()
        print(f"worker {rank} steps={client.steps} sent={tr.bytes_sent} recv={tr.bytes_received}")
        ps.shutdown()
    torch.save(
        {k: v.detach().clone() for k, v in net.state_dict().items()}, f"{args.out}.rank{rank}.pt"
    )


if __name__ == "__main__":
    main()
