"""Which processes may share memory: a host identity that is more than the hostname.

Two processes can use one shared-memory segment only if they see the same /dev/shm and run
as the same user. Network namespaces share the hostname and often /dev/shm, yet jobs that
simulate several hosts with them must not take the shared-memory path, so the identity
also names the network namespace; the mount namespace decides which /dev/shm a process
sees, and the boot id tells apart machines that share a hostname.
"""

from __future__ import annotations

import hashlib
import os
import socket

from .. import _config


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _ns(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


def host_id() -> bytes:
    """16 bytes, equal for two processes exactly when they may share memory (as far as we
    can tell; PYCOLLECTIVE_HOST_ID replaces it, e.g. to keep ranks apart in tests)."""
    override = _config.get("PYCOLLECTIVE_HOST_ID")
    if override:
        text = "override|" + override
    else:
        parts = [
            socket.gethostname(),
            _read("/proc/sys/kernel/random/boot_id"),
            _ns("net"),
            _ns("mnt"),
            str(os.getuid() if hasattr(os, "getuid") else 0),
        ]
        text = "|".join(parts)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
