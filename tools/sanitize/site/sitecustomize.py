"""Loaded at start-up by every Python process of a `make sanitize` run (this folder is on
PYTHONPATH, which the ranks the tests start inherit): `pycollective._native` is imported
from the sanitized build named by SANITIZE_NATIVE_EXTENSION, whichever copy of
pycollective the process imports (the editable install keeps its normal build in src/).

A process that loads the sanitized extension leaves an empty file `loaded.<pid>` in
SANITIZE_REPORT_DIR, so the driver (tools/sanitize/run.py) counts the processes the
sanitizer watched. A sanitized extension that fails to load ends the process at once:
pycollective would otherwise fall back to its Python arena and the run would check
nothing."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

NAME = "pycollective._native"
LOAD_FAILED = 98  # exit status of a process whose sanitized extension did not load


class _SanitizedLoader(importlib.machinery.ExtensionFileLoader):
    def create_module(self, spec):  # noqa: ANN001, ANN201 - importlib's loader protocol
        try:
            return super().create_module(spec)
        except BaseException as exc:  # noqa: BLE001 - any failure ends the process loudly
            sys.stderr.write(f"sanitize: {self.path} did not load: {exc!r}\n")
            sys.stderr.flush()
            os._exit(LOAD_FAILED)

    def exec_module(self, module) -> None:  # noqa: ANN001
        super().exec_module(module)
        reports = os.environ.get("SANITIZE_REPORT_DIR")
        if reports:
            open(os.path.join(reports, f"loaded.{os.getpid()}"), "w").close()


class _SanitizedFinder:
    """A meta-path finder for the one module name, ahead of the ordinary path search."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != NAME:
            return None
        loader = _SanitizedLoader(name, self.path)
        return importlib.util.spec_from_file_location(name, self.path, loader=loader)


def _install() -> None:
    path = os.environ.get("SANITIZE_NATIVE_EXTENSION")
    if not path:
        return
    if not os.path.isfile(path):
        sys.stderr.write(f"sanitize: SANITIZE_NATIVE_EXTENSION={path!r} is not a file\n")
        os._exit(LOAD_FAILED)
    sys.meta_path.insert(0, _SanitizedFinder(path))


_install()
