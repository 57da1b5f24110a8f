"""torch's import-time hook: it must never take `import torch` down with it, and it must
cost a program that never uses pycollective nearly nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import pycollective_autoload

pytestmark = pytest.mark.timeout(120)


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOLLECTIVE_", "TORCH"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full, timeout=100,
    )  # fmt: skip


def test_a_failing_import_becomes_a_warning(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_STORE_HOSTED", "1")  # under the launcher: eager import
    monkeypatch.setitem(sys.modules, "pycollective.torch", None)  # import raises ImportError
    with pytest.warns(UserWarning, match="pycollective backend not registered"):
        pycollective_autoload.load()


def test_import_torch_survives_a_broken_package(tmp_path) -> None:
    """Even when pycollective/__init__.py itself raises, which the hook module does not
    import until it is inside its try; outside the launcher it is not imported at all."""
    fake = tmp_path / "pycollective"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    code = "import torch; print('survived', torch.__version__)"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = python(code, **env)
    assert out.returncode == 0 and "survived" in out.stdout and out.stderr == "", out.stderr
    # (Under the launcher the hook imports the package at once; a failure there is a
    # warning: test_a_failing_import_becomes_a_warning.)


def test_import_torch_costs_nothing_until_a_group_is_made() -> None:
    """The behaviour behind `import torch` costing <= 50 ms more with pycollective
    installed: the hook (run here by hand after `import torch`, as torch runs it) imports
    neither pycollective nor ml_dtypes (most of a second) and takes far less than the
    bound; the backend still works: init_process_group("pycollective") imports the real
    creator then."""
    out = python(
        """
        import sys, time
        import torch
        import torch.distributed as td
        t0 = time.process_time()  # CPU time: what it costs, whatever the machine's load
        import pycollective_autoload
        pycollective_autoload.load()
        print("HOOK", time.process_time() - t0)
        print("LOADED", sorted(m for m in ("pycollective", "ml_dtypes") if m in sys.modules))
        print("REGISTERED", "PYCOLLECTIVE" in td.Backend._plugins)
        td.init_process_group("pycollective", store=td.HashStore(), rank=0, world_size=1)
        x = torch.ones(3)
        td.all_reduce(x)
        print("WORKS", x.tolist(), td.get_backend(), "pycollective.torch" in sys.modules)
        td.destroy_process_group()
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",  # the hook runs once, by hand, timed
    )
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout and "REGISTERED True" in out.stdout, out.stdout
    assert "WORKS [1.0, 1.0, 1.0] pycollective True" in out.stdout, out.stdout
    took = float(out.stdout.split("HOOK ")[1].split()[0])
    assert took < 0.05, f"the hook took {took * 1e3:.1f} ms"


def test_importing_pycollective_torch_first_prints_nothing() -> None:
    """`import pycollective.torch` imports torch, whose hook used to re-enter the half-made
    module and warn 'partially initialized module'."""
    out = python(
        """
        import pycollective.torch
        import torch.distributed as td
        print("REGISTERED", "PYCOLLECTIVE" in td.Backend._plugins)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "REGISTERED True" and out.stderr == "", out.stderr
