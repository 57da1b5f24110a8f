"""One rank of a chaos job (tests/faults/_chaos.py, tools/faults.py): a loop of mixed
collectives that every rank calls in the same order (a shared seed), checking results.

Prints `PID <rank> <pid>` once it has joined, `READY <rank>` after a few iterations, and
on the first CollectiveError `RAISED {json}` with the wall time it was raised at, then
destroys the group and exits 1. SIGTERM (the launcher telling survivors that a rank
failed) is noted, not obeyed at once: the point is to see the rank raise by itself. SIGINT
ends the loop with `INTERRUPTED {json}` and exit status 130.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import signal
import sys
import time

import numpy as np

import pycollective as dist

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])
SEED = int(os.environ.get("CHAOS_SEED", "1"))
_terms: list[float] = []


def out(tag: str, **fields) -> None:
    print(f"{tag} " + json.dumps(fields), flush=True)


def step(rng: random.Random, it: int) -> None:
    kind = rng.randrange(11)
    n = rng.choice([1, 7, 64, 1000, 70000])
    if kind <= 2:
        x = np.full(n, RANK + 1, np.float32)
        dist.all_reduce(x, algorithm=rng.choice(dist.algorithms("all_reduce")))
        assert x[0] == P * (P + 1) / 2, x[:4]
    elif kind == 3:
        x = np.full(n, RANK, np.int64)
        src = rng.randrange(P)
        dist.broadcast(x, src=src)
        assert x[0] == src
    elif kind == 4:
        out_ = np.empty(n * P, np.float64)
        dist.all_gather_into_tensor(out_, np.full(n, RANK, np.float64))
        assert out_[n * (P - 1)] == P - 1
    elif kind == 5:
        o = np.empty(n, np.float32)
        dist.reduce_scatter_tensor(o, np.ones(n * P, np.float32))
        assert o[0] == P
    elif kind == 6:
        dist.barrier()
    elif kind == 7:
        o = np.empty(n * P, np.int32)
        dist.all_to_all_single(o, np.full(n * P, RANK, np.int32))
        assert o[n * (P - 1)] == P - 1
    elif kind == 8:
        dst = rng.randrange(P)
        slots = [np.empty(n, np.int16) for _ in range(P)] if RANK == dst else None
        dist.gather(np.full(n, RANK, np.int16), slots, dst=dst)
        assert slots is None or slots[-1][0] == P - 1
    elif kind == 9:  # a ring of point-to-point
        x = np.full(n, RANK, np.float32)
        y = np.empty(n, np.float32)
        reqs = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, x, (RANK + 1) % P), dist.P2POp(dist.irecv, y, (RANK - 1) % P)]
        )
        for r in reqs:
            r.wait()
        assert y[0] == (RANK - 1) % P
    else:
        got = [None] * P
        dist.all_gather_object(got, {"r": RANK, "it": it})
        assert [g["r"] for g in got] == list(range(P))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: _terms.append(time.time()))
    dist.init_process_group()
    out("PID", rank=RANK, pid=os.getpid())
    rng = random.Random(SEED)
    it = 0
    try:
        while True:
            step(rng, it)
            it += 1
            if it == 10:
                out("READY", rank=RANK)
            if _terms and time.time() - _terms[0] > 8:
                out("NORAISE", rank=RANK, iterations=it)  # told to stop, never raised
                sys.exit(3)
    except dist.CollectiveError as exc:
        out(
            "RAISED",
            rank=RANK,
            at=time.time(),
            error=type(exc).__name__,
            bases=[c.__name__ for c in type(exc).__mro__],
            msg=str(exc)[:500],
            peer=getattr(exc, "peer", None),
            iterations=it,
        )
        dist.destroy_process_group()
        sys.exit(1)
    except KeyboardInterrupt:
        out("INTERRUPTED", rank=RANK, at=time.time(), iterations=it)
        faulthandler.dump_traceback_later(3.0)  # if destroy is slow, show where it waits
        t0 = time.monotonic()
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()
        out("DESTROYED", rank=RANK, seconds=time.monotonic() - t0)
        sys.exit(130)


if __name__ == "__main__":
    main()
