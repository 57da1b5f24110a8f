"""`make sanitize`'s import of the sanitized extension (tools/sanitize/site/
sitecustomize.py): a process with that folder on PYTHONPATH imports pycollective._native
from the file SANITIZE_NATIVE_EXTENSION names, whichever pycollective it imports, marks
that it did, and ends at once if that file does not load (rather than let pycollective
fall back to its Python arena and the sanitized run check nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests._launch import REPO

SITE = REPO / "tools" / "sanitize" / "site"
LOAD_FAILED = 98

pytestmark = pytest.mark.skipif(
    os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0", reason="PYCOLLECTIVE_NATIVE=0"
)

PROBE = (
    "import os, pycollective._native as n, pycollective.shm.native as s;"
    "print(n.__file__, s.enabled(), os.getpid())"
)


def _python(extension: Path, reports: Path, code: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO / "src")]),
        "SANITIZE_NATIVE_EXTENSION": str(extension),
        "SANITIZE_REPORT_DIR": str(reports),
    }
    env.pop("PYCOLLECTIVE_NATIVE", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_named_build_is_imported_and_marked(tmp_path) -> None:
    from pycollective import _native

    copy = tmp_path / "build" / Path(_native.__file__).name
    copy.parent.mkdir()
    shutil.copy(_native.__file__, copy)
    out = _python(copy, tmp_path, PROBE)
    assert out.returncode == 0, out.stderr
    path, enabled, pid = out.stdout.split()
    assert (path, enabled) == (str(copy), "True"), out.stdout
    assert [p.name for p in tmp_path.glob("loaded.*")] == [f"loaded.{pid}"]


def test_a_build_that_does_not_load_ends_the_process(tmp_path) -> None:
    bad = tmp_path / "_native.cpython-bad.so"
    bad.write_text("not a shared object\n")
    out = _python(bad, tmp_path, PROBE)
    assert out.returncode == LOAD_FAILED, (out.returncode, out.stdout, out.stderr)
    assert f"sanitize: {bad} did not load" in out.stderr
    assert not list(tmp_path.glob("loaded.*"))


def test_a_missing_build_ends_the_process(tmp_path) -> None:
    out = _python(tmp_path / "nowhere.so", tmp_path, "print('ran')")
    assert out.returncode == LOAD_FAILED and "ran" not in out.stdout
    assert "is not a file" in out.stderr
