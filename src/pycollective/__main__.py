"""The `pycollective` command line (also `python -m pycollective`).

Subcommands live in their own modules and are imported only when chosen, so one with
heavy or missing dependencies cannot break the others. A subcommand module provides

    add_arguments(parser: argparse.ArgumentParser) -> None
    main(args: argparse.Namespace) -> int

and is registered with one line in SUBCOMMANDS below.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("pycollective.cli.run", "start N ranks of a program with the torchrun environment"),
    "bench": ("pycollective.cli.bench", "time collectives x sizes x algorithms x transports"),
    "calibrate": (
        "pycollective.cli.calibrate",
        "measure this host's cost-model parameters for `auto` and cache them",
    ),
    "diagnose": (
        "pycollective.cli.diagnose",
        "merge flight-recorder dumps and say which rank is behind, and where",
    ),
    "timeline": (
        "pycollective.cli.timeline",
        "merge PYCOLLECTIVE_TIMELINE's per-rank files into one Chrome trace, or sum one up",
    ),
    "simulate": (
        "pycollective.cli.simulate",
        "predict collective times at any scale from the cost model (no network)",
    ),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only the `chosen` subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog="pycollective", description="Collective communication for Python."
    )
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_handler=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(args_list)
    handler = getattr(args, "_handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
