"""Manager.average's layout: the buffers of one dtype packed into one flat buffer, so a
step's gradients are one all_reduce per dtype."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import UsageError


def flat_plan(layout: Sequence[tuple[Any, int, bool]]) -> list[tuple[np.ndarray, int, list]]:
    """Where each buffer of `layout` ((dtype, elements, C-contiguous?) each) goes in the
    flat buffer of its dtype: per dtype, in an order every member shares, (the flat buffer
    with one element more for a flag, the elements before it, [(buffer, offset, size)])."""
    if not all(contiguous for _, _, contiguous in layout):
        raise UsageError("average() needs C-contiguous buffers (it writes the mean back in place)")
    groups: dict[Any, list[int]] = {}
    for i, (dtype, _, _) in enumerate(layout):
        groups.setdefault(dtype, []).append(i)
    plan = []
    for dtype in sorted(groups, key=str):  # the same order on every member
        parts, at = [], 0
        for i in groups[dtype]:
            parts.append((i, at, layout[i][1]))
            at += layout[i][1]
        plan.append((np.empty(at + 1, dtype), at, parts))
    return plan
