"""Entry point torch calls at `import torch` ("torch.backends" group).

A top-level module, not part of the pycollective package: importing a package module runs
pycollective/__init__.py first, outside any try, so a broken install of pycollective would
take `import torch` down with it. Here every failure becomes a warning and the backend is
simply not registered (`import pycollective.torch` shows the real error).

It is also cheap: every program that imports torch pays for it, most of them never use
pycollective. So it registers the "pycollective" backend name with a creator that imports
pycollective.torch (numpy kernels, ml_dtypes: most of a second) only when a group is made.
Under `pycollective run` (PYCOLLECTIVE_STORE_HOSTED=1) the job does use us: it imports
pycollective.torch at once, which also lets torch's env:// rendezvous through the
launcher's store.
"""

from __future__ import annotations

import datetime
import os
import sys
import warnings
from typing import Any

_NAME = "pycollective"


def _create_backend(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    """torch's creator for init_process_group("pycollective"): the real one, imported now."""
    from pycollective.torch import create_backend

    return create_backend(store, rank, size, timeout)


def load() -> None:
    try:
        if sys.modules.get("pycollective.torch") is not None:
            # Being imported right now (it imported torch, which called us): it registers
            # the backend itself when it finishes; importing it here would find it half-made.
            return
        if os.environ.get("PYCOLLECTIVE_STORE_HOSTED") == "1":
            from pycollective.torch import register

            register()
            return
        import torch.distributed as tdist

        if not tdist.is_available():
            return
        if _NAME.upper() not in tdist.Backend._plugins:
            tdist.Backend.register_backend(_NAME, _create_backend, devices=["cpu"])
    except Exception as exc:  # noqa: BLE001 - never take torch down with us
        warnings.warn(f"pycollective backend not registered: {exc!r}", stacklevel=2)
