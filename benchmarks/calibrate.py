"""Measure the cost-model parameters of the TCP transport on this machine, without
touching the host's cache: `pycollective calibrate --no-save` (see cli/calibrate.py in the
package for what is measured and how).

    python benchmarks/calibrate.py [-n 2,4] [--json out.json] [--save]

--save writes the result to the host's cache, where `auto` reads it (the same as
`pycollective calibrate`). Compare the choices the numbers lead to against measured times
with benchmarks/algorithm_sweep.py --analyze SWEEP.json --params a,b,g,o,m,bc,c.
"""

from __future__ import annotations

import argparse
import sys

from pycollective.cli import calibrate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    calibrate.add_arguments(ap)
    ap.add_argument("--save", action="store_true", help="write the host's cache")
    args = ap.parse_args(argv)
    args.no_save = not args.save
    return calibrate.main(args)


if __name__ == "__main__":
    sys.exit(main())
