"""A small job for test_timeline.py: a fixed sequence of operations on 2 ranks; rank 1
arrives late (argv[1] seconds) at the all_reduce of 8 elements, so rank 0 waits there."""

from __future__ import annotations

import sys
import time

import numpy as np

import pycollective as dist

late = float(sys.argv[1])
dist.init_process_group()
rank = dist.get_rank()
x = np.ones(1024, np.float32)
for _ in range(3):
    dist.all_reduce(x)
dist.broadcast(x, src=0)
out = np.empty(2 * 1024, np.float32)
dist.all_gather_into_tensor(out, x)
if rank == 0:
    dist.send(np.ones(16, np.float32), dst=1)
else:
    dist.recv(np.empty(16, np.float32), src=0)
if rank == 1:
    time.sleep(late)
dist.all_reduce(np.ones(8, np.float32))
dist.all_reduce(x, async_op=True).wait()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
