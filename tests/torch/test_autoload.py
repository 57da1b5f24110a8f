"""torch's import-time hook must never take `import torch` down with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pycollective_autoload


def test_a_failing_import_becomes_a_warning(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pycollective.torch", None)  # import raises ImportError
    with pytest.warns(UserWarning, match="pycollective backend not registered"):
        pycollective_autoload.load()


def test_import_torch_survives_a_broken_package(tmp_path) -> None:
    """Even when pycollective/__init__.py itself raises, which the hook module does not
    import until it is inside its try."""
    fake = tmp_path / "pycollective"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    code = "import torch; print('survived', torch.__version__)"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "survived" in out.stdout
    assert "broken install" in out.stderr  # the warning says why the backend is missing
