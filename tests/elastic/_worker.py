"""A member of an elastic job (tests/elastic, tools/faults.py): least squares with momentum
in numpy, over ElasticSampler's shards, through pycollective.elastic.Manager.

Environment: EL_STEPS (steps to commit), EL_SLEEP (seconds of "compute" per step),
EL_TIMEOUT (collective timeout), EL_JOIN (join timeout). Prints, one JSON object a line:
  PID {pid, uid}             once the manager is up
  STEP {step, rank, size, t} after each step (step: committed steps; ok: committed here)
  ROUND {...}                each membership change this member went through
  DONE {step, digest, ...}   at the end: digest of the final state (bit for bit)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time


def _process_start() -> float:
    """When this process started (wall clock), from /proc: before the interpreter loaded."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


STARTED = _process_start()

import numpy as np  # noqa: E402 - after the start time, which is all the imports cost

from pycollective import elastic  # noqa: E402

STEPS = int(os.environ.get("EL_STEPS", "60"))
STOP = os.environ.get("EL_STOP_FILE")  # holds the step to stop at, once the test decides
KILL_DIR = os.environ.get("EL_KILL_DIR")  # a file named after our pid: die mid-collective
SLEEP = float(os.environ.get("EL_SLEEP", "0.02"))
data = np.random.default_rng(0).standard_normal((2048, 32))
target = data @ np.linspace(-1, 1, 32)
w = np.zeros(32)
m = np.zeros(32)


def out(tag: str, **fields) -> None:
    print(f"{tag} {json.dumps(fields)}", flush=True)


def state():
    return {"w": w.copy(), "m": m.copy()}


def load(s) -> None:
    w[:] = s["w"]
    m[:] = s["m"]


mgr = elastic.Manager(
    state, load,
    timeout=float(os.environ.get("EL_TIMEOUT", "30")),
    join_timeout=float(os.environ.get("EL_JOIN", "10")),
    store_idle=float(os.environ.get("EL_STORE_IDLE", "30")),
)  # fmt: skip
sampler = elastic.ElasticSampler(mgr, len(data), global_batch=48, seed=1)
out("PID", pid=os.getpid(), uid=mgr.uid, started=STARTED)
seen = 0


class Total:
    """The number of steps: EL_STEPS, or what EL_STOP_FILE says once it exists (far
    enough ahead that every member reads it before it gets there)."""

    def __init__(self) -> None:
        self.value = STEPS

    def __le__(self, step: int) -> bool:
        if STOP and os.path.exists(STOP):
            with open(STOP) as f:
                text = f.read().strip()
            if text:
                self.value = int(text)
        return self.value <= step

    def __index__(self) -> int:
        return self.value


total = Total()
try:
    for _ in mgr.steps(total):
        for e in mgr.events[seen:]:
            out("ROUND", **vars(e))
        seen = len(mgr.events)
        idx = sampler.indices()
        x, y = data[idx], target[idx]
        g = (x * (x @ w - y)[:, None]).mean(0) if len(idx) else np.zeros(32)
        time.sleep(SLEEP)
        if KILL_DIR and os.path.exists(os.path.join(KILL_DIR, str(os.getpid()))):
            os.kill(os.getpid(), signal.SIGKILL)  # the others are in the all_reduce, waiting
        mgr.average([g])
        ok = mgr.should_commit()
        if ok:
            m[:] = 0.9 * m + g
            w[:] -= 0.05 * m
        loss = float(((data @ w - target) ** 2).mean()) if mgr.rank == 0 else None
        out("STEP", step=mgr.step, ok=ok, round=mgr.round, rank=mgr.rank, size=mgr.size,
            t=time.time(), loss=loss)  # fmt: skip
    for e in mgr.events[seen:]:
        out("ROUND", **vars(e))
    digest = hashlib.sha256(w.tobytes() + m.tobytes()).hexdigest()
    out("DONE", step=mgr.step, digest=digest, samples=mgr.samples, rank=mgr.rank)
finally:
    mgr.close()
sys.exit(0)
