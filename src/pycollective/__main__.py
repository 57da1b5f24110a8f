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

from ._version import __version__

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


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default, unless its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" not in text
            and default not in (None, False, True, argparse.SUPPRESS)
            and action.option_strings
        ):
            text += f" (default {default})"
        return text


def _subcommand_parser(name: str, prog: str = "pycollective") -> argparse.ArgumentParser:
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    p = argparse.ArgumentParser(
        prog=f"{prog} {name}", description=help_text, formatter_class=_HelpFormatter
    )
    module.add_arguments(p)
    p.set_defaults(_handler=module.main)
    return p


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser (the list of subcommands, --version); `chosen`, if given, is
    the one subcommand whose module is imported and whose options are added."""
    parser = argparse.ArgumentParser(
        prog="pycollective", description="Collective communication for Python."
    )
    parser.add_argument("--version", action="version", version=f"pycollective {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=_HelpFormatter
        )
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_handler=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in SUBCOMMANDS:
        # The subcommand's own parser reads everything after its name, so that its errors
        # (an unknown option, a bad value) come with its usage line, not the top level's.
        args = _subcommand_parser(args_list[0]).parse_args(args_list[1:])
    else:
        parser = build_parser()
        args = parser.parse_args(args_list)
        if getattr(args, "_handler", None) is None:
            parser.print_help(sys.stderr)
            return 2
    return int(args._handler(args))


if __name__ == "__main__":
    sys.exit(main())
