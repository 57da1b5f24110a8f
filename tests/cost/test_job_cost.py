"""How a job agrees on its cost parameters and CPU share (a dict stands in for the store),
the fit behind calibration, and the bench's auto-against-best lines. No ranks, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pycollective._errors import UsageError
from pycollective.cli import bench
from pycollective.cli.calibrate import default_sizes
from pycollective.schedule import ALGORITHMS
from pycollective.schedule.cost import CostParams
from pycollective.tuning import cache as _costcache
from pycollective.tuning import fit as _costfit
from pycollective.tuning import params as _tuning
from pycollective.tuning.calibrate import fit_samples

TRUE = CostParams(
    alpha=150e-6, beta=0.8e-9, gamma=0.15e-9, overhead=80e-6,
    msg_cpu=120e-6, byte_cpu=1.2e-9, call_cpu=700e-6,
)  # fmt: skip


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.data[key]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", "off")
    for name in ("PYCOLLECTIVE_COST_TCP", "PYCOLLECTIVE_CALIBRATE", "PYCOLLECTIVE_CORES"):
        monkeypatch.delenv(name, raising=False)
    _tuning.reload()
    yield
    _tuning.reload()


def test_every_rank_takes_rank_zeros_parameters(monkeypatch) -> None:
    store = DictStore()
    monkeypatch.setenv("PYCOLLECTIVE_COST_TCP", "1e-4,1e-9,1e-10")
    monkeypatch.setenv("PYCOLLECTIVE_CORES", "2")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "8"), ("LOCAL_WORLD_SIZE", "8")):
        monkeypatch.setenv(name, value)
    zero = _tuning.agree(0, 8, store, "job/cost", 1.0)
    # another host: other parameters, other cores; it still prices with rank 0's
    monkeypatch.setenv("PYCOLLECTIVE_COST_TCP", "9e-4,9e-9,9e-10")
    monkeypatch.setenv("PYCOLLECTIVE_CORES", "64")
    _tuning.reload()
    other = _tuning.agree(3, 8, store, "job/cost", 1.0)
    assert other == zero
    tuning = _tuning.Tuning(other)  # what that rank's World prices with
    assert tuning.params("tcp").alpha == 1e-4
    assert tuning.group_params("tcp", 8).ranks_per_core == 4.0  # 8 ranks, 2 cores
    assert tuning.group_params("tcp", 2).ranks_per_core == 1.0
    assert tuning.group_params("tcp", 3).ranks_per_core == 1.5


def test_job_cost_json_round_trip() -> None:
    job = _tuning.JobCost({"tcp": TRUE}, local=4, cores=2, calibrate=True)
    assert _tuning.JobCost.from_json(job.to_json()) == job
    assert job.for_group("tcp", 4) == replace(TRUE, ranks_per_core=2.0)


def test_cores_override(monkeypatch) -> None:
    monkeypatch.setenv("PYCOLLECTIVE_CORES", "3")
    assert _tuning.cores() == 3
    monkeypatch.setenv("PYCOLLECTIVE_CORES", "zero")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_CORES"):
        _tuning.cores()


def test_calibrate_at_init_modes(monkeypatch, tmp_path) -> None:
    assert not _tuning.local_job_cost(2).calibrate
    monkeypatch.setenv("PYCOLLECTIVE_CALIBRATE", "1")
    assert _tuning.local_job_cost(2).calibrate
    monkeypatch.setenv("PYCOLLECTIVE_CALIBRATE", "missing")
    assert not _tuning.local_job_cost(2).calibrate  # the cache is off: nothing to fill
    monkeypatch.setenv("PYCOLLECTIVE_COST_CACHE", str(tmp_path))
    assert _tuning.local_job_cost(2).calibrate
    _costcache.save("tcp", TRUE)
    assert not _tuning.local_job_cost(2).calibrate
    monkeypatch.setenv("PYCOLLECTIVE_CALIBRATE", "sometimes")
    with pytest.raises(UsageError, match="PYCOLLECTIVE_CALIBRATE='sometimes'.*1 \\| 0 \\| missing"):
        _tuning.local_job_cost(2)


def _samples(params: CostParams, p: int, k: float, counts) -> list[_costfit.Sample]:
    out = []
    for count in counts:
        for algo in ALGORITHMS["all_reduce"]:
            s = _costfit.Sample("all_reduce", algo, p, count, 4, 1.0, k, 0, p)
            t = _costfit.predicted(s, params) + 300e-6  # plus what every call pays alike
            out.append(replace(s, seconds=t))
    return out


def test_fit_recovers_the_cpu_side() -> None:
    samples = _samples(TRUE, 4, 2.0, (4, 65536, 262144))
    start = replace(TRUE, msg_cpu=1e-6, byte_cpu=1e-12, call_cpu=1e-6)
    got = fit_samples(samples, replace(start, ranks_per_core=2.0), 4, oversubscribed=True)
    for name in ("msg_cpu", "byte_cpu"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    # CPU-bound, what every call pays alike is CPU too: 300 us over 2 ranks per core
    assert got.call_cpu == pytest.approx(TRUE.call_cpu + 300e-6 / 2, rel=0.05)


def test_fit_recovers_alpha_and_beta() -> None:
    samples = _samples(TRUE, 2, 1.0, (2,))
    for count in (262144, 2097152):
        s = _costfit.Sample("broadcast", "tree", 2, count, 4, 1.0, 1.0, 65536, 2)
        samples.append(replace(s, seconds=_costfit.predicted(s, TRUE) + 300e-6))
    start = replace(TRUE, alpha=1e-6, beta=1e-12)
    got = fit_samples(samples, start, 2, oversubscribed=False)
    assert got.alpha == pytest.approx(TRUE.alpha, rel=0.05)
    assert got.beta == pytest.approx(TRUE.beta, rel=0.05)


def test_unresolved_parameters_keep_their_values() -> None:
    # Every algorithm equally fast: nothing tells alpha apart from the per-call constant.
    flat = [replace(s, seconds=1e-3) for s in _samples(TRUE, 2, 1.0, (2,))]
    got = fit_samples(flat, TRUE, 2, oversubscribed=False)
    assert got.alpha == TRUE.alpha


def test_fit_needs_samples() -> None:
    with pytest.raises(ValueError, match="no samples"):
        _costfit.fit([], TRUE)
    with pytest.raises(ValueError, match="cannot fit"):
        _costfit.fit(_samples(TRUE, 2, 1.0, (2,)), TRUE, ["alpha", "bogus"])


def test_default_sizes() -> None:
    assert default_sizes(1) == [2, 3]
    assert default_sizes(2) == [2, 4]
    assert default_sizes(16) == [4]


def test_bench_auto_against_best() -> None:
    def rec(algo: str, t: float, ran: str | None = None, nbytes: int = 1024) -> dict:
        r = {"transport": "tcp", "collective": "all_reduce", "algorithm": algo,
             "bytes": nbytes, "time_us": t}  # fmt: skip
        return r | ({"ran": ran} if ran else {})

    records = [
        rec("auto", 105.0, "ring"), rec("ring", 110.0), rec("tree", 100.0),
        rec("auto", 50.0, "tree", 4), rec("ring", 60.0, None, 4), rec("tree", 50.0, None, 4),
    ]  # fmt: skip
    lines = bench.auto_vs_best(records)
    assert any("auto chose ring, best was tree, auto/best = 1.10x" in ln for ln in lines)
    assert any("auto chose tree, best was tree, auto/best = 1.00x" in ln for ln in lines)
    assert any("geometric mean 1.049x" in ln and "1/2 sizes" in ln for ln in lines)
    assert bench.auto_vs_best([rec("auto", 1.0, "ring"), rec("ring", 1.0)]) == []


def test_a_rank_pinned_to_one_core_counts_the_hosts_cores(monkeypatch) -> None:
    """mpirun binds each rank to a core of its own: the job is not one core for all."""
    monkeypatch.delenv("PYCOLLECTIVE_CORES", raising=False)
    monkeypatch.setattr(_tuning.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(_tuning.os, "cpu_count", lambda: 8)
    assert _tuning.cores() == 8
    monkeypatch.setattr(_tuning.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert _tuning.cores() == 3  # a wider set is taken as given (taskset, cgroups)
