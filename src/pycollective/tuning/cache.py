"""The per-host cache of calibrated cost parameters (written by `pycollective calibrate`).

One JSON file per (host, transport, library version) under $XDG_CACHE_HOME/pycollective
(~/.cache/pycollective without it). PYCOLLECTIVE_COST_CACHE names another directory, or
turns the cache off with "off" (also "0", "none", "false"). Reading never fails a job: a
missing file means "use the defaults", a corrupt one is ignored with a warning. Writing
never fails one either: an unwritable directory gives a warning and nothing is saved.

The entries steer every job's choice of algorithm, so they are private like ssh's files:
the directory is made 0700 and written only if it is ours and private, an entry is
written 0600 by rename (a link planted at its name is replaced, not followed), and an
entry that is a link, another user's, or open to others is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import _files
from .._version import __version__
from ..schedule.cost import CostParams

ENV = "PYCOLLECTIVE_COST_CACHE"
_OFF = {"off", "0", "none", "false", "no"}
FORMAT = 1
MAX_ENTRY_BYTES = 1 << 20  # an entry is a few hundred bytes; a bigger file is not one
# What a cache entry holds: the transport's constants, not the job's ranks_per_core.
SAVED = ("alpha", "beta", "gamma", "overhead", "msg_cpu", "byte_cpu", "call_cpu")


def _version() -> str:
    return __version__


def host_key() -> str:
    """Who this host is, as far as its costs go: name, architecture and CPU count."""
    ident = f"{socket.gethostname()}|{platform.machine()}|{os.cpu_count()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def cache_dir() -> Path | None:
    """The directory of the cache, or None when it is turned off."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() in _OFF:
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pycollective"


def cache_path(transport: str) -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    return d / f"cost-{transport}-{host_key()}-v{_version()}.json"


def as_dict(params: CostParams) -> dict[str, float]:
    """The transport's constants of params (what a cache entry and the job agreement hold)."""
    return {k: v for k, v in asdict(params).items() if k in SAVED}


def load(transport: str) -> CostParams | None:
    """The cached parameters of this transport on this host, or None (no usable entry)."""
    path = cache_path(transport)
    if path is None:
        return None
    try:
        text = _files.read_private(path, MAX_ENTRY_BYTES).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except _files.UnsafePath as exc:
        warnings.warn(
            f"pycollective: ignoring the cost cache {exc} (another user could have written "
            "it); using the default cost parameters",
            stacklevel=2,
        )
        return None
    except OSError as exc:
        warnings.warn(f"pycollective: cannot read the cost cache {path}: {exc}", stacklevel=2)
        return None
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("transport") != transport:
            raise ValueError("written for another format or transport")
        raw = data["params"]
        return CostParams(**{k: float(raw[k]) for k in SAVED if k in raw})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        warnings.warn(
            f"pycollective: ignoring the corrupt cost cache {path} ({exc}); using the "
            "default cost parameters (run `pycollective calibrate` to rewrite it)",
            stacklevel=2,
        )
        return None


def save(transport: str, params: CostParams, details: dict[str, Any] | None = None) -> Path | None:
    """Write this transport's parameters for this host; the path, or None if not saved."""
    path = cache_path(transport)
    if path is None:
        return None
    saved = as_dict(params)
    data = {
        "format": FORMAT,
        "transport": transport,
        "version": _version(),
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": saved,
        "details": details or {},
    }
    try:
        _files.private_dir(path.parent)
        with _files.replacing(path) as f:  # a reader never sees half a file
            json.dump(data, f, indent=1)
    except (OSError, _files.UnsafePath) as exc:
        warnings.warn(
            f"pycollective: cannot write the cost cache {path} ({exc}); the parameters are "
            f"used by this job only (set {ENV} to another directory, or to 'off')",
            stacklevel=2,
        )
        return None
    return path
