"""SANS-IO schedules: every collective as data, built per rank by pure functions.

`build()` returns one rank's Schedule (see _steps for the vocabulary and the executor's
per-round order). `simulate` runs all ranks' schedules in memory; `cost` prices them.

Buffer conventions (element counts; n = count, p = size):

- all_reduce, broadcast, reduce: {"data": n}. reduce leaves non-root data unchanged.
- all_gather: {"input": n, "output": p*n}; output block i = rank i's input.
- reduce_scatter: {"input": p*n, "output": n}; input unchanged.
- gather: {"input": n, "output": p*n} on root, {"input": n} elsewhere.
- scatter: {"input": p*n, "output": n} on root, {"output": n} elsewhere.
- all_to_all: {"input": sum(send_counts), "output": sum(recv_counts)}.
- barrier: {} (zero-count messages on a zero-size scratch buffer).

Zero-count data messages are left out of schedules (both ends agree, since both derive
counts from the same arguments); round indices stay as they are.
"""

from __future__ import annotations

from . import cost, simulate
from ._registry import ALGORITHMS, ROOTED, build, build_all
from ._steps import Chunk, Copy, Recv, Round, Schedule, Send, Step

__all__ = [
    "ALGORITHMS",
    "ROOTED",
    "Chunk",
    "Copy",
    "Recv",
    "Round",
    "Schedule",
    "Send",
    "Step",
    "build",
    "build_all",
    "cost",
    "simulate",
]
