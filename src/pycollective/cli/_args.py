"""Argument types the subcommands share."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A finite, non-negative number of seconds (argparse type): NaN and infinity would
    slip past every `< 0` check and turn a timeout or grace period into nonsense."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a finite number of seconds >= 0 is needed")
    return value
