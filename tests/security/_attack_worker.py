"""One rank of the jobs the attack tests run (tests/security/test_*.py).

_attack_worker.py allreduce      a checked all_reduce battery; prints {"ok": ..., "elapsed": ...}
_attack_worker.py objects        every object collective, checked
_attack_worker.py state-pickle   rank 1 sends rank 0 a pickled "state" where the library
                                 expects the pickle-free format (elastic's transfer)
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

import pycollective as dist
from pycollective.api import objects

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _workerlib
from _workerlib import emit  # noqa: E402

RANK = int(os.environ["RANK"])
P = int(os.environ["WORLD_SIZE"])


def allreduce() -> dict:
    ok = True
    for n in (1, 1000, 300_000):
        x = np.arange(n, dtype=np.float64) + RANK
        dist.all_reduce(x)
        ok = ok and bool(np.array_equal(x, np.arange(n) * P + P * (P - 1) / 2))
    return {"ok": ok}


def objects_roundtrip() -> dict:
    got = [None] * P
    dist.all_gather_object(got, {"rank": RANK, "a": np.arange(RANK + 2)})
    ok = all(g["rank"] == r and g["a"].tolist() == list(range(r + 2)) for r, g in enumerate(got))
    box = [{"from": 1, "big": bytes(3 << 20)}] if RANK == 1 else [None]
    dist.broadcast_object_list(box, src=1)
    return {"ok": bool(ok and box[0]["from"] == 1 and len(box[0]["big"]) == 3 << 20)}


class _Boom:
    """Unpickling this writes a file: proof that code ran."""

    def __reduce__(self):
        return (open, (os.environ["BOOM_FILE"], "w"))


def state_pickle() -> dict:
    """Rank 1 plays a job member (SEAL=1: it holds the key) or an attacker on the path
    (a wrong MAC) that sends rank 0 a pickle where the library reads an object
    (INTERNAL=1: elastic's state transfer; 0: a user's object)."""
    g = objects._state.resolve_group(None)
    if RANK == 1:
        payload = pickle.dumps(_Boom())
        seal = objects._Seal(g, peer=0)
        mac = seal._mac(1, 0, payload) if os.environ.get("SEAL") == "1" else bytes(32)
        sealed = np.frombuffer(payload + mac, np.uint8)
        dist.send(np.array([sealed.size], np.int64), dst=0)
        dist.send(sealed.copy(), dst=0)
        return {"ok": True}
    try:
        got = objects.recv_object(1, internal=os.environ.get("INTERNAL", "1") == "1")
    except dist.CollectiveError as exc:
        return {"ok": True, "error": type(exc).__name__, "msg": str(exc)}
    return {"ok": False, "error": None, "got": repr(got)}


def claim_huge() -> dict:
    """Rank 0 answers broadcast_object_list's size exchange with a terabyte."""
    t0 = time.monotonic()
    try:
        if RANK == 0:
            dist.broadcast(np.array([1 << 40], np.int64), src=0)
            time.sleep(1.0)  # the others refuse and say so: we hear it, then leave
            return {"ok": True}
        box = [None]
        dist.broadcast_object_list(box, src=0)
    except dist.CollectiveError as exc:
        return {
            "ok": True,
            "error": type(exc).__name__,
            "msg": str(exc),
            "t": time.monotonic() - t0,
        }
    return {"ok": False, "error": None}


def objects_bounded() -> dict:
    """Objects over several pieces (OBJECT_CHUNK_BYTES), then one over the bound."""
    big = bytes(range(256)) * (6 << 10)  # 1.5 MiB
    box = [big] if RANK == 1 else [None]
    dist.broadcast_object_list(box, src=1)
    ok = box[0] == big
    got = [None] * P
    mine = bytes([RANK]) * (1200 << 10)
    dist.all_gather_object(got, mine)
    ok = ok and all(g == bytes([r]) * (1200 << 10) for r, g in enumerate(got))
    gathered = [None] * P if RANK == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    ok = ok and (RANK != 0 or gathered == got)
    out = [None]
    dist.scatter_object_list(
        out, [bytes([r]) * (900 << 10) for r in range(P)] if RANK == 2 else None, src=2
    )
    ok = ok and out[0] == bytes([RANK]) * (900 << 10)
    too_big = [bytes(3 << 20)] if RANK == 0 else [None]
    try:
        dist.broadcast_object_list(too_big, src=0)
        refused = None
    except dist.CollectiveError as exc:
        refused = (type(exc).__name__, str(exc))
    want = "UsageError" if RANK == 0 else "CollectiveError"
    ok = ok and refused is not None and refused[0] == want
    ok = ok and (RANK != 0 or "PYCOLLECTIVE_MAX_OBJECT_BYTES" in refused[1])
    return {"ok": bool(ok), "refused": refused}


def main() -> None:
    t0 = time.monotonic()
    dist.init_process_group()
    mode = sys.argv[1]
    if os.environ.get("OBJECT_CHUNK_BYTES"):
        objects.CHUNK_BYTES = int(os.environ["OBJECT_CHUNK_BYTES"])
    modes = {
        "allreduce": allreduce,
        "objects": objects_roundtrip,
        "state-pickle": state_pickle,
        "claim-huge": claim_huge,
        "objects-bounded": objects_bounded,
    }
    out = modes[mode]()
    if mode in ("allreduce", "objects"):  # elsewhere a rank failed the group on purpose
        dist.barrier()
    dist.destroy_process_group()
    emit({**out, "elapsed": time.monotonic() - t0}, prefix="")  # a bare JSON line


if __name__ == "__main__":
    main()
