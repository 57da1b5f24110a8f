"""pycollective's own API called with torch tensors (no buffer protocol): a repeated
synchronous call takes the group's compiled path through the tensor's view, as a numpy
array's does, and a tensor changed since is reduced right or refused, never run on a
stale view (the worker's docstring)."""

from __future__ import annotations

import os

import pytest
from tests._launch import REPO, describe, run_ranks, tagged

from pycollective.shm import arena

pytest.importorskip("torch")

WORKER = REPO / "tests" / "api" / "_tensor_worker.py"
REPEATS = 20  # the worker's


@pytest.mark.timeout(90)
def test_repeated_tensor_calls_run_compiled_and_changed_tensors_right() -> None:
    results = run_ranks(WORKER, 2, env={"PYCOLLECTIVE_TRANSPORT": "shm"}, timeout=80)
    for r in results:
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), describe(r)
    compiled = arena.available() and os.environ.get("PYCOLLECTIVE_NATIVE", "1") != "0"
    for r in results:
        ((before, after),) = tagged(r, "FAST")
        ((before_others, after_others),) = tagged(r, "FAST_OTHERS")
        if compiled:  # every repeated all_reduce and broadcast of a tensor ran compiled
            assert after - before == 2 * REPEATS, describe(r)
            # and every repeated reduce, all_gather_into_tensor and reduce_scatter_tensor
            assert after_others - before_others == 3 * REPEATS, describe(r)
        else:
            assert before is None and after is None, describe(r)
            assert before_others is None and after_others is None, describe(r)
