"""`pycollective timeline`: merge the per-rank files of PYCOLLECTIVE_TIMELINE, and sum them up.

    pycollective timeline merge trace.json          # trace.rank*.json -> trace.json
    pycollective timeline merge -o all.json a.json b.json
    pycollective timeline summary trace.json        # per rank and operation: calls, time, wait

The merged file is a Chrome trace (open it in ui.perfetto.dev or chrome://tracing).
Recording is described in observe/timeline.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import _files
from ..observe import timeline as _timeline

HELP = "merge PYCOLLECTIVE_TIMELINE's per-rank files into one Chrome trace, or summarize one"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    m = sub.add_parser("merge", help="merge per-rank files into one Chrome trace")
    m.add_argument(
        "files",
        nargs="+",
        help="the PYCOLLECTIVE_TIMELINE value (its rank files are found), or rank files",
    )
    m.add_argument("-o", "--output", help="merged file (default: the PYCOLLECTIVE_TIMELINE name)")
    s = sub.add_parser("summary", help="per rank and operation: calls, time, time waiting")
    s.add_argument("file", help="a merged trace or one rank's file")


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "merge":
            if len(args.files) == 1 and not _is_rank_file(args.files[0]):
                template = args.files[0]
                out = _timeline.write_merged(template, args.output)
                if out is None:
                    print(
                        f"pycollective timeline: no rank files for {template} "
                        f"(looked for {_timeline.rank_path(template, 0)} ...)",
                        file=sys.stderr,
                    )
                    return 1
            else:
                if not args.output:
                    print(
                        "pycollective timeline merge: -o OUT is needed with several files",
                        file=sys.stderr,
                    )
                    return 2
                out = args.output
                data = _timeline.merge(args.files)
                with _files.replacing(out) as f:  # 0600; a link planted there is replaced
                    json.dump(data, f)
            print(f"wrote {out}")
            return 0
        if args.action == "summary":
            with open(args.file, encoding="utf-8") as f:
                print("\n".join(_timeline.summarize(json.load(f))))
            return 0
    except (OSError, ValueError, KeyError) as exc:
        print(f"pycollective timeline: {exc}", file=sys.stderr)
        return 1
    print("pycollective timeline: choose an action: merge or summary", file=sys.stderr)
    return 2


def _is_rank_file(path: str) -> bool:
    """A file that exists and is one rank's timeline (not a template to expand)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f).get("otherData", {})
    except (OSError, ValueError):
        return False
    return meta.get("format") == _timeline.FORMAT and "rank" in meta
