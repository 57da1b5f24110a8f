"""What a user installs: a real wheel (built without the C extension, in seconds), its
metadata and its py.typed; and the Makefile's torch pin beside the extra's range."""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from tests._checkout import REPO, copy_checkout

pytestmark = pytest.mark.timeout(120)


def build_wheel(into: Path, source: Path) -> Path:
    """The project's wheel, as pip builds it (PYCOLLECTIVE_NATIVE=0: no compiling)."""
    env = dict(os.environ, PYCOLLECTIVE_NATIVE="0")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(into), str(source)],
        check=True, env=env, capture_output=True, timeout=100,
    )  # fmt: skip
    (wheel,) = into.glob("pycollective-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = copy_checkout(tmp_path_factory.mktemp("checkout"))
    return build_wheel(tmp_path_factory.mktemp("wheel"), source)


def test_the_wheel_ships_py_typed_and_says_what_it_is(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(z.read(meta_name))
        (ep_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(ep_name).decode()
    assert "pycollective/py.typed" in names  # PEP 561: type checkers read our annotations
    assert "pycollective_autoload.py" in names
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert meta["License"] == "Apache-2.0"
    assert not [n for n in names if n.endswith((".c", ".h"))]  # C sources stay out (csrc/)
    assert any(c.startswith("Topic :: System :: Distributed Computing") for c in classifiers)
    extras = set(meta.get_all("Provides-Extra"))
    assert {"torch", "plot", "dev", "test", "ray"} <= extras
    requires = meta.get_all("Requires-Dist")
    torch_req = [r for r in requires if r.startswith("torch") and 'extra == "torch"' in r]
    spec = torch_req[0].split(";")[0] if torch_req else ""
    assert "==" not in spec and "<" in spec and ">=" in spec, torch_req
    assert any(r.startswith("matplotlib") and 'extra == "plot"' in r for r in requires)
    assert any(r.startswith("ray") and 'extra == "ray"' in r for r in requires)
    dev = {r.split(">")[0].split(";")[0] for r in requires if 'extra == "dev"' in r}
    assert {"ruff", "pytest"} <= dev
    assert not any(r.startswith("ruff") and 'extra == "test"' in r for r in requires)
    assert "pycollective = pycollective.__main__:main" in entry_points
    assert "pycollective = pycollective_autoload:load" in entry_points


def test_the_makefile_pins_the_cpu_torch_build():
    """The extra is a range for users; `make setup` must install exactly the pinned CPU
    build, or pip may take a newer (CUDA, several GB) one."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^TORCH_VERSION := 2\.13\.0$", makefile, re.M)
    installs = [line for line in makefile.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("'torch==$(TORCH_VERSION)'" in line for line in installs), installs
    # make test-ray's venv: Ray pinned too (tests/ray)
    assert re.search(r"^RAY_VERSION := 2\.60\.0$", makefile, re.M)
    assert any("'ray[train]==$(RAY_VERSION)'" in line for line in installs), installs


def test_the_sdist_ships_the_c_sources(tmp_path):
    """pip builds pycollective._native from an sdist's csrc/ (setup.py): every C source
    and header must be in it, or installs from the sdist lose the extension."""
    source = copy_checkout(tmp_path / "checkout")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
        cwd=source, check=True, capture_output=True, timeout=100,
    )  # fmt: skip
    (sdist,) = (tmp_path / "dist").glob("pycollective-*.tar.gz")
    with tarfile.open(sdist) as t:
        shipped = {Path(n).relative_to(Path(n).parts[0]).as_posix() for n in t.getnames()}
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "csrc").glob("*.[ch]")}
    assert sources and sources <= shipped, sorted(sources - shipped)
