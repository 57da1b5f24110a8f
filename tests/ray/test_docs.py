"""docs/ray.md's two forms run as a user types them: the TorchTrainer job and the
ray.util.collective job, each a script of its own that starts its own local Ray cluster
(`ray.init()`), on loopback (the environment of these tests, not a change to the code)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!-- test: (ray-[a-z-]+) -->\n```python\n(.*?)```", re.S)
BLOCKS = dict(MARK.findall((REPO / "docs" / "ray.md").read_text()))

pytestmark = pytest.mark.timeout(420)


def run(name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / f"{name}.py"
    script.write_text(BLOCKS[name])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYCOLLECTIVE_"))}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               HOME=str(tmp_path))  # Ray's auth token goes to $HOME/.ray  # fmt: skip
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=400, env=env, cwd=tmp_path)  # fmt: skip


def test_both_forms_are_in_the_page():
    assert set(BLOCKS) == {"ray-train", "ray-collective"}


def test_the_torch_trainer_form(tmp_path):
    res = run("ray-train", tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "done None" in res.stdout, out[-6000:]
    ranks = sorted(set(re.findall(r"backend pycollective rank (\d) of 2", out)))
    assert ranks == ["0", "1"], out[-6000:]


def test_the_ray_util_collective_form(tmp_path):
    res = run("ray-collective", tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert res.stdout.count("[(3.0, 6.0), (3.0, 6.0)]") == 2, out[-6000:]
