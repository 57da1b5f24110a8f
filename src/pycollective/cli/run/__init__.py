"""`pycollective run`: start the ranks of a job on this node and watch over them.

Each rank gets torchrun's environment contract:

    RANK, WORLD_SIZE (= nprocs * nnodes), LOCAL_RANK, LOCAL_WORLD_SIZE,
    GROUP_RANK and NODE_RANK (= node rank), GROUP_WORLD_SIZE (= nnodes), ROLE_RANK,
    ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS=1 (unless set; as torchrun),

plus PYCOLLECTIVE_SECRET (the job's shared secret), PYCOLLECTIVE_STORE_HOSTED=1 (the
launcher of node 0 hosts the TCP store at MASTER_ADDR:MASTER_PORT, so ranks must connect
to it rather than start one) and PYTHONUNBUFFERED=1 (so output streams line by line).

Each rank runs in its own process group, with stdin from /dev/null, and its stdout and
stderr are forwarded line by line with a "[rank N]: " prefix. SIGINT/SIGTERM sent to the
launcher are forwarded to every rank. When a rank fails (non-zero status or a signal), the
others first get a notice window (`--notice`, 2 s) with no signal: ranks in a collective
learn of the loss through their connections and raise, print and exit on their own within
a fraction of a second. Then the ranks still running get SIGUSR1 (when they handle it: the
flight recorder dumps, so `diagnose` sees both sides), SIGTERM, and `--grace` seconds
before their process groups are SIGKILLed. The launcher then names the rank that failed
first, with the last line of its stderr (the traceback itself was forwarded once, as it
was written). `--max-restarts K` starts every rank again after a failure, up to K times,
as torchrun does; `--elastic MIN:MAX` lets the job go on without a lost rank
(pycollective.elastic) and starts replacements. Nothing the ranks started outlives the
launcher: every process group is killed at the end, and on Linux a rank also dies if the
launcher itself is killed.

The package, by concern: options.py (the arguments and their torchrun/mpirun spellings),
launch.py (one node's job: key, store, reports), restarts.py (starting the ranks, again
after a failure), supervisor.py (the first failure, the notice window, the signals),
ranks.py (the processes and their output).
"""

from __future__ import annotations

import argparse
import sys

from ..._errors import CollectiveError, UsageError
from .launch import launch
from .options import add_arguments, command_line, rank_environment, resolve_options
from .ranks import describe_exit

HELP = "start N ranks of a program with the torchrun environment"


def main(args: argparse.Namespace) -> int:
    """The `run` subcommand: parsed arguments in, exit status out."""
    try:
        return launch(**resolve_options(args))
    except UsageError as exc:
        print(f"pycollective run: {exc}", file=sys.stderr)
        return 2
    except (CollectiveError, OSError) as exc:  # e.g. the store port is taken
        print(f"pycollective run: {exc}", file=sys.stderr)
        return 1


__all__ = [
    "add_arguments",
    "command_line",
    "describe_exit",
    "launch",
    "main",
    "rank_environment",
    "resolve_options",
]
