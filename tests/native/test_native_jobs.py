"""The compiled arena in a real job against the Python one: the API battery (every arena
collective x dtype x op, the other collectives around them) with the arena forced, run
once compiled and once with PYCOLLECTIVE_NATIVE=0, must give the same bits on every rank.
One job each way instead of the whole suite twice."""

from __future__ import annotations

import os

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

from pycollective.shm import arena

BATTERY = REPO / "tests" / "api" / "battery.py"

pytestmark = [
    pytest.mark.skipif(not arena.available(), reason="no writable /dev/shm"),
    pytest.mark.skipif(
        os.environ.get("PYCOLLECTIVE_NATIVE", "1") == "0", reason="PYCOLLECTIVE_NATIVE=0"
    ),
]


def _digests(native: str) -> list[str]:
    results = run_ranks(
        BATTERY,
        3,
        args=("--quick", "--digest"),
        timeout=180,
        env={"PYCOLLECTIVE_TRANSPORT": "shm", "PYCOLLECTIVE_NATIVE": native},
    )
    assert_all_ok(results)
    out = []
    for r in results:
        lines = [x for x in r.stdout.splitlines() if x.startswith("digest ")]
        assert len(lines) == 1, r.stdout[-2000:]
        out.append(lines[0].split()[1])
    return out


@pytest.mark.timeout(400)
def test_battery_gives_the_same_bits_compiled_and_in_python() -> None:
    assert _digests("1") == _digests("0")
