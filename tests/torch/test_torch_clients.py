"""torch's CPU clients on the pycollective backend, each compared with gloo in the same
process (tests/torch/clients_worker.py): FSDP2 (with a bf16 mixed-precision policy),
legacy FSDP, DTensor and tensor parallel, DCP cross-loading, pipelining, ZeRO, PowerSGD
(plain and batched), Join both ways, DDP + find_unused_parameters + Join, a sparse
embedding under DDP, functional collectives, batch_isend_irecv, every ProcessGroup call
form, torch's own callers of pg._get_backend(cpu) (cpu_backend); at 4 ranks a 2x2 mesh
(DTensor, FSDP2 x TP) and new_subgroups. Two launches in all: each torch import costs
seconds here."""

from __future__ import annotations

import pytest
from tests._launch import REPO, RankResult, describe, run_ranks, steps_of

WORKER = REPO / "tests" / "torch" / "clients_worker.py"
AT_2 = (
    "forms", "p2p", "lifetime", "join_both_ways", "ddp_unused_join", "powersgd", "sparse_ddp",
    "zero", "functional", "fsdp2", "fsdp1", "tensor_parallel", "pipelining", "dcp_cross",
    "cpu_backend",
)  # fmt: skip
AT_4 = ("mesh2d", "subgroups")
_runs: dict[int, list[RankResult]] = {}


def _run(n: int, tmp_path_factory) -> list[RankResult]:
    if n not in _runs:
        out = str(tmp_path_factory.mktemp(f"clients{n}"))
        _runs[n] = run_ranks(WORKER, n, (out, ",".join(AT_2 if n == 2 else AT_4)), timeout=240)
    return _runs[n]


def _check(results: list[RankResult], scenario: str) -> None:
    for r in results:
        step = steps_of(r).get(scenario)
        assert step is not None, f"{scenario} did not run: {describe(r)}"
        assert step["ok"], f"{scenario}: {step.get('trace')}\n{describe(r)}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", AT_2)
def test_client_matches_gloo_at_2_ranks(scenario: str, tmp_path_factory) -> None:
    _check(_run(2, tmp_path_factory), scenario)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", AT_4)
def test_client_matches_gloo_at_4_ranks(scenario: str, tmp_path_factory) -> None:
    _check(_run(4, tmp_path_factory), scenario)
