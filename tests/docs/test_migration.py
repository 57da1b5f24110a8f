"""The docs run as written: every snippet of docs/migration.md under the command shown
above it (in the suite's environment), and the README's quick start in a fresh virtualenv
(`pip install .` from a copy of the checkout, then `pycollective run`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tests._checkout import REPO, copy_checkout

MARK = re.compile(r"<!-- test: (.+?) -->\n```python\n(.*?)```", re.S)


def snippets(doc: Path) -> list[tuple[str, str, bool]]:
    """(command, code, needs torch) for every marked python block of `doc`."""
    found = []
    for cmd, code in MARK.findall(doc.read_text()):
        torch = cmd.endswith("(torch)")
        found.append((cmd.removesuffix("(torch)").strip(), code, torch))
    return found


MIGRATION = snippets(REPO / "docs" / "migration.md")


def run_snippet(cmd: str, code: str, where: Path):
    script = where / "snippet.py"
    script.write_text(code)
    argv = [part.replace("{script}", str(script)) for part in shlex.split(cmd)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLLECTIVE_")}
    argv = [sys.executable, "-m", *argv]  # `pycollective ...` of this environment
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=where)


def test_the_page_has_a_snippet_per_section():
    assert len(MIGRATION) == 4
    assert sum(torch for _, _, torch in MIGRATION) == 2


@pytest.mark.timeout(150)
@pytest.mark.parametrize("cmd, code, torch", MIGRATION, ids=lambda v: "")
def test_migration_snippet_runs_as_written(tmp_path, cmd, code, torch):
    if torch:
        pytest.importorskip("torch")
    res = run_snippet(cmd, code, tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    ranks = re.findall(r"^\[rank (\d)\]: rank \d", res.stdout, re.M)
    assert sorted(ranks) == ["0", "1"], res.stdout


def readme_quick_start() -> tuple[str, list[str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in shell.splitlines()]
    return code, [c for c in commands if c]


@pytest.mark.timeout(300)
def test_readme_quick_start_in_a_fresh_venv(tmp_path):
    """`pip install .` into a new virtualenv (the C extension left out with
    PYCOLLECTIVE_NATIVE=0, which only saves the compile), then the README's commands."""
    code, commands = readme_quick_start()
    assert commands == ["pip install .", "pycollective run -n 2 hello.py"], commands
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOLLECTIVE_", "VIRTUAL"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", PYCOLLECTIVE_NATIVE="0")
    env.pop("PYTHONPATH", None)
    (tmp_path / "hello.py").write_text(code)
    checkout = copy_checkout(tmp_path / "checkout")
    install = subprocess.run(
        [*shlex.split(commands[0]), "--quiet"],
        capture_output=True, text=True, timeout=240, env=env, cwd=checkout,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    res = subprocess.run(
        shlex.split(commands[1]), capture_output=True, text=True, timeout=60, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [
        "[rank 0]: rank 0 of 2: [1. 3. 5. 7.]",
        "[rank 1]: rank 1 of 2: [1. 3. 5. 7.]",
    ]
    where = subprocess.run(
        [str(bindir / "python"), "-c", "import pycollective; print(pycollective.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert str(env_dir) in where and str(REPO) not in where  # the installed copy
