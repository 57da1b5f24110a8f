"""Sizes in bytes, read and written the same way by every command (bench, simulate, the
timeline).

One rule, binary, as nccl-tests reads its -b/-e and as our output writes them: K, KB and
KiB all mean 1024 bytes; M, MB, MiB 1024**2; G, GB, GiB 1024**3; T, TB, TiB 1024**4. The
unit is case-insensitive and may follow a space ("64 MiB", "4k", "1.5MB" = 1,572,864); the
value must come to a whole number of bytes. Output uses the IEC names (KiB, MiB, GiB),
which no reader can take for powers of ten.
"""

from __future__ import annotations

import argparse
import re

from ._errors import UsageError

_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(?:([kmgt])(?:i?b)?|b)?", re.I)
_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def parse_size(text: str) -> int:
    """'4096', '64K', '64KB', '64KiB', '256 MiB', '1G' -> bytes (binary units, above).
    Raises UsageError (a ValueError) saying what is accepted."""
    m = _SIZE.fullmatch(str(text).strip())
    if not m:
        raise UsageError(f"not a size: {text!r} (examples: 4096, 64K, 64KiB, 256MB, 1GiB)")
    value = float(m.group(1)) * _SCALE[(m.group(2) or "").lower()]
    if value != int(value):
        raise UsageError(f"not a whole number of bytes: {text!r}")
    return int(value)


def size_arg(text: str) -> int:
    """parse_size for argparse's type=: its message, not argparse's generic one."""
    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def human_bytes(nbytes: float) -> str:
    """1048576 -> '1 MiB', 1536 -> '1.5 KiB', 12 -> '12 B'."""
    for unit, scale in _UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{int(nbytes)} B"


__all__ = ["human_bytes", "parse_size", "size_arg"]
