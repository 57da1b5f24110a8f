"""A rank of a job in which one rank dies (tests/cli/test_launch_failures.py, tools/faults.py).

    _lost_rank_worker.py VICTIM AT [sleep]

Every rank prints `PID <pid>` once it has joined, then loops over all_reduce; rank VICTIM
SIGKILLs itself at iteration AT. The survivors catch nothing: their TransportError ends
them the way it ends a user's script (traceback on stderr), after their `finally` block
printed `FINALLY <rank>`, which Python's default SIGTERM would never let them do. With
`sleep`, the survivors sleep in Python instead (not in a collective), so only the
launcher's signals can end them.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import pycollective as dist

VICTIM, AT = int(sys.argv[1]), int(sys.argv[2])
SLEEP = sys.argv[3:] == ["sleep"]

dist.init_process_group()
rank = dist.get_rank()
print(f"PID {os.getpid()}", flush=True)
a = np.ones(4096, np.float32)
try:
    for i in range(1_000_000):
        if rank == VICTIM and i == AT:
            os.kill(os.getpid(), signal.SIGKILL)
        if SLEEP and i == AT:
            time.sleep(60)
        dist.all_reduce(a)
finally:
    print(f"FINALLY {rank}", flush=True)
