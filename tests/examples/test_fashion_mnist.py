"""examples/fashion_mnist: the IDX loader on small files the tests write (and corrupt), and
train.py end to end on a tiny synthetic dataset in every mode."""

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


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "mode,launch",
    # (the all-reduce path runs in `make demo`; DDP itself is tested in tests/torch)
    [("single", []), ("ps", ["-n", "2", "--servers", "1"])],
)
def test_train_end_to_end_on_synthetic_data(tmp_path, mode: str, launch: list[str]) -> None:
    (tmp_path / "data").mkdir()
    _write_dataset(tmp_path / "data", n_train=512, n_test=128)
    metrics = tmp_path / "m.json"
    train = [str(EXAMPLE / "train.py"), "--mode", mode, "--data-dir", str(tmp_path / "data"),
             "--epochs", "4", "--batch", "32", "--metrics", str(metrics),
             "--checkpoint", str(tmp_path / "ck.pt"), "--no-progress"]  # fmt: skip
    py = sys.executable
    cmd = [py, *train] if not launch else [py, "-m", "pycollective", "run", *launch, py, *train]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYCOLLECTIVE_TRANSPORT"] = "tcp"
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(metrics.read_text())
    assert report["steps"] == 64 and report["workers"] == (1 if mode == "single" else 2)
    assert report["test_accuracy"] > 0.5  # the synthetic classes are easy to learn
    if mode == "single":
        assert report["bytes_sent_per_step"] == 0
    else:
        # the gradient (ring: 2(p-1)/p of it; ps: all of it, once) crosses the wire every step
        assert report["bytes_sent_per_step"] >= 4 * report["parameters"]
    assert (tmp_path / "ck.pt").exists()
