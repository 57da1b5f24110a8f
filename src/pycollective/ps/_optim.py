"""Optimizers the servers run on their slice of the parameters (numpy, float32).

They follow torch.optim's single-tensor formulas step for step (SGD with momentum,
dampening, weight decay and Nesterov; Adam with bias correction), so a parameter-server
run and an all-reduce run with the torch optimizer agree to float rounding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._errors import UsageError


class SGD:
    def __init__(
        self,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        self.lr, self.momentum, self.dampening = lr, momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov
        self._buf: np.ndarray | None = None

    def step(self, param: np.ndarray, grad: np.ndarray) -> None:
        if self.weight_decay:
            grad = grad + np.float32(self.weight_decay) * param
        if self.momentum:
            if self._buf is None:
                self._buf = grad.copy()
            else:
                self._buf *= np.float32(self.momentum)
                self._buf += np.float32(1 - self.dampening) * grad
            grad = grad + np.float32(self.momentum) * self._buf if self.nesterov else self._buf
        param -= np.float32(self.lr) * grad


class Adam:
    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self._m: np.ndarray | None = None
        self._v: np.ndarray | None = None
        self._t = 0

    def step(self, param: np.ndarray, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        if self.weight_decay:
            grad = grad + np.float32(self.weight_decay) * param
        if self._m is None:
            self._m = np.zeros_like(param)
            self._v = np.zeros_like(param)
        assert self._v is not None
        self._t += 1
        self._m += (grad - self._m) * np.float32(1 - b1)  # torch's lerp_
        self._v *= np.float32(b2)
        self._v += np.float32(1 - b2) * grad * grad
        step_size = self.lr / (1 - b1**self._t)
        denom = np.sqrt(self._v) / np.float32(math.sqrt(1 - b2**self._t)) + np.float32(self.eps)
        param -= np.float32(step_size) * (self._m / denom)


def make_optimizer(spec: dict[str, Any]) -> SGD | Adam:
    """{"name": "sgd" | "adam", **keyword arguments} -> optimizer."""
    spec = dict(spec)
    name = str(spec.pop("name", "sgd")).lower()
    if name == "sgd":
        return SGD(**spec)
    if name == "adam":
        if "betas" in spec:
            spec["betas"] = tuple(spec["betas"])
        return Adam(**spec)
    raise UsageError(f"unknown server optimizer {name!r}; use 'sgd' or 'adam'")
