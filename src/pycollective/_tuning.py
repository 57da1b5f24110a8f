"""Measured cost-model parameters, per transport, and size constants.

alpha is the latency of one message (s), beta the time per byte on the link (s/B), gamma
the time per byte reduced (s/B). The values below were measured on the development machine
(2-core x86_64, loopback TCP) with `benchmarks/calibrate.py`; `PYCOLLECTIVE_COST_<TRANSPORT>`
("alpha,beta,gamma") overrides them, e.g. for a real network.
"""

from __future__ import annotations

import os
from functools import cache

from .schedule.cost import CostParams

CHAIN_SEGMENT_BYTES = 256 * 1024

_MEASURED = {
    # alpha s, beta s/B, gamma s/B
    "tcp": CostParams(alpha=60e-6, beta=1 / 1.6e9, gamma=1 / 4.0e9),
}


@cache
def cost_params(transport: str) -> CostParams:
    override = os.environ.get(f"PYCOLLECTIVE_COST_{transport.upper()}")
    if override:
        alpha, beta, gamma = (float(x) for x in override.split(","))
        return CostParams(alpha=alpha, beta=beta, gamma=gamma)
    return _MEASURED.get(transport, _MEASURED["tcp"])
