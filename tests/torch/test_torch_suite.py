"""torch's own backend test suite against the pycollective backend: a representative
subset here, both passes (as pycollective, and in gloo's place); `make torch-suite` runs
all of it at world sizes 2 and 3 (tests/torch/torch_suite.py, docs/torch_conformance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from tests._launch import REPO

HARNESS = REPO / "tests" / "torch" / "torch_suite.py"
sys.path.insert(0, str(HARNESS.parent))
try:
    import torch_suite
finally:
    sys.path.pop(0)


@pytest.mark.timeout(400)
def test_subset_passes_in_both_passes(tmp_path) -> None:
    out = tmp_path / "suite.json"
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--subset", "--world-size", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for mode, p in report["passes"].items():
        failed = [r for r in p["records"] if r["outcome"] == "failed"]
        assert not failed, f"{mode}: " + "\n\n".join(
            f"{r['test']}:\n{r.get('detail', '')[-2500:]}" for r in failed
        )
        excluded = {r["test"] for r in p["records"] if r["outcome"] == "excluded"}
        assert p["counts"]["passed"] + len(excluded) >= 45, p["counts"]
    assert proc.returncode == 0


def test_every_exclusion_and_subset_entry_names_a_real_test() -> None:
    import torch  # noqa: F401

    names = set(torch_suite.suite_test_names())
    for name in (*torch_suite.SUBSET, *torch_suite.EXCLUDED_AS_PYCOLLECTIVE,
                 *torch_suite.EXCLUDED_IN_GLOO_PLACE):  # fmt: skip
        assert name in names, f"{name} is not a test of torch's suite"
    assert len(torch_suite.SUBSET) >= 40


def _polls_then_waits() -> float:
    time.sleep(0.1)  # a poll
    time.sleep(0.25)  # a test's own wait
    return time.monotonic()


def test_only_the_harness_polls_are_shortened(monkeypatch) -> None:
    """The faster polls change a sleep of torch's poll interval (0.1 s) in the functions
    given, and nothing else: other sleeps, time.monotonic and the original stay as they are."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    fast = torch_suite._with_faster_polls(_polls_then_waits)
    assert fast.__name__ == "_polls_then_waits" and fast() > 0
    assert slept == [torch_suite._POLL_SECONDS, 0.25]
    _polls_then_waits()  # the original is unchanged
    assert slept[2:] == [0.1, 0.25]
