"""Entry point torch calls at `import torch` ("torch.backends" group).

It lives outside pycollective.torch so that even an import error in that package is
caught here: it must never break `import torch`. A failure becomes a warning and the
backend is simply not registered (import pycollective.torch to see the real error).
"""

from __future__ import annotations

import warnings


def load() -> None:
    try:
        from .torch import register

        register()
    except Exception as exc:  # noqa: BLE001 - never take torch down with us
        warnings.warn(f"pycollective backend not registered: {exc}", stacklevel=2)
