"""The shard plan of an elastic job: which samples each member uses at each step.

The job walks through one global order of the data (a permutation per epoch, from the
seed), a fixed global batch at a time; the position (samples consumed by committed steps)
is part of the state the Manager keeps and hands to members that fall behind or join. At
each step member i of n takes its slice of the next global batch (sizes differ by at most
one), and its gradient is weighted by its share of the batch, so a step computes the mean
over the same samples whatever the membership.

What happens to a lost member's samples: if the step in flight is committed (the gradient
all-reduce completed somewhere), its samples were used; if it is redone, the position has
not moved, and the survivors split the same global batch among themselves. Either way every
sample is used once per epoch: none is lost and none is used twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import UsageError


class ElasticSampler:
    """`indices()` is this member's part of the current step's global batch."""

    def __init__(
        self,
        manager: Any,
        dataset_size: int,
        global_batch: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if dataset_size < 1 or not 1 <= global_batch <= dataset_size:
            raise UsageError(
                f"need 1 <= global_batch <= dataset_size, got {global_batch}, {dataset_size}"
            )
        self.manager = manager
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, np.ndarray] = {}
        manager._sampler = self

    @property
    def epoch(self) -> float:
        """Epochs done, as a fraction (position / dataset size)."""
        return self.manager.samples / self.dataset_size

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size)
            else:
                order = np.arange(self.dataset_size)
            self._orders = {epoch: order, **{e: o for e, o in self._orders.items() if e > epoch}}
        return order

    def batch_indices(self) -> np.ndarray:
        """The whole global batch of the current step (every member computes the same)."""
        pos = self.manager.samples
        out = np.empty(self.global_batch, np.int64)
        filled = 0
        while filled < self.global_batch:
            epoch, offset = divmod(pos + filled, self.dataset_size)
            take = min(self.global_batch - filled, self.dataset_size - offset)
            out[filled : filled + take] = self._order(epoch)[offset : offset + take]
            filled += take
        return out

    def _bounds(self) -> tuple[int, int]:
        rank, size = max(self.manager.rank, 0), max(self.manager.size, 1)
        return self.global_batch * rank // size, self.global_batch * (rank + 1) // size

    def indices(self) -> np.ndarray:
        lo, hi = self._bounds()
        return self.batch_indices()[lo:hi]

    def share(self) -> float:
        """This member's fraction of the global batch (its gradient's weight)."""
        lo, hi = self._bounds()
        return (hi - lo) / self.global_batch


__all__ = ["ElasticSampler"]
