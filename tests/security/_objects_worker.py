"""One rank of an object-collective job (tests/security/test_serialize.py).

_objects_worker.py roundtrip    every object collective, under whichever serializer is set
_objects_worker.py unencodable  rank 1 broadcasts an object the safe format cannot carry
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

import pycollective as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import attempt, report  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def mine() -> dict:
    return {"rank": RANK, "arr": np.arange(RANK + 1, dtype=np.int32), "t": (1.5, None, b"x")}


def roundtrip() -> None:
    def run() -> None:
        got = [None] * P
        dist.all_gather_object(got, mine())
        ok = all(
            g["rank"] == r and g["arr"].tolist() == list(range(r + 1)) for r, g in enumerate(got)
        )
        objs = [mine()] if RANK == 1 else [None]
        dist.broadcast_object_list(objs, src=1)
        ok = ok and objs[0]["rank"] == 1 and objs[0]["t"] == (1.5, None, b"x")
        gathered = [None] * P if RANK == 0 else None
        dist.gather_object(RANK * 10, gathered, dst=0)
        ok = ok and (RANK != 0 or gathered == [r * 10 for r in range(P)])
        out = [None]
        dist.scatter_object_list(out, [{"to": r} for r in range(P)] if RANK == 0 else None, src=0)
        ok = ok and out[0] == {"to": RANK}
        report(step="check", error=None, elapsed=0.0, ok=bool(ok))

    attempt("roundtrip", run, dist.CollectiveError)


def unencodable() -> None:
    objs = [object()] if RANK == 1 else [None]
    attempt("broadcast", lambda: dist.broadcast_object_list(objs, src=1), dist.CollectiveError)


def main() -> None:
    dist.init_process_group()
    {"roundtrip": roundtrip, "unencodable": unencodable}[sys.argv[1]]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
