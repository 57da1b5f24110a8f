"""One rank of the job that keeps running beside the fuzzer (tests/security/test_fuzz_wire.py):
all_reduce in a loop, checking every result, and store operations on the store being
fuzzed, until the key side/stop appears. Prints `SIDE {json}` at the end."""

from __future__ import annotations

import json
import os
import time

import numpy as np

import pycollective as dist
from pycollective.store import TCPStore

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def main() -> None:
    dist.init_process_group()
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30)
    base = np.arange(1000, dtype=np.float64)
    want = base * P + P * (P - 1) / 2
    it = bad = store_ops = 0
    t_end = time.monotonic() + float(os.environ.get("SIDE_MAX_SECONDS", "600"))
    while time.monotonic() < t_end:
        x = base + RANK
        dist.all_reduce(x)
        bad += int(not np.array_equal(x, want))
        it += 1
        if it % 20 == 0:
            store.add(f"side/count/{RANK}", 1)
            store_ops += 1
            stop = np.array([store.check(["side/stop"])], dtype=np.int32)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same call
            if stop[0]:
                break
        time.sleep(0.002)  # leave the CPU to the fuzzer
    counted = int(store.get(f"side/count/{RANK}"))
    store.close()
    dist.destroy_process_group()
    print(
        "SIDE "
        + json.dumps(
            {"rank": RANK, "iterations": it, "bad": bad, "store_ops": store_ops, "counted": counted}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
