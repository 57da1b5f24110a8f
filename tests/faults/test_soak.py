"""A short soak (the 100,000-call one is in `make faults`): many small and some large
all_reduces leave resident memory, file descriptors and threads where they were."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from tests._launch import REPO


@pytest.mark.timeout(120)
def test_short_soak_keeps_memory_fds_and_threads_flat() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pycollective", "run", "-n", "2", sys.executable,
         str(REPO / "tests" / "faults" / "_soak_worker.py"), "4000", "40"],
        cwd=REPO, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads(m[1]) for m in re.finditer(r"SOAK (\{.*\})", proc.stdout)]
    assert len(ranks) == 2, proc.stdout
    for r in ranks:
        assert r["rss_growth_pct"] < 5.0, r
        assert r["after"]["fds"] <= r["before"]["fds"], r
        assert r["after"]["threads"] <= r["before"]["threads"], r
