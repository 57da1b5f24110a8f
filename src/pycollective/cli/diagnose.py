"""`pycollective diagnose DIR`: merge the flight-recorder dumps of a job and say which rank
is behind, and at which call (the analysis is observe/diagnose.py)."""

from __future__ import annotations

import argparse
import json
import sys

from ..observe.diagnose import analyze, load

HELP = "merge flight-recorder dumps and say which rank is behind, and where"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="DIR", help="dump directories or files")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--all-jobs", action="store_true", help="report every job found, not just the latest"
    )


def main(args: argparse.Namespace) -> int:
    """The `diagnose` subcommand: 0 when dumps were found and analyzed, 1 when none."""
    dumps = load(args.paths)
    if not dumps:
        print(f"pycollective diagnose: no flight-recorder dumps in {args.paths}", file=sys.stderr)
        return 1
    report = analyze(dumps)
    if not args.all_jobs:
        first = next(iter(report))
        report = {first: report[first]}
    if args.json:
        print(json.dumps({j: [f.__dict__ for f in fs] for j, fs in report.items()}, indent=1))
        return 0
    for job, findings in report.items():
        ranks = sorted({int(d["rank"]) for d in dumps if str(d.get("job")) == job})
        print(f"job {job}: dumps from rank(s) {ranks}")
        for f in findings:
            print(f"  - {f.text}")
    return 0
