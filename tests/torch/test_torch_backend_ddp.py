"""torch's own DistributedDataParallel on the "pycollective" backend, in real processes.

The worker is a plain torch script: it never imports pycollective (the backend comes from
the package's "torch.backends" entry point), so this is also the drop-in check. Each
launch runs several scenarios in one process group (plain DDP, fp16 and bf16 compression
hooks, no_sync gradient accumulation) to keep process start-ups few, and gloo's reference
runs in the same processes over a gloo group made beside the default one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache

import pytest
from tests._launch import REPO, assert_all_ok, run_ranks

import torch

WORKER = REPO / "tests" / "torch" / "ddp_worker.py"
OUT = REPO / "out" / "tests-torch-ddp"
SCENARIOS = {2: "plain,fp16,bf16,accum3", 3: "plain,accum3"}
STEPS = "20"

State = dict[str, torch.Tensor]


@cache
def _runs(n: int) -> dict[str, dict[str, list[State]]]:
    """Final parameters per backend ("pycollective": the default group's; "gloo": a gloo
    group's in the same processes), per scenario, per rank (cached: several tests read
    one run). One job, not one per backend: each rank is a torch start, seconds of CPU."""
    OUT.mkdir(parents=True, exist_ok=True)
    prefix = str(OUT / f"pycollective{n}.{os.getpid()}")
    args = ("pycollective", prefix, "--steps", STEPS, "--batch", "8",
            "--scenarios", SCENARIOS[n], "--reference", "gloo")  # fmt: skip
    assert_all_ok(run_ranks(WORKER, n, args, timeout=100))
    return {
        backend: {
            s: [torch.load(f"{path}.{s}.rank{r}.pt") for r in range(n)]
            for s in SCENARIOS[n].split(",")
        }
        for backend, path in (("pycollective", prefix), ("gloo", f"{prefix}.gloo"))
    }


def _run(backend: str, n: int) -> dict[str, list[State]]:
    return _runs(n)[backend]


def _max_diff(a: State, b: State) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _bitwise_equal(states: list[State]) -> None:
    for r, s in enumerate(states[1:], start=1):
        for k in s:
            assert torch.equal(s[k], states[0][k]), f"rank {r} differs from rank 0 in {k}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_every_scenario_ranks_agree_bitwise_and_match_gloo(n: int) -> None:
    ours, gloo = _run("pycollective", n), _run("gloo", n)
    for scenario, states in ours.items():
        _bitwise_equal(states)
        # Sums may be ordered differently from gloo's: equal up to float rounding.
        diff = _max_diff(states[0], gloo[scenario][0])
        assert diff < 1e-5, f"{scenario}: differs from gloo by {diff}"


@pytest.mark.timeout(180)  # the job (up to 100 s) if no test before ran it, then 60 s
def test_two_workers_batch_b_match_one_process_batch_2b(tmp_path) -> None:
    ddp = _run("pycollective", 2)["plain"][0]
    out = str(tmp_path / "single")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    subprocess.run(
        [sys.executable, str(WORKER), "none", out, "--steps", STEPS, "--batch", "16"],
        check=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip
    single = torch.load(f"{out}.plain.rank0.pt")
    assert _max_diff(ddp, single) < 1e-5
    # Training moved the parameters well beyond that tolerance: the check has teeth.
    sys.path.insert(0, str(WORKER.parent))
    try:
        import ddp_worker
    finally:
        sys.path.pop(0)
    assert _max_diff(single, ddp_worker.model().state_dict()) > 1e-2


@pytest.mark.timeout(120)  # the job (up to 100 s) if no test before ran it
def test_scenarios_really_differ() -> None:
    """The hooks and accumulation change the result, so each comparison tests its path."""
    ours = _run("pycollective", 2)
    assert _max_diff(ours["plain"][0], ours["fp16"][0]) > 0
    assert _max_diff(ours["plain"][0], ours["accum3"][0]) > 1e-3
