"""One rank of a flight-recorder job (tests/faults/test_flight.py).

_flight_worker.py sleep       the last rank stops calling until the others timed out
_flight_worker.py usr1        every rank dumps on SIGUSR1 after a few calls
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

import pycollective as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import mark, wait_for  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def main() -> None:
    scenario, *args = sys.argv[1:]
    dist.init_process_group()
    for _ in range(3):
        dist.all_reduce(np.ones(16, np.float32))
    dist.broadcast(np.ones(5, np.int64), src=P - 1)
    if scenario == "sleep":
        if RANK == P - 1:
            wait_for("timed-out", range(P - 1))
        else:
            try:
                dist.all_reduce(np.ones(7, np.float64))
            except dist.CollectiveTimeout as exc:
                print("TIMEOUT " + json.dumps({"msg": str(exc), "waiting": exc.waiting_on}))
            mark("timed-out", RANK)
    elif scenario == "usr1":
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        directory = os.environ["PYCOLLECTIVE_FLIGHT_DIR"]
        mine = f"rank{RANK}-{os.getpid()}.json"
        while time.monotonic() < deadline and mine not in os.listdir(directory):
            time.sleep(0.02)
        print("DUMPED " + json.dumps(mine in os.listdir(directory)))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
