"""`python -m fuzz TARGET [libFuzzer options and corpus folders]`: one target under atheris.

With PYCOLLECTIVE_FUZZ_NATIVE set to an instrumented build of pycollective._native
(`python -m fuzz.native`), that build is loaded instead of the installed one, so the
compiled core's branches guide the fuzzer too and AddressSanitizer checks its reads.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from . import TARGETS


def _load_native(path: str) -> None:
    """Put the instrumented extension in sys.modules before pycollective imports its own."""
    spec = importlib.util.spec_from_file_location("pycollective._native", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path} as pycollective._native")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycollective._native"] = module
    spec.loader.exec_module(module)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: python -m fuzz TARGET [libFuzzer args]; targets: {TARGETS}")
    import atheris  # the dev extra; imported here so that `check` functions need none

    name = argv[1]
    native = os.environ.get("PYCOLLECTIVE_FUZZ_NATIVE")
    if native:
        _load_native(native)
    with atheris.instrument_imports(include=["pycollective"]):
        target = importlib.import_module(f"fuzz.targets.{name}")
    atheris.Setup([f"fuzz-{name}", *argv[2:]], target.check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
