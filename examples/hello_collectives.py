"""Every collective once, printing what each rank got.

    python -m pycollective run -n 4 examples/hello_collectives.py

Written exactly as torch.distributed code would be, with one changed import.
"""

from __future__ import annotations

import time

import numpy as np

import pycollective as dist


def show(name: str, value: object) -> None:
    print(f"{name:<22} {value}", flush=True)


def main() -> None:
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()

    x = np.arange(4, dtype=np.float32) + rank
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    show("all_reduce(sum)", x)

    for algorithm in dist.algorithms("all_reduce")[1:]:
        y = np.full(3, rank + 1, dtype=np.int64)
        dist.all_reduce(y, op=dist.ReduceOp.PRODUCT, algorithm=algorithm)
        show(f"all_reduce {algorithm}", y)

    b = np.full(3, rank, dtype=np.int32)
    dist.broadcast(b, src=world - 1)
    show(f"broadcast(src={world - 1})", b)

    r = np.full(2, rank, dtype=np.float64)
    dist.reduce(r, dst=0, op=dist.ReduceOp.MAX)
    show("reduce(max, dst=0)", r)

    gathered = np.zeros(world * 2, dtype=np.int16)
    dist.all_gather_into_tensor(gathered, np.full(2, rank, dtype=np.int16))
    show("all_gather", gathered)

    mine = np.zeros(1, dtype=np.int64)
    dist.reduce_scatter_tensor(mine, np.arange(world, dtype=np.int64) * (rank + 1))
    show("reduce_scatter", mine)

    bucket = [np.zeros(1, dtype=np.int64) for _ in range(world)] if rank == 0 else None
    dist.gather(np.array([rank * 10]), bucket, dst=0)
    if rank == 0:
        show("gather(dst=0)", [int(t[0]) for t in bucket])

    part = np.zeros(1, dtype=np.int64)
    pieces = [np.array([100 + i]) for i in range(world)] if rank == 0 else None
    dist.scatter(part, pieces, src=0)
    show("scatter(src=0)", part)

    out = np.zeros(world, dtype=np.int64)
    dist.all_to_all_single(out, np.arange(world, dtype=np.int64) + 10 * rank)
    show("all_to_all", out)

    if world > 1:
        token = np.array([rank], dtype=np.int64)
        got = np.zeros(1, dtype=np.int64)
        reqs = [dist.isend(token, dst=(rank + 1) % world), dist.irecv(got, src=(rank - 1) % world)]
        for req in reqs:
            req.wait()
        show("ring send/recv", got)

    objects: list[object] = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "pid_parity": rank % 2})
    show("all_gather_object", objects)

    evens = dist.new_group([i for i in range(world) if i % 2 == 0])
    odds = dist.new_group([i for i in range(world) if i % 2 == 1])
    g = evens if rank % 2 == 0 else odds
    s = np.array([rank])
    dist.all_reduce(s, group=g)
    show("subgroup all_reduce", s)

    big = np.ones(8 << 20 >> 2, dtype=np.float32)  # 8 MiB
    dist.barrier()
    start = time.perf_counter()
    work = dist.all_reduce(big, async_op=True)
    work.wait()
    elapsed = time.perf_counter() - start
    busbw = 2 * (world - 1) / world * big.nbytes / elapsed / 1e9
    show(
        "async 8 MiB all_reduce",
        f"{elapsed * 1e3:.1f} ms, busbw {busbw:.2f} GB/s, ok={big[0] == world}",
    )

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
