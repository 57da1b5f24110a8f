"""Entry point torch calls at `import torch` ("torch.backends" group).

A top-level module, not part of the pycollective package: importing a package module runs
pycollective/__init__.py first, outside any try, so a broken install of pycollective would
take `import torch` down with it. Here every failure becomes a warning and the backend is
simply not registered (`import pycollective.torch` shows the real error).
"""

from __future__ import annotations

import sys
import warnings


def load() -> None:
    if sys.modules.get("pycollective.torch") is not None:
        # `import pycollective.torch` is what imported torch: it registers the backend
        # itself once its own import finishes (importing it here would find it half done).
        return
    try:
        from pycollective.torch import register

        register()
    except Exception as exc:  # noqa: BLE001 - never take torch down with us
        warnings.warn(f"pycollective backend not registered: {exc!r}", stacklevel=2)
