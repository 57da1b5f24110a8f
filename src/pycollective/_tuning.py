"""Measured cost-model parameters, per transport, and size constants.

alpha is the cost of one round in which a rank communicates (s), beta the time per byte on
the link (s/B), gamma the time per byte reduced (s/B), overhead the cost of each message
beyond the first that a rank sends (or receives) in one round (s). `auto` prices every
algorithm's schedule with these (schedule/cost.py) and runs the cheapest.

`PYCOLLECTIVE_COST_<TRANSPORT>` = "alpha,beta,gamma[,overhead]" (seconds, seconds per
byte) overrides them, e.g. for a real network: measure it with benchmarks/calibrate.py and
check the choices with benchmarks/algorithm_sweep.py. See docs/cost_model.md.
"""

from __future__ import annotations

import os
from functools import cache

from .schedule.cost import CostParams

CHAIN_SEGMENT_BYTES = 256 * 1024

_MEASURED = {
    # Measured 2026-11-30 on the development machine (2-core x86_64 VM, Python 3.11, TCP on
    # loopback, other jobs running: load average 3-5) with benchmarks/calibrate.py at 2 and
    # 4 ranks and checked against benchmarks/algorithm_sweep.py at 2, 3, 4 and 8 ranks
    # (results in benchmarks/results/, discussion in docs/cost_model.md).
    #   alpha    200 us: the effective cost of one more round of a collective, Python
    #            included (executor, exchange, selector loop, wake-ups), from tiny
    #            all_reduce by algorithms with 1..6 rounds; a fit of the model to the
    #            whole sweep gives 197 us. (Raw loopback TCP ping-pong in Python is
    #            17 us per message; our send/recv is ~280-340 us, see the doc.)
    #   beta     0.6 ns/B: one-way large messages (1.3-1.9 GB/s). A simultaneous exchange
    #            reaches only 0.85-1 GB/s each way on loopback (the CPU copies both
    #            directions), which the model's max(sent, received) cannot express.
    #   gamma    0.12 ns/B: np.add(a, b, out=a) on float32 beyond cache (8.5 GB/s).
    #   overhead 100 us: one rank exchanging with p-1 peers against one peer, per extra
    #            message (111 us at 4 ranks; noisy, up to 700 us under load; fit: 92 us).
    "tcp": CostParams(alpha=200e-6, beta=0.6e-9, gamma=0.12e-9, overhead=100e-6),
}


def _parse_override(name: str, text: str) -> CostParams:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (3, 4):
        raise ValueError(
            f"{name} must be 'alpha,beta,gamma' or 'alpha,beta,gamma,overhead' "
            f"(seconds, seconds per byte), got {text!r}"
        )
    return CostParams(*vals)


@cache
def cost_params(transport: str) -> CostParams:
    name = f"PYCOLLECTIVE_COST_{transport.upper()}"
    override = os.environ.get(name)
    if override:
        return _parse_override(name, override)
    return _MEASURED.get(transport, _MEASURED["tcp"])
