"""Every torch.distributed operation on the "pycollective" backend (3 ranks: an odd size,
so roots, rings and uneven splits are not all symmetric)."""

from __future__ import annotations

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

WORKER = REPO / "tests" / "torch" / "ops_worker.py"


@pytest.mark.timeout(90)
def test_every_op_gives_torch_semantics() -> None:
    results = run_ranks(WORKER, 3, timeout=80)
    assert_all_ok(results)
    for res in results:
        assert res.stdout.strip().splitlines()[-1].startswith("ok "), res.stdout


@pytest.mark.timeout(60)
def test_import_registers_backend_without_touching_default_device_map() -> None:
    import torch.distributed as dist

    import pycollective.torch as pt

    pt.register()  # idempotent
    assert "PYCOLLECTIVE" in dist.Backend._plugins
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # gloo stays the default
