"""torch integration: a DDP script needs a few lines, not a rewrite.

    manager = elastic.Manager(state_dict=..., load_state_dict=...)
    model = elastic.DataParallel(manager, model)          # instead of DistributedDataParallel
    optimizer = elastic.Optimizer(manager, optimizer)     # skips the update of a failed step
    for step in manager.steps(total_steps):
        ...forward, loss.backward()...
        optimizer.step()

DDP's own communication is bound to one process group for its life; a group that changes
membership needs its averaging redone on each new group, so DataParallel does the
averaging itself, through the manager: at `optimizer.step()`, one flat all_reduce per
dtype of the module's gradients, each member weighted by its share of the step's samples
(so the average is over the samples that were used, whatever the membership). It does not
overlap with backward, as DDP's buckets do; for the models this is meant for, the
all_reduce is a small part of the step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ._manager import Manager


class DataParallel(nn.Module):
    """Wraps `module` like DistributedDataParallel: forward is the module's, `.module` is
    the module, and state_dict()/load_state_dict() are the module's own (so checkpoints
    read the same with or without the wrapper). Its parameters' gradients are averaged
    over the manager's members when the elastic Optimizer steps."""

    def __init__(self, manager: Manager, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self._manager = manager

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; average at the step outside the block (DDP's)."""
        yield

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


class Optimizer:
    """Wraps a torch optimizer: step() averages its parameters' gradients over the members
    (a missing gradient counts as zeros) and applies the update only if the manager says
    the step can commit; everything else is the wrapped optimizer's."""

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer) -> None:
        self.manager = manager
        self.optimizer = optimizer

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> bool:
        """Average, then update if the step commits. Returns whether it committed."""
        grads = []
        for p in self._params():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.detach())
        self.manager.average(grads)
        if self.manager.should_commit():
            self.optimizer.step(closure)
            return True
        return False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)


__all__ = ["DataParallel", "Optimizer"]
