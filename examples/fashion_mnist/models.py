"""The Fashion-MNIST CNN of "Distributed Machine Learning Patterns" and a larger variant.

small: Conv32-pool-Conv64-pool-Conv64-Dense64-Dense10, 93,322 parameters (0.37 MB).
large: the same convolutions with 'same' padding and a 2,368-unit dense layer, 7,507,850
parameters (30.0 MB): the model size where communication, not compute, sets the pace.
No dropout, so runs are deterministic and comparable across modes.
"""

from __future__ import annotations

from torch import nn


def small() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),      # 26 -> 13
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),     # 11 -> 5
        nn.Conv2d(64, 64, 3), nn.ReLU(), nn.Flatten(),        # 3 x 3 x 64
        nn.Linear(576, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def large() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 28 -> 14
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 7
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Flatten(),     # 7 x 7 x 64
        nn.Linear(3136, 2368), nn.ReLU(), nn.Linear(2368, 10),
    )  # fmt: skip


MODELS = {"small": small, "large": large}


def build(name: str) -> nn.Sequential:
    try:
        return MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; one of {sorted(MODELS)}") from None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
