"""Which slice of the flat parameter vector each server owns.

Parameters are laid end to end in one float32 vector and cut into S contiguous slices
whose sizes differ by at most one element: balanced by size exactly, whatever the
tensors' shapes (one huge dense layer would unbalance a split by whole tensors).
"""

from __future__ import annotations

from .._errors import UsageError


def shard_bounds(total: int, servers: int) -> list[tuple[int, int]]:
    """[(start, stop)] for each server; the first total % servers get one element more."""
    if servers < 1 or total < 0:
        raise UsageError(f"cannot shard {total} elements over {servers} servers")
    base, extra = divmod(total, servers)
    bounds, start = [], 0
    for s in range(servers):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
