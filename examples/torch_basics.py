"""The torch.distributed lesson of "Distributed Machine Learning Patterns", runnable: rank 0
broadcasts a tensor holding 123.0 to every rank, then every rank all-reduces a tensor
holding its own rank and prints the sum (0 + 1 + ... + N-1).

It is written as torch.distributed code. The same lines run on torch's gloo backend or on
pycollective, and only the import differs:

    pycollective run -n 4 python examples/torch_basics.py --gloo  # torch.distributed, gloo
    pycollective run -n 4 python examples/torch_basics.py         # pycollective
    torchrun --nproc-per-node 4 examples/torch_basics.py --gloo   # torch's own launcher too

Both read the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import argparse
import sys

import torch


def lesson(dist) -> None:
    """torch.distributed code: `dist` is torch.distributed or pycollective."""
    rank, world = dist.get_rank(), dist.get_world_size()

    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 123.0
    dist.broadcast(tensor, src=0)
    print(f"rank {rank}: broadcast from rank 0 gave {tensor.item()}")

    tensor = torch.tensor([float(rank)])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print(f"rank {rank}: all_reduce of the ranks 0..{world - 1} gave {tensor.item()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gloo", action="store_true", help="torch.distributed on gloo")
    args = p.parse_args(argv)
    if args.gloo:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    else:
        import pycollective as dist

        dist.init_process_group()
    lesson(dist)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
