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
from pathlib import Path

from . import INSTRUMENT, TARGETS


def _load_native(path: str) -> None:
    """Put the instrumented extension in sys.modules before pycollective imports its own."""
    spec = importlib.util.spec_from_file_location("pycollective._native", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path} as pycollective._native")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pycollective._native"] = module
    spec.loader.exec_module(module)


def _modules_except(keep: tuple[str, ...]) -> list[str]:
    """Every module of pycollective (found on disk, nothing imported) outside `keep`:
    atheris's `include` takes whole top-level packages only, its `exclude` exact names."""
    spec = importlib.util.find_spec("pycollective")
    assert spec is not None and spec.submodule_search_locations  # noqa: S101
    root = Path(next(iter(spec.submodule_search_locations)))
    names = ["pycollective"]
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(("pycollective", *parts)))
    return [n for n in names if not any(n == k or n.startswith(k + ".") for k in keep)]


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: python -m fuzz TARGET [libFuzzer args]; targets: {TARGETS}")
    import atheris  # the dev extra; imported here so that `check` functions need none

    name = argv[1]
    native = os.environ.get("PYCOLLECTIVE_FUZZ_NATIVE")
    if native:
        _load_native(native)
    keep = INSTRUMENT[name]
    with atheris.instrument_imports(include=["pycollective"], exclude=_modules_except(keep)):
        target = importlib.import_module(f"fuzz.targets.{name}")
    if native:
        from pycollective.shm import native as shm_native

        if getattr(shm_native._native, "__file__", None) != native:
            raise SystemExit(f"pycollective runs {shm_native._native}, not {native}")
    atheris.Setup([f"fuzz-{name}", *argv[2:]], target.check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
