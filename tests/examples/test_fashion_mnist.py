"""examples/fashion_mnist: the IDX loader on small files the tests write (and corrupt), and
train.py end to end on a tiny synthetic dataset in every mode: one process (killed and
resumed from its checkpoint) and DDP with gradient accumulation compute the same
parameters."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tests._launch import REPO

EXAMPLE = REPO / "examples" / "fashion_mnist"
sys.path.insert(0, str(EXAMPLE))
import data  # noqa: E402

sys.path.remove(str(EXAMPLE))


def _write_dataset(d, n_train: int = 64, n_test: int = 32, compress: bool = False) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, n_train + n_test).astype(np.uint8)
    # learnable: the brightness of a block says the class
    images = rng.integers(0, 40, (n_train + n_test, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, (c // 5) * 14 : (c // 5) * 14 + 14, (c % 5) * 5 : (c % 5) * 5 + 5] = 250
    sfx = ".gz" if compress else ""
    data.write_idx(d / f"train-images-idx3-ubyte{sfx}", images[:n_train], compress)
    data.write_idx(d / f"train-labels-idx1-ubyte{sfx}", labels[:n_train], compress)
    data.write_idx(d / f"t10k-images-idx3-ubyte{sfx}", images[n_train:], compress)
    data.write_idx(d / f"t10k-labels-idx1-ubyte{sfx}", labels[n_train:], compress)


@pytest.mark.parametrize("compress", [False, True])
def test_loader_reads_what_was_written(tmp_path, compress: bool) -> None:
    _write_dataset(tmp_path, compress=compress)
    ds = data.load(tmp_path)
    assert ds.train_images.shape == (64, 28, 28) and ds.train_labels.shape == (64,)
    assert ds.test_images.shape == (32, 28, 28) and ds.test_images.dtype == np.uint8
    assert ds.train_labels.max() <= 9


def _corrupt(path, raw: bytes) -> None:
    path.write_bytes(raw)


@pytest.mark.parametrize(
    "name,mangle,message",
    [
        ("train-images-idx3-ubyte", lambda b: b"\x00\x00\x0d\x03" + b[4:], "magic number"),
        ("train-images-idx3-ubyte", lambda b: b[:4] + b"\x00", "header truncated"),
        ("train-images-idx3-ubyte", lambda b: b[:-100], "needs 50176 data bytes, found"),
        ("train-labels-idx1-ubyte", lambda b: b[:2], "too short"),
        ("t10k-labels-idx1-ubyte", lambda b: b[:-1], "data bytes"),
        ("t10k-labels-idx1-ubyte", lambda b: b[:-1] + b"\x0c", "labels go up to 12"),
        ("train-labels-idx1-ubyte", lambda b: b[:7] + b"\x3f" + b[8:-1], "63 labels"),
        ("train-images-idx3-ubyte", lambda b: gzip.compress(b)[:50], "corrupt gzip"),
    ],
)
def test_loader_names_what_is_wrong(tmp_path, name: str, mangle, message: str) -> None:
    _write_dataset(tmp_path)
    path = tmp_path / name
    _corrupt(path, mangle(path.read_bytes()))
    with pytest.raises(data.DatasetError, match=message):
        data.load(tmp_path)


def test_loader_missing_files_and_directory(tmp_path) -> None:
    with pytest.raises(data.DatasetError, match="no dataset directory"):
        data.load(tmp_path / "nope")
    _write_dataset(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(data.DatasetError, match="no t10k-images-idx3-ubyte"):
        data.load(tmp_path)


def test_shards_partition_the_examples() -> None:
    for n, k in [(60000, 2), (10, 3), (7, 4)]:
        idx = np.concatenate([np.arange(n)[data.shard(n, i, k)] for i in range(k)])
        assert idx.tolist() == list(range(n))


def test_models_have_the_advertised_sizes() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import models
    finally:
        sys.path.remove(str(EXAMPLE))
    assert models.parameter_count(models.small()) == 93_322
    large = models.parameter_count(models.large())
    assert 7_400_000 < large < 7_600_000  # about 30 MB of float32


def _train(
    tmp_path, name: str, launch: list[str], *args: str
) -> tuple[dict, np.ndarray, subprocess.CompletedProcess[str]]:
    """One train.py run on the synthetic data in tmp_path/data; its report, parameters and
    the finished process (its output)."""
    metrics, params = tmp_path / f"{name}.json", tmp_path / f"{name}.npy"
    train = [str(EXAMPLE / "train.py"), "--data-dir", str(tmp_path / "data"), "--no-progress",
             "--metrics", str(metrics), "--save-params", str(params), "--eval-points", "3",
             *args]  # fmt: skip
    py = sys.executable
    cmd = [py, *train] if not launch else [py, "-m", "pycollective", "run", *launch, py, *train]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYCOLLECTIVE_TRANSPORT"] = "tcp"
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(metrics.read_text()), np.load(params), res


@pytest.fixture
def synthetic(tmp_path):
    (tmp_path / "data").mkdir()
    _write_dataset(tmp_path / "data", n_train=512, n_test=128)
    return tmp_path


@pytest.mark.timeout(240)  # two runs of up to 110 s each (one restarted), in a row
def test_modes_compute_the_same_updates(synthetic) -> None:
    """Same samples, same order: one process with batch 32, and 2 workers (DDP on the
    pycollective backend) accumulating 2 micro-batches of 8 each per all-reduce, end with
    the same parameters. (That accumulating halves the bytes per sample, against 2 workers
    without it, is checked on the demo's own runs in test_demo.py.)

    The one process is killed in update 7 and restarted by `pycollective run
    --max-restarts 1`: it resumes from its checkpoint of update 6, and still ends where the
    workers do (one job shows both, instead of a separate restart job: a torch start less)."""
    ck = synthetic / "ck.pt"
    single, p1, res = _train(synthetic, "single", ["-n", "1", "--max-restarts", "1"],
                             "--mode", "single", "--samples", "256", "--batch", "32",
                             "--checkpoint", str(ck), "--checkpoint-every", "2",
                             "--kill-at", "7", "--kill-rank", "0")  # fmt: skip
    assert "rank 0 was killed by SIGKILL" in res.stderr
    assert "restarting every rank (restart 1 of 1)" in res.stderr
    assert "[rank 0]: resumed from" in res.stdout and "at update 6 (restart 1)" in res.stdout
    assert "single x1 (accumulate 1): test accuracy" in res.stdout
    acc, p2, _ = _train(synthetic, "acc", ["-n", "2"], "--mode", "allreduce",
                        "--samples", "256", "--batch", "32", "--accumulate", "2")  # fmt: skip
    assert single["steps"] == acc["steps"] == 8 and acc["micro_batch"] == 8
    # 8 Adam updates: float rounding (the all-reduce sums in another order) stays ~1e-7; over
    # many updates Adam's m / sqrt(v) turns it into up to lr where a gradient is near 0
    np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-5)
    assert single["test_accuracy"] > 0.3  # learning (10 classes: 0.1 by chance)
    assert abs(acc["test_accuracy"] - single["test_accuracy"]) <= 1 / 128  # one image at most
    assert ck.exists()
    assert single["bytes_sent_per_step"] == 0
    # one all-reduce per update whatever k: the ring sends 2 (p-1)/p = 1 gradient per worker
    n = 4 * acc["parameters"]
    assert n <= acc["bytes_sent_per_step"] < 1.05 * n
    # the curve: 0, then 3 evenly spaced points ending with the last update, none twice
    assert [p["samples"] for p in single["curve"]] == [0, 96, 160, 256]
    assert single["probe_accuracy"] == single["curve"][-1]["acc"]


@pytest.mark.timeout(120)
def test_parameter_server_end_to_end(synthetic) -> None:
    report, _, _ = _train(synthetic, "ps", ["-n", "2", "--servers", "1"], "--mode", "ps",
                          "--samples", "2048", "--batch", "32")  # fmt: skip
    assert report["steps"] == 64 and report["workers"] == 2 and report["servers"] == 1
    assert report["test_accuracy"] > 0.5
    # each worker pushes its whole gradient to the one server and pulls it back, every step
    assert report["bytes_sent_per_step"] >= 4 * report["parameters"]


def test_eval_steps_are_evenly_spaced_and_unique() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import train
    finally:
        sys.path.remove(str(EXAMPLE))
    assert sorted(train.eval_steps(32, 3)) == [0, 11, 21, 32]
    assert sorted(train.eval_steps(5, 10)) == [0, 1, 2, 3, 4, 5]
    assert sorted(train.eval_steps(100, 1)) == [0, 100]
