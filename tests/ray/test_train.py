"""Ray Train's TorchTrainer on the pycollective backend (TorchConfig(backend="pycollective"),
no other change to the job), with both of Ray's init methods, against gloo: DDP's final
parameters equal bit for bit. Across two hosts in test_multihost_ray.py."""

from __future__ import annotations

import tempfile

import _train
import pytest
from ray import cloudpickle

cloudpickle.register_pickle_by_value(_train)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gloo_run(cluster):
    with tempfile.TemporaryDirectory() as storage:
        yield _train.fit("gloo", "env", steps=5, width=32, storage=storage)


@pytest.mark.parametrize("init_method", ["env", "tcp"])
def test_torch_trainer_on_pycollective_equals_gloo(cluster, gloo_run, init_method):
    with tempfile.TemporaryDirectory() as storage:
        ours = _train.fit("pycollective", init_method, steps=5, width=32, storage=storage)
    for mine, theirs in zip(ours, gloo_run, strict=True):
        assert mine["backend"] == "pycollective" and mine["group"] == "PycollectiveProcessGroup"
        assert theirs["backend"] == "gloo" and mine["world"] == theirs["world"] == 2
        assert mine["digest"] == theirs["digest"], (mine["first"], theirs["first"])
